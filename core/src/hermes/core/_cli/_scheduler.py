"""``hermes scheduler``: emit the periodic entries of ``module:object`` on their ticks.

Also what ``hermes worker --scheduler`` uses to run a scheduler in a thread
beside the worker's handlers.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from types import FrameType
from typing import Any

from hermes.core._cli._common import (
    URL_HELP,
    CliError,
    configure_logging,
    default_url,
    one_line,
    setup_priorities,
)
from hermes.core._cli._loading import load_object
from hermes.core._cli._workers import add_heartbeat_options, publisher_for, registry
from hermes.core.app._handler import HandlerRegistry
from hermes.core.app._schedule import Schedule
from hermes.core.model._errors import error_text
from hermes.core.run._heartbeat import scheduler_fields
from hermes.core.run._scheduler import CATCH_UP_WINDOW_S, LocalClaims, Scheduler
from hermes.core.spi._driver import Driver, SupportsClaim, SupportsHeartbeats
from hermes.core.spi._registry import connect
from hermes.core.spi._url import redact_url

logger = logging.getLogger("hermes")

#: Fire times ``--list`` shows per entry.
LISTED_FIRE_TIMES = 3
#: How long a stopping worker waits for its scheduler thread to finish the tick in progress.
SCHEDULER_JOIN_S = 10.0


def add_parser(commands: Any) -> None:
    """Add ``hermes scheduler`` to the subcommands ``commands``."""
    parser = commands.add_parser(
        "scheduler",
        help="emit the periodic entries declared beside the handlers",
        description="Emit each periodic entry's message on its ticks. Any number of schedulers "
        "may run at once: each tick is claimed on the broker first and only the scheduler "
        "that wins emits it; a scheduler that starts catches up the ticks missed in the last "
        "hour by each entry's catch_up policy.",
    )
    parser.add_argument("--url", help=URL_HELP)
    parser.add_argument(
        "--handlers",
        required=True,
        metavar="MODULE:OBJECT",
        help="where the entries are declared: a hermes.core.HandlerRegistry "
        "(handlers.every(...), handlers.cron(...)) or a hermes.core.schedule.Schedule",
    )
    claims = parser.add_mutually_exclusive_group()
    claims.add_argument(
        "--lock-url",
        metavar="URL",
        help="claim ticks on this broker instead of --url, for a --url whose driver cannot "
        "claim (amqp://, sqs://, kafka://), e.g. redis://localhost:6379/0",
    )
    claims.add_argument(
        "--single",
        action="store_true",
        help="this is the only scheduler: claim ticks in this process (no catch-up of ticks "
        "from before it started)",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help=f"print each entry and its next {LISTED_FIRE_TIMES} fire times, then exit",
    )
    parser.add_argument(
        "--catch-up-window",
        type=float,
        default=CATCH_UP_WINDOW_S,
        metavar="SECONDS",
        help=f"how far back a starting scheduler looks for missed ticks (default "
        f"{CATCH_UP_WINDOW_S:g})",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="count", default=0, help="debug lines")
    group.add_argument("-q", "--quiet", action="count", default=0, help="warnings and errors")
    add_heartbeat_options(parser)
    parser.set_defaults(run=run)


def schedule_of(target: object, spec: str) -> Schedule:
    """The entries of ``target`` (a registry or a Schedule); a :class:`CliError` if it has none."""
    if isinstance(target, HandlerRegistry):
        schedule = target.schedule
    elif isinstance(target, Schedule):
        schedule = target
    else:
        raise CliError(
            f"{spec} is a {type(target).__name__}: periodic entries are declared on a "
            "hermes.core.HandlerRegistry (handlers.every(...), handlers.cron(...)) or a "
            "hermes.core.schedule.Schedule"
        )
    if not schedule.entries:
        raise CliError(
            f"{spec} declares no periodic entries: add some with handlers.every(seconds=..., "
            "type=...) or handlers.cron('*/5 * * * *', type=...)"
        )
    return schedule


def make_scheduler(
    schedule: Schedule,
    driver: Driver,
    url: str,
    *,
    lock_url: str | None,
    single: bool,
    catch_up_window_s: float = CATCH_UP_WINDOW_S,
) -> Scheduler:
    """A Scheduler claiming on ``driver``, the ``lock_url`` broker or (``single``) in memory."""
    for entry in schedule:
        setup_priorities(driver, [entry.priority])
    if not catch_up_window_s > 0:
        raise CliError(f"--catch-up-window {catch_up_window_s:g} must be > 0 seconds")
    if lock_url:
        lock = connect(lock_url)
        if not isinstance(lock, SupportsClaim):
            lock.close()
            raise CliError(
                f"--lock-url {redact_url(lock_url)}: {type(lock).__name__} cannot claim ticks "
                "either; name a redis:// or file:// broker"
            )
        return Scheduler(schedule, driver, claims=lock, catch_up_window_s=catch_up_window_s)
    if isinstance(driver, SupportsClaim):
        return Scheduler(schedule, driver, catch_up_window_s=catch_up_window_s)
    if single:
        logger.info("--single: ticks are claimed in this process; run no other scheduler")
        return Scheduler(schedule, driver, claims=LocalClaims(), catch_up=False)
    raise CliError(
        f"{redact_url(url)}: {type(driver).__name__} cannot claim ticks, so two schedulers "
        "would emit each tick twice: add --lock-url naming a broker that can (redis://, "
        "file://), or --single if this is the only scheduler"
    )


def beat_for(
    stack: contextlib.ExitStack,
    args: argparse.Namespace,
    store: SupportsHeartbeats | None,
    url: str,
    scheduler: Scheduler,
) -> None:
    """Publish ``scheduler``'s heartbeat (its entries' next and last fires) until ``stack`` ends."""
    publisher = publisher_for(args, store, url, "scheduler")
    if publisher is not None:
        stack.enter_context(publisher.running(lambda: scheduler_fields(scheduler)))


def run(args: argparse.Namespace) -> int:
    target = load_object(args.handlers)
    schedule = schedule_of(target, args.handlers)
    if args.list:
        _print_list(schedule, time.time())
        return 0
    configure_logging(args.verbose - args.quiet)
    url: str = args.url or default_url()
    with connect(url) as driver:
        scheduler = make_scheduler(
            schedule,
            driver,
            url,
            lock_url=args.lock_url,
            single=args.single,
            catch_up_window_s=args.catch_up_window,
        )
        try:
            _log_start(scheduler, url)
            with contextlib.ExitStack() as stack:
                store = stack.enter_context(registry(driver, args.registry_url))
                beat_for(stack, args, store, url, scheduler)
                counts = _run_until_signal(scheduler)
        finally:
            _close_claims(scheduler, driver)
    print(
        f"Scheduler stopped: emitted {counts['emitted']}, skipped {counts['skipped']}, "
        f"taken by other schedulers {counts['taken']}, lost {counts['lost']}",
        flush=True,
    )
    return 0


@contextlib.contextmanager
def running_in_worker(
    args: argparse.Namespace, target: object, driver: Driver, url: str
) -> Iterator[Scheduler]:
    """``hermes worker --scheduler``: a scheduler on a thread of its own while the block runs.

    On leaving, the scheduler is stopped, its thread joined (it finishes the
    tick in progress, :data:`SCHEDULER_JOIN_S` at most) and the ``--lock-url``
    driver it claimed on closed.
    """
    spec = args.handlers if args.scheduler is True else str(args.scheduler)
    source = target if args.scheduler is True else load_object(spec)
    schedule = schedule_of(source, spec)
    scheduler = make_scheduler(schedule, driver, url, lock_url=args.lock_url, single=False)
    try:
        _log_start(scheduler, url)
        # A daemon: a thread stuck in a tick past the join must not keep the process alive.
        thread = threading.Thread(
            target=_run_in_worker, args=(scheduler,), name="hermes-scheduler", daemon=True
        )
        thread.start()
        try:
            yield scheduler
        finally:
            scheduler.stop()
            thread.join(SCHEDULER_JOIN_S)
            if thread.is_alive():
                logger.warning(
                    "The scheduler thread is still in a tick %g s after it was asked to stop; "
                    "leaving it",
                    SCHEDULER_JOIN_S,
                )
    finally:
        _close_claims(scheduler, driver)


def _close_claims(scheduler: Scheduler, driver: Driver) -> None:
    """Close the ``--lock-url`` driver ``scheduler`` claims on, if it opened one."""
    lock: object = scheduler.claims
    if lock is not driver and isinstance(lock, Driver):
        lock.close()


def _run_in_worker(scheduler: Scheduler) -> None:
    """The scheduler thread of a worker: if it ever dies, the worker's log says so."""
    try:
        scheduler.run()
    except Exception as exc:
        # The worker goes on handling messages; without this line the periodic
        # entries would stop with nothing said.
        logger.error(
            "The scheduler thread stopped - %s; this worker emits no more periodic ticks "
            "(restart it, or run hermes scheduler on its own)",
            error_text(exc),
            exc_info=True,
        )


