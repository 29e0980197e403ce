"""The ``hermes`` command: ``worker``, ``emit``, ``failed``, ``drivers``, ``shutdown``, ``demo``.

Results (emitted ids, counts, tables) go to stdout; log lines and errors to
stderr. Exit codes: 0 done; 2 a mistake the user can fix (bad URL, unknown
scheme, unreachable broker, bad JSON, handlers that do not import), shown as
one line on stderr without a traceback (``-vv`` adds it); 130 interrupted.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import TypeVar

from hermes.core._cli import _demo, _drivers, _emit, _failed, _scheduler, _shutdown, _stats, _worker
from hermes.core._cli._common import (
    URL_ENV,
    CliError,
    describe_error,
    print_error,
    print_traceback,
    queue_option,
)
from hermes.core._driver import DEFAULT_PRIORITY
from hermes.core._errors import HermesError

T = TypeVar("T")

__all__ = ["build_parser", "main"]

_URL_HELP = (
    f"broker URL, e.g. redis://localhost:6379/0 (default: ${URL_ENV}, "
    "else file://./hermes-queue, a queue directory here, which needs hermes-filesystem)"
)


def _version() -> str:
    try:
        return metadata.version("hermes-core")
    except metadata.PackageNotFoundError:
        return "unknown"


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    return parse


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be > 0 seconds")
    return value


def _env_default(name: str, parse: Callable[[str], T], fallback: T) -> T:
    """``$name`` parsed as an option would be, else ``fallback``; a bad value is a usage error."""
    text = os.environ.get(name)
    if text is None or text == "":
        return fallback
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"hermes: error: ${name}: {exc}") from None


def _verbosity(
    parser: argparse.ArgumentParser,
    default: object = 0,
    more: str = "-v debug lines, -vv also full tracebacks",
) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-v", "--verbose", action="count", default=default, help=f"more detail: {more}"
    )
    group.add_argument(
        "-q", "--quiet", action="count", default=default, help="only warnings and errors"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hermes",
        description="Hermes background jobs: run workers, emit messages, list drivers.",
        epilog="Start with `hermes demo`: the whole story on a temporary queue, no server.",
    )
    parser.add_argument("--version", action="version", version=f"hermes-core {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    worker = commands.add_parser(
        "worker",
        help="handle messages until stopped",
        description="Run a Dispatcher: handle messages from the broker until Ctrl-C, SIGTERM, "
        "--max-items or a shutdown request (hermes shutdown --file F with --shutdown-file F; "
        "on redis:// also hermes shutdown --url, through the key hermes_shutdown, as PHP "
        "Hermes); then print the counts.",
    )
    worker.add_argument("--url", help=_URL_HELP)
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
    worker.add_argument(
        "--priority",
        type=int,
        action="append",
        default=[],
        metavar="P",
        help="read only the queue of this priority (repeat for several); default: priority "
        f"{DEFAULT_PRIORITY}, the URL's priority_queues and the queues the handlers function "
        "sets up",
    )
    worker.add_argument(
        "--queue",
        type=queue_option,
        action="append",
        default=[],
        metavar="NAME:P",
        help="like --priority P, reading the queue NAME, e.g. --queue hermes_high:200 for a PHP "
        "deployment's queue (repeat for several; without it priority P is in <key>_priority_<P>)",
    )
    worker.add_argument(
        "--max-items", type=_count(0), default=0, metavar="N", help="stop after N messages"
    )
    worker.add_argument(
        "--concurrency",
        type=_count(1),
        default=_env_default("HERMES_CONCURRENCY", _count(1), 1),
        metavar="N",
        help="run up to N handlers at once on threads (async handlers on the worker's event "
        "loop); each message is acknowledged after its own handlers (default: "
        "$HERMES_CONCURRENCY, else 1)",
    )
    worker.add_argument(
        "--time-limit",
        type=_seconds,
        default=_env_default("HERMES_TIME_LIMIT", _seconds, None),
        metavar="SECONDS",
        help="interrupt a handler that runs longer (a failure, retried by the usual rule); "
        "a handler's own time_limit_s attribute overrides it (default: $HERMES_TIME_LIMIT, "
        "else no limit)",
    )
    worker.add_argument(
        "--grace",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="on Ctrl-C, SIGTERM or a shutdown request, how long handlers in flight may "
        "finish before the worker exits without acknowledging them (default 30)",
    )
    worker.add_argument(
        "--metrics-port",
        type=_count(1),
        default=_env_default("HERMES_METRICS_PORT", _count(1), None),
        metavar="PORT",
        help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics (needs "
        "hermes-prometheus; default: $HERMES_METRICS_PORT, else none)",
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
        f"(default: ${_failed.FAILED_URL_ENV}; unset: they are dropped after their log line)",
    )
    _verbosity(
        worker,
        more="-v a line as each message starts and ends, and debug lines; -vv also full tracebacks",
    )
    worker.set_defaults(run=_worker.run)
    _scheduler.add_worker_options(worker)

    emit = commands.add_parser(
        "emit",
        help="put a message on the broker",
        description="Emit a message of TYPE with a JSON payload.",
    )
    emit.add_argument("--url", help=_URL_HELP)
    emit.add_argument("type", metavar="TYPE", help="the message type handlers are registered for")
    emit.add_argument(
        "payload",
        metavar="PAYLOAD_JSON",
        nargs="?",
        help="the payload as JSON, or - to read it from stdin (default: null)",
    )
    where = emit.add_mutually_exclusive_group()
    where.add_argument(
        "--priority",
        type=int,
        default=DEFAULT_PRIORITY,
        metavar="P",
        help=f"priority queue, higher first (default {DEFAULT_PRIORITY}); the queue of a "
        "priority other than the default is <key>_priority_<P> unless the URL's "
        "priority_queues names it",
    )
    where.add_argument(
        "--queue",
        type=queue_option,
        metavar="NAME:P",
        help="like --priority P, sending to the queue NAME, e.g. --queue hermes_high:200 for a "
        "PHP deployment's queue",
    )
    when = emit.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, metavar="SECONDS", help="not before SECONDS from now")
    when.add_argument(
        "--at",
        metavar="TIMESTAMP",
        help="not before this UNIX timestamp or ISO 8601 date-time",
    )
    emit.add_argument(
        "--count", type=_count(1), default=1, metavar="N", help="emit N messages; shows the rate"
    )
    emit.add_argument(
        "--unique-for",
        type=_seconds,
        metavar="SECONDS",
        help="a unique job: skip the emit when one with the same --unique-key (default: the "
        "message id) was emitted in the last SECONDS (needs redis://, file:// or memory://)",
    )
    emit.add_argument("--unique-key", metavar="KEY", help="with --unique-for: what makes it unique")
    _verbosity(emit)
    emit.set_defaults(run=_emit.run)

    failed = commands.add_parser(
        "failed",
        help="list, retry or purge the messages workers gave up on",
        description="Read the failed-message store workers keep with --failed-url: list what "
        "is in it, put messages back on a worker's queue with their retries reset, or delete "
        "them. Needs a store its driver can list without taking messages: file:// or redis://.",
    )
    failed_url_help = (
        f"the failed-message store, the workers' --failed-url (default: ${_failed.FAILED_URL_ENV})"
    )
    failed.add_argument("--url", help=failed_url_help)
    _verbosity(failed)
    actions = failed.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list", help="id, type, retries, when and why, oldest first", description="List the store."
    )
    retry = actions.add_parser(
        "retry",
        help="put messages back on a worker's queue, retries reset",
        description="Send the messages (all without IDs) to --to, due at once with retries 0 "
        "and their id, type and payload kept, then delete them from the store.",
    )
    retry.add_argument("ids", nargs="*", metavar="ID", help="ids from `hermes failed list`")
    retry.add_argument(
        "--to",
        metavar="URL",
        help=f"the workers' queue (default: ${URL_ENV}, else file://./hermes-queue)",
    )
    purge = actions.add_parser(
        "purge", help="delete messages from the store", description="Delete messages for good."
    )
    purge.add_argument("ids", nargs="*", metavar="ID", help="ids from `hermes failed list`")
    purge.add_argument("--all", action="store_true", help="delete every message in the store")
    for action in (listing, retry, purge):
        # `hermes failed list --url U -v` works as well as `hermes failed --url U -v list`.
        action.add_argument("--url", default=argparse.SUPPRESS, help=failed_url_help)
        _verbosity(action, default=argparse.SUPPRESS)
    failed.set_defaults(run=_failed.run)

    drivers = commands.add_parser(
        "drivers",
        help="list installed drivers and their capabilities",
        description="The installed drivers: distribution, URL schemes and what each promises.",
    )
    drivers.set_defaults(run=_drivers.run)

    plugins = commands.add_parser(
        "plugins",
        help="list installed plugins and the hooks they implement",
        description="Every Hermes plugin (entry-point group hermes): drivers and observers "
        "such as hermes-prometheus, with the hooks each implements.",
    )
    plugins.set_defaults(run=_drivers.run_plugins)

    shutdown = commands.add_parser(
        "shutdown",
        help="ask running workers to stop",
        description="Ask the workers started before now to stop after the message in progress.",
    )
    target = shutdown.add_mutually_exclusive_group()
    target.add_argument(
        "--url",
        help="a redis:// URL: the workers that watch its key hermes_shutdown stop: hermes "
        f"worker, and PHP and Python Dispatchers given RedisShutdown (default: ${URL_ENV})",
    )
    target.add_argument("--file", metavar="F", help="workers started with --shutdown-file F stop")
    shutdown.set_defaults(run=_shutdown.run)

    stats = commands.add_parser(
        "stats",
        help="count what each priority queue holds",
        description="Per priority queue: messages ready, scheduled (held until execute_at), "
        "in flight (taken, not acknowledged) and set aside (quarantined or dead-lettered). "
        "? marks a count the broker cannot give.",
    )
    stats.add_argument("--url", help=_URL_HELP)
    stats.add_argument(
        "--priority",
        type=int,
        action="append",
        default=[],
        metavar="P",
        help="also show the queue of this priority (repeat for several)",
    )
    stats.add_argument(
        "--watch",
        type=_seconds,
        metavar="SECONDS",
        help="refresh every SECONDS (in place on a terminal) until Ctrl-C",
    )
    stats.add_argument("--json", action="store_true", help="one JSON document per refresh")
    _verbosity(stats)
    stats.set_defaults(run=_stats.run_stats)

    purge = commands.add_parser(
        "purge",
        help="delete the messages waiting in the queues",
        description="Delete the messages waiting (ready and scheduled) in every priority "
        "queue, or in one; messages in flight and set aside stay. Asks first on a terminal.",
    )
    purge.add_argument("--url", help=_URL_HELP)
    purge.add_argument("--priority", type=int, metavar="P", help="only the queue of priority P")
    purge.add_argument("--yes", action="store_true", help="do not ask (needed off a terminal)")
    _verbosity(purge)
    purge.set_defaults(run=_stats.run_purge)

    demo = commands.add_parser(
        "demo",
        help="the whole story on a temporary queue, no server",
        description="Emit, priorities, a failing handler retried with backoff and a delayed "
        "message, on a temporary file:// queue (memory:// in this process when "
        "hermes-filesystem is not installed); finishes in seconds.",
    )
    demo.add_argument(
        "--url",
        help="run it on this broker instead (needs priorities and native delay; "
        "default: a temporary file:// queue, else memory://)",
    )
    demo.set_defaults(run=_demo.run)
    _scheduler.add_parser(commands, _URL_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hermes`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command != "worker":
        # `hermes drivers | head -1` ends quietly, like any Unix tool. A worker keeps
        # Python's default: a closed stdout must not kill it in the middle of a handler.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return int(args.run(args))
    except CliError as exc:
        print_error(str(exc), exc.context)
    except HermesError as exc:
        if getattr(args, "verbose", 0) > 1:
            print_traceback(exc)
        print_error(describe_error(exc))
    except KeyboardInterrupt:
        print("hermes: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
