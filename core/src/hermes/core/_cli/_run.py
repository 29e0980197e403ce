"""One worker process: ``hermes worker`` without a pool, and each child of a pool."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from hermes.core._cli._common import (
    FAILED_URL_ENV,
    CliError,
    configure_logging,
    default_url,
    named_queues,
    one_line,
    queue_of,
    setup_priorities,
)
from hermes.core._cli._jobs import open_jobs, results_url
from hermes.core._cli._limits import apply_limits, describe_limits
from hermes.core._cli._loading import FUNCTION_HINT, load_object, register_handlers
from hermes.core._cli._report import counts, serve_metrics, summary
from hermes.core._cli._workers import publisher_for, registry
from hermes.core.app._dispatcher import Dispatcher
from hermes.core.app._handler import Handler, handler_name
from hermes.core.app._jobs import Jobs
from hermes.core.model._message import Message
from hermes.core.run._worker import NOTICE, Worker
from hermes.core.spi._driver import DEFAULT_PRIORITY, Driver
from hermes.core.spi._registry import connect, driver_for_url, notify, plugin_manager
from hermes.core.spi._shutdown import SharedFileShutdown, Shutdown
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core.app._failed import FailedStore
    from hermes.core.run._pool import ChildLink


logger = logging.getLogger("hermes")


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
    """One worker process: ``hermes worker``, or a pool's child (``child``)."""
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
        records_url = results_url(args, required=False)
        records = open_jobs(records_url) if records_url is not None else None
        if records is not None:
            stack.callback(records.close)
        setup_priorities(driver, [*priorities, *from_cli], from_cli, preset=from_url)
        shutdowns = _shutdowns(args, url, driver)
        if child is not None:
            shutdowns = child.since_pool_start(shutdowns)
        dispatcher = _dispatcher(args, driver, store, records, log_each_message=verbosity > 0)
        register_handlers(dispatcher, target, spec)
        apply_limits(args, dispatcher)
        if args.metrics_port is not None and child is None:  # a pool's supervisor serves them
            serve_metrics(args.metrics_port, url, args.metrics_host)
        registered = _registered(dispatcher, target, spec)
        names = {**from_url, **from_cli}
        dispatcher.explain_unhandled = _UnhandledHint(
            spec, list(registered), priorities, from_cli, lambda p: _queue_label(driver, names, p)
        )
        # The first line promises a stop on SIGTERM: it holds from here, not from worker.run().
        # (A pool's child keeps the default: its supervisor expects it gone at once.)
        early = stack.enter_context(_signals_while_starting(child is None))
        _log_start(args, url, driver, registered, priorities, names, shutdowns, failed_url)
        limiter = dispatcher.limiter()
        for line in describe_limits(dispatcher):
            assert limiter is not None
            logger.info("Limit %s, fleet-wide in %r", line, limiter.driver)
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
            # Imported here: a worker without --scheduler does without the schedule.
            from hermes.core._cli import _scheduler

            scheduler = stack.enter_context(_scheduler.running_in_worker(args, target, driver, url))
            _scheduler.beat_for(stack, args, beats, url, scheduler)
        started = time.monotonic()
        if child is not None:
            # The Worker handles SIGTERM while it runs, then puts back the handler it
            # found. The default one would kill a child that the pool's stop reaches
            # as its run ends (at --max-jobs-per-child) before it reports its last
            # counts, and the pool's summary would miss them.
            signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop("SIGTERM"))
            child.ready()
            reporter = child.report_while_running(lambda: counts(worker), worker.stop)
        try:
            worker.run()
        finally:
            if scheduler is not None:
                scheduler.stop()
            if child is None:
                # A pool's child calls it as it leaves, after the run and anything that fails.
                notify(plugin_manager().hook.hermes_process_exiting)
                print(summary(dispatcher, time.monotonic() - started), flush=True)
            else:
                reporter.set()
                child.finished(worker.stats, counts(worker))
    return 0


