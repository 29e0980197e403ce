"""``hermes worker``: a Worker on a broker URL with handlers from ``module:object``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from hermes.core._cli import _run
from hermes.core._cli._common import (
    FAILED_URL_ENV,
    URL_HELP,
    CliError,
    add_verbosity,
    env_default,
    queue_option,
    seconds,
    whole_number,
)
from hermes.core._cli._jobs import RESULTS_URL_ENV, add_results_url
from hermes.core._cli._limits import add_limit_options
from hermes.core._cli._workers import add_heartbeat_options
from hermes.core.spi._driver import DEFAULT_PRIORITY

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands


def add_parser(commands: Commands) -> None:
    """``hermes worker``: its options."""
    worker = commands.add_parser(
        "worker",
        help="handle messages until stopped",
        description="Run a Dispatcher: handle messages from the broker until Ctrl-C, SIGTERM, "
        "--max-items or a shutdown request (hermes shutdown --file F with --shutdown-file F; "
        "on redis:// also hermes shutdown --url, through the key hermes_shutdown, as PHP "
        "Hermes); then print the counts.",
    )
    worker.add_argument("--url", help=URL_HELP)
    worker.add_argument(
        "--handlers",
        required=True,
        metavar="MODULE:OBJECT",
        help="what to run, imported from MODULE (the current directory is importable). "
        "OBJECT is one of: a hermes.core.HandlerRegistry (functions decorated with "
        "@registry.handler('TYPE')); a dict {'TYPE': handler or [handlers]}, where a handler "
        "is a function taking the message, an object with handle(message), or a class "
        "(created once, without arguments); or a function taking the Dispatcher, called once "
        "to register handlers (dispatcher.register_handler('TYPE', handler))",
    )
    _add_queue_options(worker)
    worker.add_argument(
        "--max-items", type=whole_number(0), default=0, metavar="N", help="stop after N messages"
    )
    _add_run_options(worker)
    worker.add_argument(
        "--max-deliveries",
        type=whole_number(0),
        default=env_default("HERMES_MAX_DELIVERIES", whole_number(0), 0),
        metavar="N",
        help="set aside, without running its handler, a message the broker has delivered "
        "more than N times: its handler never finished (it crashed or killed the worker "
        "each time); into --failed-url if given, else the broker's own set-aside "
        "(quarantine, dead-letter, rejected list; on SQS without a redrive policy: deleted). "
        "Needs a driver that counts deliveries (see its README). 0: no limit (default: "
        "$HERMES_MAX_DELIVERIES, else 0)",
    )
    worker.add_argument(
        "--metrics-port",
        type=whole_number(1, 65535),
        default=env_default("HERMES_METRICS_PORT", whole_number(1, 65535), None),
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (needs "
        "hermes-prometheus; default: $HERMES_METRICS_PORT, else none)",
    )
    worker.add_argument(
        "--metrics-host",
        default=os.environ.get("HERMES_METRICS_HOST") or "127.0.0.1",
        metavar="HOST",
        help="the address the metrics listen on: 127.0.0.1 unless you name another, e.g. "
        "0.0.0.0 for a Prometheus on another host (the metrics have no authentication: "
        "expose them only to your monitoring network; default: $HERMES_METRICS_HOST, "
        "else 127.0.0.1)",
    )
    worker.add_argument(
        "--shutdown-file",
        metavar="F",
        help="stop when F is touched after the worker started (hermes shutdown --file F)",
    )
    worker.add_argument(
        "--failed-url",
        metavar="URL",
        help="keep the messages the worker gives up on (a handler returned False or is not "
        "retried, or no handler) on this broker URL, another queue than --url, e.g. "
        "redis://localhost:6379/0?prefix=failed: ; read them with hermes failed "
        f"(default: ${FAILED_URL_ENV}; unset: they are dropped after their log line)",
    )
    add_results_url(
        worker,
        "keep a record of every job in this store: its state, attempts, error and result "
        "(hermes job ID reads it; cancelled and expired jobs are skipped); a URL whose driver "
        f"can keep records: memory://, file://, redis://, postgresql:// (default: "
        f"${RESULTS_URL_ENV}; unset: no records)",
    )
    add_limit_options(worker)
    add_verbosity(
        worker,
        more="-v a line as each message starts and ends, and debug lines; -vv also full tracebacks",
    )
    add_heartbeat_options(worker)
    _add_pool_options(worker)
    _add_scheduler_options(worker)
    worker.set_defaults(run=run)


def _add_scheduler_options(worker: argparse.ArgumentParser) -> None:
    """``hermes worker --scheduler [MODULE:OBJECT] [--lock-url URL]``.

    Here rather than in the scheduler's module, which a worker without
    ``--scheduler`` does not import.
    """
    worker.add_argument(
        "--scheduler",
        nargs="?",
        const=True,
        default=None,
        metavar="MODULE:OBJECT",
        help="also run the periodic entries in a thread of this worker: those of the --handlers "
        "registry, or of the Schedule or registry named here (any number of workers may run "
        "it: each tick is emitted once)",
    )
    worker.add_argument(
        "--lock-url",
        metavar="URL",
        help="with --scheduler: claim ticks on this broker when --url cannot (amqp://, sqs://, "
        "kafka://)",
    )


def _add_run_options(worker: argparse.ArgumentParser) -> None:
    worker.add_argument(
        "--concurrency",
        type=whole_number(1),
        default=env_default("HERMES_CONCURRENCY", whole_number(1), 1),
        metavar="N",
        help="run up to N messages at once: a thread each for sync handlers, async def "
        "ones as coroutines on the worker's event loop with no thread each; each message is "
        "acknowledged after its own handlers (default: $HERMES_CONCURRENCY, else 1)",
    )
    worker.add_argument(
        "--time-limit",
        type=seconds,
        default=env_default("HERMES_TIME_LIMIT", seconds, None),
        metavar="SECONDS",
        help="interrupt a handler that runs longer (a failure, retried by the usual rule); "
        "a handler's own time_limit_s attribute overrides it (default: $HERMES_TIME_LIMIT, "
        "else no limit)",
    )
    worker.add_argument(
        "--grace",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="on Ctrl-C, SIGTERM or a shutdown request, how long handlers in flight may "
        "finish before the worker exits without acknowledging them (default 30)",
    )


def _add_pool_options(worker: argparse.ArgumentParser) -> None:
    pool = worker.add_argument_group(
        "worker processes",
        "With --processes above 1, or any option below, a supervisor process starts the "
        "workers as child processes, replaces one that dies, and stops them all on SIGTERM "
        "or Ctrl-C; SIGHUP replaces them one after another (new code, no job dropped).",
    )
    pool.add_argument(
        "--processes",
        type=whole_number(1),
        default=env_default("HERMES_PROCESSES", whole_number(1), 1),
        metavar="N",
        help="run N worker processes, each with --concurrency handlers: more processes for "
        "CPU-bound jobs, more concurrency for I/O-bound ones (default: $HERMES_PROCESSES, "
        "else 1, a single process without a supervisor)",
    )
    pool.add_argument(
        "--max-jobs-per-child",
        type=whole_number(1),
        default=0,
        metavar="N",
        help="replace a worker process after it took N messages (it finishes them first)",
    )
    pool.add_argument(
        "--max-memory-per-child",
        type=whole_number(1),
        default=0,
        metavar="MB",
        help="replace a worker process once its resident memory passes MB MiB, checked "
        "between messages (it finishes those in flight first)",
    )
    pool.add_argument(
        "--reload",
        action="store_true",
        help="for development: restart the worker processes when a .py file changes in the "
        "handlers module's package (or the current directory); needs hermes-core[reload]",
    )
    pool.add_argument(
        "--reload-dir",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="with --reload: watch DIR instead of the handlers module's package (repeat for "
        "several), e.g. a project whose code the handlers import from elsewhere",
    )


def _add_queue_options(worker: argparse.ArgumentParser) -> None:
    worker.add_argument(
        "--priority",
        type=int,
        action="append",
        default=[],
        metavar="P",
        help="read only the queues of the priorities given (repeat for several). Without "
        f"it the worker reads every queue it knows: priority {DEFAULT_PRIORITY}, where retry "
        "copies (and on Redis due delayed messages) land, the URL's priority_queues, the "
        "--queue queues and those the handlers function sets up",
    )
    worker.add_argument(
        "--queue",
        type=queue_option,
        action="append",
        default=[],
        metavar="NAME:P",
        help="also read the queue NAME, which holds priority P, e.g. --queue hermes_high:200 "
        "for a PHP deployment's queue (repeat for several); the worker still reads priority "
        f"{DEFAULT_PRIORITY} and its other queues unless --priority restricts it (without "
        "--queue, priority P is in <key>_priority_<P>)",
    )


def _pool_wanted(args: argparse.Namespace) -> bool:
    """Whether this ``hermes worker`` runs a supervisor (else: one process, as ever)."""
    return bool(
        args.processes > 1 or args.max_jobs_per_child or args.max_memory_per_child or args.reload
    )


def run(args: argparse.Namespace) -> int:
    """``hermes worker``: one worker process, or a pool of them that a supervisor runs."""
    if args.reload_dir and not args.reload:
        raise CliError("--reload-dir says what --reload watches: give --reload too")
    missing = [str(path) for path in args.reload_dir if not path.is_dir()]
    if missing:
        raise CliError(f"--reload-dir {missing[0]}: no such directory")
    if _pool_wanted(args):
        from hermes.core._cli import _pool  # a supervisor's imports: not for one process

        return _pool.run(args)
    return _run.run(args)
