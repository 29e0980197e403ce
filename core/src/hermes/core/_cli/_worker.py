"""``hermes worker``: a Worker on a broker URL with handlers from ``module:object``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import importlib
import inspect
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from hermes.core._cli._common import (
    FAILED_URL_ENV,
    URL_HELP,
    CliError,
    add_verbosity,
    configure_logging,
    default_url,
    env_default,
    named_queues,
    one_line,
    queue_of,
    queue_option,
    raise_site,
    seconds,
    setup_priorities,
    whole_number,
)
from hermes.core._cli._workers import add_heartbeat_options, publisher_for, registry
from hermes.core._dispatcher import Dispatcher, DispatcherStats
from hermes.core._driver import DEFAULT_PRIORITY, Driver
from hermes.core._errors import ConfigurationError
from hermes.core._handler import Handler, HandlerRegistry, as_handler, handler_name
from hermes.core._message import Message
from hermes.core._registry import connect, driver_for_url, plugin_manager
from hermes.core._shutdown import SharedFileShutdown, Shutdown
from hermes.core._url import redact_url
from hermes.core._worker import NOTICE, Worker

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands
    from hermes.core._failed import FailedStore
    from hermes.core._pool import ChildLink

logger = logging.getLogger("hermes")


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
        help="run up to N handlers at once on threads (async handlers on the worker's event "
        "loop); each message is acknowledged after its own handlers (default: "
        "$HERMES_CONCURRENCY, else 1)",
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


def load_object(spec: str) -> object:
    """Import ``module:attr.path`` from the current directory or ``sys.path``.

    Every way it can go wrong is a :class:`CliError` that names the module and why.
    """
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise CliError(
            f"--handlers {spec!r} must be module:object, e.g. myapp.jobs:handlers "
            "(a HandlerRegistry, a dict of type -> handler, or a function that registers handlers)"
        )
    if "/" in module_name or "\\" in module_name or module_name.endswith(".py"):
        raise CliError(_file_path_hint(spec, module_name, attr_path))
    # Like `python -m`: modules in the current directory are importable.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise CliError(
                f"cannot import handlers module {module_name!r}: no module named {missing!r} "
                f"in the current directory ({cwd}) or on sys.path"
            ) from None
        raise CliError(
            f"cannot import handlers module {module_name!r}: it imports {missing!r}, "
            "which is not installed"
        ) from None
    except SyntaxError as exc:
        where = f"{os.path.basename(exc.filename or '?')}:{exc.lineno}"
        raise CliError(
            f"cannot import handlers module {module_name!r}: SyntaxError at {where}: {exc.msg}"
        ) from None
    except Exception as exc:
        raise CliError(
            f"cannot import handlers module {module_name!r}: it raised "
            f"{type(exc).__name__}: {exc} ({raise_site(exc) or 'no traceback'})"
        ) from None
    obj: object = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(
                f"handlers module {module_name!r} ({_module_file(module)}) has no "
                f"attribute {attr_path!r}"
            ) from None
    return obj


def _file_path_hint(spec: str, path: str, attr_path: str) -> str:
    """What to give instead of a file path: the module, and where to run the worker."""
    from pathlib import Path

    file = Path(path.removesuffix(".py"))
    if file.is_absolute():
        module, where = file.name, f"{file.name}.py ({file.parent})"
    else:
        parts = [part for part in file.parts if part not in (".", "")]
        module = ".".join(parts) or path
        where = f"{parts[0]}/" if len(parts) > 1 else f"{module}.py"
    return (
        f"--handlers {spec!r} names a file; give the module: --handlers {module}:{attr_path}, "
        f"run from the directory that holds {where}"
    )


def _module_file(module: object) -> str:
    return str(getattr(module, "__file__", None) or getattr(module, "__name__", "?"))


#: What to do with a handler function that was given to --handlers as if it registered handlers.
_FUNCTION_HINT = (
    "a function named by --handlers is called once with the Dispatcher to register "
    "handlers; to run a function for every message, name a dict {{'TYPE': {name}}} or a "
    "hermes.core.HandlerRegistry whose @registry.handler('TYPE') decorates it"
)


def register_handlers(dispatcher: Dispatcher, target: object, spec: str) -> None:
    """Register ``target`` on ``dispatcher``; every way it can be wrong is a :class:`CliError`.

    ``target`` is a :class:`HandlerRegistry`; a mapping type -> handler(s), where a
    handler is a function taking the message, an object with ``handle`` or a class
    (created once, without arguments); or a function taking the Dispatcher.
    """
    if isinstance(target, HandlerRegistry):
        target.register(dispatcher)
        return
    if isinstance(target, Mapping):
        for type_, value in target.items():
            if not isinstance(type_, str):
                raise CliError(f"--handlers {spec}: key {type_!r} is not a message type string")
            handlers = value if isinstance(value, list | tuple) else [value]
            for item in handlers:
                try:
                    handler = as_handler(_instance(item, type_, spec), type_)
                    dispatcher.register_handler(type_, handler)
                except ConfigurationError as exc:
                    raise CliError(f"--handlers {spec}: {exc}") from None
        return
    if isinstance(target, type) or callable(getattr(target, "handle", None)):
        name = getattr(target, "__name__", None) or type(target).__name__
        raise CliError(
            f"--handlers {spec} is a handler, not a registration: name a dict "
            f"{{'TYPE': {name}}}, a HandlerRegistry, or a function taking the Dispatcher "
            f"(dispatcher.register_handler('TYPE', {name}))"
        )
    if not callable(target):
        raise CliError(
            f"--handlers {spec} is a {type(target).__name__}: it must be a HandlerRegistry, a "
            "dict of type -> handler(s), or a function taking the Dispatcher"
        )
    name = getattr(target, "__name__", None) or spec
    parameter = _message_parameter(target)
    if parameter is not None:
        raise CliError(
            f"--handlers {spec} looks like a handler function (it takes {parameter!r}): "
            + _FUNCTION_HINT.format(name=name)
        )
    try:
        target(dispatcher)
    except Exception as exc:
        site = raise_site(exc) or "no traceback"
        raise CliError(
            f"--handlers {spec} raised {type(exc).__name__}: {exc} ({site}); if it is a "
            "handler rather than a registration: " + _FUNCTION_HINT.format(name=name)
        ) from None


def _message_parameter(function: Callable[..., object]) -> str | None:
    """The first parameter's name when it says "message" (by name or annotation), else None."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    if not parameters:
        return None
    first = parameters[0]
    annotation = first.annotation
    annotated = annotation is Message or (
        isinstance(annotation, str) and annotation.rpartition(".")[2] == "Message"
    )
    return first.name if annotated or first.name in ("message", "msg") else None