def _dispatcher(
    args: argparse.Namespace,
    driver: Driver,
    store: FailedStore | None,
    records: Jobs | None,
    log_each_message: bool,
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
        records=records,
    )
    dispatcher.log_each_message = log_each_message
    return dispatcher


def _failed_store(
    stack: contextlib.ExitStack, failed_url: str | None, driver: Driver
) -> FailedStore | None:
    """The failed-message store ``--failed-url`` names; the worker's own queue is a mistake."""
    if not failed_url:
        return None
    from hermes.core.app._failed import FailedStore

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
        hint = FUNCTION_HINT.format(name=name) if callable(target) else ""
        raise CliError(f"--handlers {spec} registered no handlers" + (f"; {hint}" if hint else ""))
    return registered


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
        return _queue_label(driver, names, priority)

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
    records_url = results_url(args, required=False)
    if records_url:
        shown = redact_url(records_url)
        logger.info("Job records go to %s (hermes job --results-url %s ID)", shown, shown)
    if max_deliveries:
        logger.info(
            "Messages delivered more than %d times are set aside without a handler call "
            "(--max-deliveries)",
            max_deliveries,
        )


def _queue_label(driver: Driver, names: Mapping[int, str], priority: int) -> str:
    """``200 (hermes_high)``: a priority and its queue's name, when it has one."""
    # The broker's own name (Redis: the key, prefix included) makes a worker and an
    # emitter on different prefixes or keys visible at a glance.
    name = queue_of(driver, priority) or names.get(priority)
    return f"{priority} ({name})" if name else str(priority)


#: How many of its types the no-handler line names before "and N more".
_TYPES_SHOWN = 10


class _UnhandledHint:
    """Why this worker took a message it has no handler for, from what its command line says.

    What is known: the types its ``--handlers`` registered, and why it reads the
    queue the message came from (``--priority``, ``--queue``, or by default).
    The usual cause: a queue read without a handler for every type sent there,
    e.g. an old ``--queue NAME:P`` command line (``--queue`` once restricted the
    worker; it now adds a queue, so the default queue is read as well).
    """

    def __init__(
        self,
        spec: str,
        types: list[str],
        priorities: list[int],
        from_cli: Mapping[int, str],
        label: Callable[[int], str],
    ) -> None:
        shown = ", ".join(map(repr, types[:_TYPES_SHOWN]))
        more = len(types) - _TYPES_SHOWN
        self.handles = f"this worker (--handlers {spec}) handles {shown}" + (
            f" and {more} more types" if more > 0 else ""
        )
        self.priorities = priorities
        self.from_cli = dict(from_cli)
        self.label = label

    def __call__(self, message: Message, priority: int) -> str:
        where = self.label(priority)
        have = f"give --handlers a handler for {message.type!r}"
        if self.priorities:
            why = (
                f"it reads priority {where} because --priority {priority} says so: {have}, "
                f"or leave priority {priority} to a worker that has one"
            )
        elif priority in self.from_cli:
            why = (
                f"it reads priority {where} because of --queue {self.from_cli[priority]}:"
                f"{priority}, and a worker on a queue needs a handler for every type sent "
                f"there: {have}, or leave that queue to a worker that has one"
            )
        elif self.from_cli:
            queues = ", ".join(f"{name}:{p}" for p, name in sorted(self.from_cli.items()))
            only = " ".join(f"--priority {p}" for p in sorted(self.from_cli, reverse=True))
            why = (
                f"it reads priority {where} besides --queue {queues} because --queue adds a "
                f"queue (it no longer restricts the worker to it): to read only those queues "
                f"as before, add {only}; or {have}"
            )
        else:
            why = (
                f"it reads priority {where} as it reads every queue it knows without "
                f"--priority: {have}, or give --priority for the queues whose types it handles"
            )
        return f"{self.handles}; {why}"