def _run_until_signal(scheduler: Scheduler) -> Counter[str]:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("%s: stopping the scheduler", signal.Signals(signum).name)
        scheduler.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        scheduler.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return scheduler.counts


def _log_start(scheduler: Scheduler, url: str) -> None:
    claims = scheduler.claims
    where = "in this process (--single: no catch-up)"
    if not isinstance(claims, LocalClaims):
        where = f"on {claims!r}"
    names = ", ".join(entry.name for entry in scheduler.entries)
    logger.info(one_line(f"Scheduler on {redact_url(url)}: {names}; ticks claimed {where}"))
    for entry in scheduler.entries:
        logger.info(
            "Entry %s: %s -> %s priority:%s, catch_up %s",
            entry.name,
            entry.describe(),
            entry.type,
            entry.priority,
            entry.catch_up.value,
        )


def _print_list(schedule: Schedule, now: float) -> None:
    for entry in schedule:
        zone = entry.zone
        times = [
            dt.datetime.fromtimestamp(at, zone).isoformat(timespec="seconds")
            for at in entry.next_fire_times(now, LISTED_FIRE_TIMES)
        ]
        print(
            f"{entry.name}: {entry.describe()} -> {entry.type} priority:{entry.priority} "
            f"catch_up:{entry.catch_up.value}; next {', '.join(times)}",
            flush=True,
        )