def _instance(handler: object, type_: str, spec: str) -> object:
    """``handler``, or an instance of it when it is a class."""
    if not isinstance(handler, type):
        return handler
    cls = handler
    try:
        return cls()
    except Exception as exc:
        raise CliError(
            f"--handlers {spec}: cannot create {cls.__name__}() for {type_!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from None


class _EarlyStop:
    """A signal received before the run starts, passed on to the Worker once it exists."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._worker: Worker | None = None

    def on_signal(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C does not wait for the start-up
        if self.reason is None:
            logger.log(NOTICE, "Received %s while starting; stopping before any message", name)
            self.reason = name
        if self._worker is not None:
            self._worker.stop(name)

    def stop(self, worker: Worker) -> None:
        """From now on a signal stops ``worker``; one received already stops it before it starts."""
        self._worker = worker
        if self.reason is not None:
            worker.stop(self.reason)


@contextlib.contextmanager
def _signals_while_starting(install: bool = True) -> Iterator[_EarlyStop]:
    """SIGTERM and SIGINT between the first log line and the run: a clean stop, not a kill.

    The run installs its own handlers for its length; these stand before and
    after it, and the ones found are restored on the way out. With ``install``
    False (or off the main thread) the handlers found are left as they are.
    """
    early = _EarlyStop()
    if not install or threading.current_thread() is not threading.main_thread():
        yield early
        return
    handled = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, early.on_signal) for sig in handled}
    try:
        yield early
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(args: argparse.Namespace, child: ChildLink | None = None) -> int:
    """``hermes worker``; in a worker pool, what each child process runs (``child``)."""
    if child is None and _pool_wanted(args):
        from hermes.core._cli import _pool  # a supervisor's imports: not for one process

        return _pool.run(args)
    url: str = args.url or default_url()
    failed_url: str | None = args.failed_url or os.environ.get(FAILED_URL_ENV) or None
    spec: str = args.handlers
    target = load_object(spec)
    verbosity = args.verbose - args.quiet
    configure_logging(verbosity, prefix=child.log_prefix if child is not None else "")
    if child is not None:
        logging.getLogger().addHandler(child.error_log_handler())
    from_cli, from_url = named_queues(url, args.queue)
    # --queue adds a queue; only --priority restricts the worker (an empty list: every queue).
    priorities: list[int] = sorted(set(args.priority), reverse=True)

    with contextlib.ExitStack() as stack:
        driver = stack.enter_context(connect(url))
        store = _failed_store(stack, failed_url, driver)
        setup_priorities(driver, [*priorities, *from_cli], from_cli, preset=from_url)
        shutdowns = _shutdowns(args, url, driver)
        if child is not None:
            shutdowns = child.since_pool_start(shutdowns)
        dispatcher = _dispatcher(args, driver, store, log_each_message=verbosity > 0)
        register_handlers(dispatcher, target, spec)
        if args.metrics_port is not None and child is None:  # a pool's supervisor serves them
            _serve_metrics(args.metrics_port, url, args.metrics_host)
        registered = _registered(dispatcher, target, spec)
        names = {**from_url, **from_cli}
        # The first line promises a stop on SIGTERM: it holds from here, not from worker.run().
        # (A pool's child keeps the default: its supervisor expects it gone at once.)
        early = stack.enter_context(_signals_while_starting(child is None))
        _log_start(args, url, driver, registered, priorities, names, shutdowns, failed_url)
        beats = stack.enter_context(registry(driver, args.registry_url))
        heartbeat = publisher_for(
            args,
            beats,
            url,
            "worker",
            supervisor_pid=child.supervisor_pid if child is not None else None,
            slot=child.slot if child is not None else None,
        )
        worker = Worker(
            driver,
            dispatcher,
            priorities=priorities,
            max_items=child.config.max_jobs_per_child if child is not None else args.max_items,
            shutdown=shutdowns,
            stop_when=child.stop_when(lambda: worker.stats) if child is not None else None,
            heartbeat=heartbeat,
        )
        early.stop(worker)
        scheduler = None
        if args.scheduler:
            # Imported here: _scheduler imports this module for load_object, and a
            # worker without --scheduler does without it.
            from hermes.core._cli import _scheduler

            scheduler = _scheduler.start_in_worker(args, target, driver, url)
            _scheduler.beat_for(stack, args, beats, url, scheduler)
        started = time.monotonic()
        if child is not None:
            child.ready()
            reporter = child.report_while_running(lambda: _counts(worker), worker.stop)
        try:
            worker.run()
        finally:
            if scheduler is not None:
                scheduler.stop()
            if child is None:
                print(_summary(dispatcher, time.monotonic() - started), flush=True)
            else:
                reporter.set()
                child.finished(worker.stats, _counts(worker))
    return 0


def _dispatcher(
    args: argparse.Namespace, driver: Driver, store: FailedStore | None, log_each_message: bool
) -> Dispatcher:
    """The worker's Dispatcher, as the command line sets it up (handlers not yet registered)."""
    dispatcher = Dispatcher(
        driver,
        logger,
        concurrency=args.concurrency,
        time_limit_s=args.time_limit,
        grace_s=args.grace,
        failed=store,
        max_deliveries=args.max_deliveries,
    )
    dispatcher.log_each_message = log_each_message
    return dispatcher


def _pool_wanted(args: argparse.Namespace) -> bool:
    """Whether this ``hermes worker`` runs a supervisor (else: one process, as ever)."""
    return bool(
        args.processes > 1 or args.max_jobs_per_child or args.max_memory_per_child or args.reload
    )


def _failed_store(
    stack: contextlib.ExitStack, failed_url: str | None, driver: Driver
) -> FailedStore | None:
    """The failed-message store ``--failed-url`` names; the worker's own queue is a mistake."""
    if not failed_url:
        return None
    from hermes.core._failed import FailedStore

    store = stack.enter_context(FailedStore.connect(failed_url))
    if repr(store.driver) == repr(driver):
        raise CliError(
            f"--failed-url is the worker's own queue ({driver!r}): messages given up on "
            "would come straight back; give the store its own queue, e.g. "
            "redis://HOST:6379/0?prefix=failed: or another file:// directory"
        )
    return store


def _shutdowns(args: argparse.Namespace, url: str, driver: Driver) -> list[Shutdown]:
    """What stops this worker besides signals: a shared file, the broker's key."""
    shutdowns: list[Shutdown] = []
    if args.shutdown_file:
        shutdowns.append(SharedFileShutdown(args.shutdown_file))
    broker_shutdown = driver_for_url(url)[0].shutdown
    if broker_shutdown is not None:  # e.g. Redis: the key hermes shutdown --url sets
        shutdowns.append(broker_shutdown(driver))
    return shutdowns


def _registered(dispatcher: Dispatcher, target: object, spec: str) -> dict[str, list[Handler]]:
    """The handlers ``--handlers`` registered; none is a mistake that says what to give."""
    registered = dispatcher.registered()
    if not registered:
        name = getattr(target, "__name__", None) or spec
        hint = _FUNCTION_HINT.format(name=name) if callable(target) else ""
        raise CliError(f"--handlers {spec} registered no handlers" + (f"; {hint}" if hint else ""))
    return registered


def _counts(worker: Worker) -> dict[str, int]:
    """A child's counts for the pool's summary: the Dispatcher's and the Worker's."""
    counts = {"started": worker.stats.started, "processed": worker.stats.processed}
    if worker.dispatcher is not None:
        counts.update(dataclasses.asdict(worker.dispatcher.stats))
    return counts


def _serve_metrics(port: int, url: str, host: str) -> None:
    try:
        served = plugin_manager().hook.hermes_worker_metrics(port=port, url=url, host=host)
    except OSError as exc:
        # Most often a second worker on the same port: separate workers need a port
        # each, a pool (--processes N) serves one for all of them.
        why = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
        raise CliError(
            f"--metrics-port {port}: cannot serve metrics there: {why}; give another port "
            "(each hermes worker needs its own; --processes N runs several on one)"
        ) from None
    if served is None:
        raise CliError("--metrics-port needs a metrics plugin: pip install hermes-prometheus")
    logger.info("Metrics on %s", served)


def _summary(dispatcher: Dispatcher | DispatcherStats, elapsed_s: float) -> str:
    stats = dispatcher.stats if isinstance(dispatcher, Dispatcher) else dispatcher
    text = (
        f"Worker stopped after {elapsed_s:.1f} s: received {stats.received}, "
        f"handled {stats.handled}, failed {stats.failed}, retried {stats.retried}, "
        f"gave up {stats.gave_up}"
    )
    if stats.stored or (isinstance(dispatcher, Dispatcher) and dispatcher.failed is not None):
        text += f" ({stats.stored} kept in the failed-message store)"
    return text


def _log_start(
    args: argparse.Namespace,
    url: str,
    driver: Driver,
    registered: Mapping[str, list[Handler]],
    priorities: list[int],
    names: Mapping[int, str],
    shutdowns: list[Shutdown],
    failed_url: str | None,
) -> None:
    """The worker's first lines: where, what, which queues, when it stops."""
    max_items: int = args.max_items
    concurrency: int = args.concurrency
    max_deliveries: int = args.max_deliveries
    caps = driver.capabilities
    logger.info(
        "Worker on %s (%s: %s, delay %s%s)",
        redact_url(url),
        type(driver).__name__,
        caps.delivery.value,
        caps.delay.value,
        ", priorities" if caps.priorities else "",
    )
    handlers = "; ".join(
        f"{t} -> {', '.join(handler_name(h) for h in hs)}" for t, hs in registered.items()
    )
    logger.info("Handlers: %s", handlers)

    def named(priority: int) -> str:
        # The broker's own name (Redis: the key, prefix included) makes a worker and an
        # emitter on different prefixes or keys visible at a glance.
        name = queue_of(driver, priority) or names.get(priority)
        return f"{priority} ({name})" if name else str(priority)

    read = priorities or sorted({DEFAULT_PRIORITY, *names}, reverse=True)
    plural = "priorities" if len(read) > 1 else "priority"
    reading = f"Reading {plural} {', '.join(map(named, read))}"
    if not priorities:
        reading += " and the queues the handlers set up (--priority P restricts the worker)"
    if concurrency > 1:
        reading += f"; {concurrency} handlers at once"
    stops = [f"after {max_items} message{'s' if max_items != 1 else ''}"] if max_items else []
    stops += ["on Ctrl-C", "SIGTERM", *map(repr, shutdowns)]
    logger.info(one_line(f"{reading}; stopping {', '.join(stops)}"))
    if priorities and DEFAULT_PRIORITY not in priorities:
        logger.warning(
            "This worker does not read priority %s, where retry copies land (and on Redis "
            "due delayed messages): another worker must, or they wait there",
            named(DEFAULT_PRIORITY),
        )
    if failed_url:
        shown = redact_url(failed_url)
        logger.info("Messages given up on go to %s (hermes failed --url %s list)", shown, shown)
    else:
        logger.info(
            "Messages given up on are dropped after their log line; --failed-url keeps them"
        )
    if max_deliveries:
        logger.info(
            "Messages delivered more than %d times are set aside without a handler call "
            "(--max-deliveries)",
            max_deliveries,
        )
