"""The Worker: one run of taking messages from a driver's consumer and handling them.

The driver only moves bodies (:class:`~hermes.core.driver.Consumer`); the
Worker owns everything about the run: the stop conditions (one composite),
signals, max items, counts and start time, unserializing what the consumer
hands over, the poison log, reconnect backoff, and the handler threads.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from hermes.core.app._dispatcher import Dispatcher
from hermes.core.app._handler import HandlerRegistry
from hermes.core.app._invoke import Awaiting
from hermes.core.app._jobs import JobError, JobState
from hermes.core.model._errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    ConfigurationError,
    DriverError,
    SerializeError,
)
from hermes.core.model._message import Message
from hermes.core.run._heartbeat import worker_fields
from hermes.core.spi._consumer import (
    IDLE_WAIT_S,
    SERVICE_INTERVAL_S,
    Consumer,
    Received,
    _current,
    decode,
)
from hermes.core.spi._door import translate_errors, translated
from hermes.core.spi._driver import SupportsStats
from hermes.core.spi._registry import notify, plugin_manager
from hermes.core.spi._shutdown import Shutdown

if TYPE_CHECKING:
    import random
    from collections.abc import Generator

    from hermes.core.app._failed import FailedStore
    from hermes.core.run._heartbeat import HeartbeatPublisher
    from hermes.core.spi._driver import Driver

logger = logging.getLogger("hermes")

#: Between WARNING and INFO: PSR-3's NOTICE, used for "Exiting hermes dispatcher".
NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")

#: ``handle(message, priority) -> bool``: what a run calls per message.
HandleFunction = Callable[[Message, int], bool]


class Backoff:
    """Jittered exponential waits between reconnect attempts, capped.

    Workers that lost one broker together do not come back together: each
    wait is a random 50-100 % of ``first_s * 2**(failures - 1)``, at most ``cap_s``.
    """

    def __init__(self, first_s: float = 0.1, cap_s: float = 5.0) -> None:
        self.first_s = first_s
        self.cap_s = cap_s
        #: Failed attempts since the last success.
        self.failures = 0
        self._random: random.Random | None = None

    def next_delay_s(self) -> float:
        """Count one more failure; how long to wait before the next attempt."""
        self.failures += 1
        delay = min(self.cap_s, self.first_s * 2.0 ** min(self.failures - 1, 32))
        if self._random is None:
            import random  # on the first failure: most runs never back off

            # Its own generator: a worker's threads leave the application's
            # global ``random`` sequence (which it may have seeded) alone.
            self._random = random.Random()
        return delay * self._random.uniform(0.5, 1.0)

    def reset(self) -> int:
        """Count a success; the failures before it."""
        failures, self.failures = self.failures, 0
        return failures


class StopConditions:
    """Every reason a run stops, asked in one place: :meth:`should_stop`.

    Max items (counted as messages started, so no more than asked are taken),
    a signal or :meth:`Worker.stop`, the Shutdowns (a shared file, a Redis
    key), and any extra predicate (``testing.drain``: nothing left due).
    """

    def __init__(
        self,
        max_items: int,
        shutdowns: Sequence[Shutdown],
        start_time: float,
        extra: Callable[[], bool] | None = None,
    ) -> None:
        self.max_items = max_items
        self.shutdowns = tuple(shutdowns)
        self.start_time = start_time
        self.extra = extra
        #: Messages taken to be handled in this run.
        self.started = 0
        #: Why the run stopped, once it has: "max items", "shutdown", "SIGTERM", ...
        self.reason: str | None = None
        #: True when the run takes nothing more only to read other priorities
        #: (:attr:`switch` held): the run goes on once the handlers in flight end.
        self.switching = False
        #: Asked last: True when the priorities read must change (a pause).
        self.switch: Callable[[], bool] | None = None

    def request(self, reason: str) -> None:
        """Stop: a signal, :meth:`Worker.stop`, or a handler that raised out of the run."""
        if self.reason is None:
            self.reason = reason

    def should_stop(self) -> bool:
        if self.reason is not None:
            return True
        if self.max_items and self.started >= self.max_items:
            self.reason = "max items"
            return True
        for shutdown in self.shutdowns:
            if shutdown.should_shutdown(self.start_time):
                self.reason = "shutdown"
                return True
        if self.extra is not None and self.extra():
            self.reason = "done"
            return True
        if self.switching:
            return True
        if self.switch is not None and self.switch():
            self.switching = True
            return True
        return False

    def pause(self, seconds: float, step_s: float = 0.25) -> None:
        """Sleep ``seconds``, returning early once :meth:`should_stop`."""
        deadline = time.monotonic() + seconds
        while not self.should_stop():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, step_s))


@dataclass
class WorkerStats:
    """What one run did. Handler outcomes are the Dispatcher's (``dispatcher.stats``)."""

    #: Messages taken from the broker and handed to the handlers.
    started: int = 0
    #: Messages acknowledged after their handlers returned.
    processed: int = 0
    #: Bodies that were not Hermes messages, set aside.
    rejected: int = 0
    #: Messages delivered more than ``max_deliveries`` times, set aside unhandled.
    set_aside: int = 0
    #: When the run started (UNIX time); a shutdown request older than it is ignored.
    start_time: float = field(default_factory=time.time)
    #: Why it stopped: "max items", "shutdown", "SIGTERM", "SIGINT", "stop()", "done".
    stopped_by: str | None = None


class Worker:
    """One run: takes messages from ``driver`` and hands each to ``handlers``.

    ``handlers`` is a :class:`Dispatcher`, a :class:`HandlerRegistry`, a dict
    ``{type: handler or [handlers]}`` (a Dispatcher is made for the last two,
    with ``failed``, ``time_limit_s`` and ``logger``), or a function
    ``handle(message, priority) -> bool`` (PHP's callback). :meth:`run`
    blocks until a stop condition holds:

    * ``max_items`` messages were taken (0: no limit);
    * a ``shutdown`` (one or several :class:`Shutdown`; by default the
      Dispatcher's own) asks, for a request made after the run started;
    * SIGTERM or SIGINT (on the main thread, with ``handle_signals``): handlers
      in flight finish; a second SIGINT interrupts them;
    * :meth:`stop`, from any thread.

    ``max_deliveries`` (0: no limit, the default; None: the Dispatcher's)
    guards against the message that kills its worker (a segfault, the OOM
    killer, a SIGKILL): where the driver counts deliveries
    (:attr:`Capabilities.counts_deliveries`), a message handed out more than
    that many times is not given to the handlers again. It is set aside with
    one ERROR line: kept in the Dispatcher's failed-message store when it
    has one (then acknowledged), else the consumer's :meth:`~Consumer.reject`.
    ``heartbeat`` (a :class:`~hermes.core.heartbeat.HeartbeatPublisher`)
    publishes this run's record -- counts and the jobs in flight
    (:meth:`in_flight`) -- from its own thread while the run lasts.

    ``concurrency`` messages are in the handlers at once; each message is
    acknowledged only after its own handlers returned. A sync handler runs on
    a thread of its own; a message whose handlers are all ``async def`` runs
    as a task on the Dispatcher's event loop and holds no thread while it
    awaits (see :func:`handler_mix`): an async-only worker keeps up to
    ``concurrency`` coroutines in flight with a few threads. On a stop, handlers
    in flight get ``grace_s`` to finish; what is still running then is neither
    acknowledged nor released -- the broker's own timeout decides (an
    at-least-once broker delivers it again once this worker is gone).
    """

    def __init__(
        self,
        driver: Driver,
        handlers: Dispatcher | HandlerRegistry | Mapping[str, Any] | HandleFunction,
        *,
        priorities: Sequence[int] = (),
        concurrency: int | None = None,
        grace_s: float | None = None,
        time_limit_s: float | None = None,
        max_items: int = 0,
        shutdown: Shutdown | Iterable[Shutdown] | None = None,
        failed: Driver | FailedStore | None = None,
        handle_signals: bool = True,
        stop_when: Callable[[], bool] | None = None,
        logger: logging.Logger | None = None,
        max_deliveries: int | None = None,
        heartbeat: HeartbeatPublisher | None = None,
    ) -> None:
        dispatcher = _dispatcher(driver, handlers, failed, time_limit_s, logger)
        if concurrency is None:
            concurrency = dispatcher.concurrency if dispatcher is not None else 1
        if grace_s is None:
            grace_s = dispatcher.grace_s if dispatcher is not None else 30.0
        if max_deliveries is None:
            max_deliveries = dispatcher.max_deliveries if dispatcher is not None else 0
        if dispatcher is not None:
            # What the Dispatcher was made with holds for its runs unless told otherwise.
            shutdown = dispatcher.shutdown if shutdown is None else shutdown
            logger = logger or dispatcher.logger
        _check_int("concurrency", concurrency, 1)
        _check_int("max_items", max_items, 0)
        _check_int("max_deliveries", max_deliveries, 0)
        if not grace_s >= 0:
            raise ConfigurationError(f"grace_s must be >= 0 seconds, got {grace_s!r}")
        self.driver = driver
        #: The Dispatcher that handles each message (None for a bare callback).
        self.dispatcher = dispatcher
        self._handle: HandleFunction = (
            dispatcher.handle_message if dispatcher is not None else handlers  # type: ignore[assignment]
        )
        self.priorities = tuple(priorities)
        self.concurrency = concurrency
        self.grace_s = grace_s
        self.max_items = max_items
        #: Set aside a message delivered more than this many times (0: never).
        self.max_deliveries = max_deliveries
        if shutdown is None:
            self.shutdowns: tuple[Shutdown, ...] = ()
        elif isinstance(shutdown, Shutdown):
            self.shutdowns = (shutdown,)
        else:
            self.shutdowns = tuple(shutdown)
        self.handle_signals = handle_signals
        self.logger = logger or logging.getLogger("hermes")
        self._stop_when = stop_when
        self._stop: StopConditions | None = None
        self._stop_requested: str | None = None
        self._stop_lock = threading.Lock()
        #: The last run's counts (a fresh one per :meth:`run`).
        self.stats = WorkerStats()
        self.heartbeat = heartbeat
        self._loop: _Loop | None = None
        #: The priorities this run skips now because they are paused fleet-wide.
        self.paused: frozenset[int] = frozenset()
        #: Every priority paused on the registry, as its publisher last read them.
        self._fleet_paused: frozenset[int] = frozenset()
        #: Counts the changes of ``_fleet_paused``: the run compares it before each receive.
        self._pause_version = 0

    def in_flight(self) -> list[tuple[str, str, float]]:
        """``(type, id, since)`` of each message in the handlers now; callable from any thread."""
        loop = self._loop
        if loop is None:
            return []
        # dict.copy() is one step under the interpreter lock: no lock needed to read.
        return list(loop.running.copy().values())

    def stop(self, reason: str = "stop()") -> None:
        """Ask the run to stop after the messages in flight; callable from any thread.

        Asked before :meth:`run`, the next run stops before taking a message;
        ``reason`` is what :attr:`WorkerStats.stopped_by` then says. A request
        ends one run: the Worker can be run again, and that run starts afresh.
        """
        with self._stop_lock:
            if self._stop is not None:
                self._stop.request(reason)
            else:
                self._stop_requested = reason

    def run(self) -> WorkerStats:
        """Handle messages until a stop condition holds; the run's counts.

        A :class:`DriverError` other than the broker being away (it is waited
        for, with backoff) is logged with its cause and raised, as is an
        exception a handle function raised (its message is released first).
        """
        self.stats = stats = WorkerStats()
        stop = StopConditions(self.max_items, self.shutdowns, stats.start_time, self._stop_when)
        with self._stop_lock:
            # A stop() since the last run is this run's; the next one starts without it.
            if self._stop_requested is not None:
                stop.request(self._stop_requested)
                self._stop_requested = None
            self._stop = stop
        if self.max_deliveries and not self.driver.capabilities.counts_deliveries:
            self.logger.warning(
                "%r does not count deliveries: max_deliveries=%d cannot set aside a message "
                "that keeps killing its worker",
                self.driver,
                self.max_deliveries,
            )
        beating: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        self._fleet_paused = self.paused = frozenset()  # the publisher says what is paused now
        if self.heartbeat is not None:
            # A stop requested on the registry (the dashboard's Stop) stops as stop() does;
            # a priority paused there is skipped (see _run_consumers).
            beating = self.heartbeat.running(
                lambda: worker_fields(self), on_stop=self.stop, on_pause=self._on_pause
            )
            if self.dispatcher is not None:  # with job records: attempts name it, lost ones swept
                beat = self.heartbeat
                self.dispatcher.beats_on(beat.registry, beat.id, beat.interval_s)
        # What the run starts for the handlers (an event loop) ends with it, unless
        # another run of the same Dispatcher still uses it.
        handling: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if self.dispatcher is not None:
            handling = self.dispatcher.running()
        try:
            with handling, beating, self._signals(stop):
                self._run_consumers(stop)
        except BrokerRefusedError:
            raise  # the caller's mistake, said in one line by whoever runs the worker
        except DriverError as exc:
            self.logger.error("Driver %r failed - %s", self.driver, exc, exc_info=True)
            raise
        finally:
            with self._stop_lock:
                self._stop = None
            stats.stopped_by = stop.reason
        if stop.reason not in (None, "max items", "done"):
            self.logger.log(NOTICE, "Exiting hermes dispatcher - shutdown")
        return stats

    def _run_consumers(self, stop: StopConditions) -> None:
        """Run a consumer of the priorities not paused; another whenever the pauses change.

        Between two consumers the handlers in flight finish (the first one's
        messages are settled on it); while every priority this worker reads
        is paused, it takes nothing and waits for a resume or a stop.
        """
        while True:
            version = self._pause_version
            priorities = self._unpaused(self._fleet_paused)
            # Pauses arrive with the heartbeat: without one, nothing to ask per message.
            if self.heartbeat is not None:
                stop.switch = functools.partial(self._pauses_changed, version)
            if priorities is None:
                self.logger.log(
                    NOTICE,
                    "Every priority this worker reads is paused (%s): taking nothing until "
                    "one is resumed",
                    ", ".join(str(p) for p in sorted(self.paused)),
                )
                while not stop.should_stop():
                    time.sleep(0.1)
            else:
                with self._consumer(priorities) as consumer:
                    loop = self._loop = _Loop(self, consumer, stop)
                    if self.concurrency > 1:
                        mix = handler_mix(self.dispatcher)
                        _ConcurrentRun(loop, self.concurrency, self.grace_s, mix).run()
                    else:
                        loop.run_serial()
            if not stop.switching or stop.reason is not None:
                return
            stop.switching = False

    def _pauses_changed(self, since: int) -> bool:
        return self._pause_version != since

    def _on_pause(self, paused: Mapping[int, Mapping[str, Any]]) -> None:
        """The publisher read new paused priorities: the run switches before its next receive."""
        for priority, info in sorted(paused.items()):
            if priority not in self._fleet_paused:
                self.logger.info(
                    "Priority %d paused %s: finishing what runs, then taking none of it",
                    priority,
                    info.get("by", "by someone"),
                )
        for priority in sorted(self._fleet_paused - paused.keys()):
            self.logger.info("Priority %d resumed: taking it again", priority)
        self._fleet_paused = frozenset(paused)
        self._pause_version += 1

    def _unpaused(self, paused: frozenset[int]) -> Sequence[int] | None:
        """The priorities to read with ``paused`` skipped: () for every one, None for none."""
        if not paused:
            self.paused = frozenset()
            return self.priorities
        wanted = self.priorities or self._known_priorities()
        if wanted is None:
            self.logger.warning(
                "%r does not list its priorities: this worker reads every one, and "
                "cannot skip the paused ones (%s); start it with --priority",
                self.driver,
                ", ".join(str(p) for p in sorted(paused)),
            )
            self.paused = frozenset()
            return self.priorities
        self.paused = frozenset(wanted) & paused
        left = [p for p in wanted if p not in paused]
        return left or None

    def _known_priorities(self) -> list[int] | None:
        if not isinstance(self.driver, SupportsStats):
            return None
        with translate_errors(self.driver, "listing the priorities"):
            return sorted({row.priority for row in self.driver.queue_stats()}, reverse=True)

    @contextlib.contextmanager
    def _consumer(self, priorities: Sequence[int]) -> Iterator[Consumer]:
        with translate_errors(self.driver, "starting a consumer"):
            consumer = self.driver.consumer(priorities, concurrency=self.concurrency)
        try:
            yield consumer
        finally:
            try:
                with translate_errors(self.driver, "closing the consumer"):
                    consumer.close()
            except BrokerUnavailableError as exc:
                self.logger.warning("%r: could not close its consumer - %s", self.driver, exc)

    @contextlib.contextmanager
    def _signals(self, stop: StopConditions) -> Iterator[None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if stop.reason is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C does not wait for the handler
            name = signal.Signals(signum).name
            stop.request(name)
            self.logger.log(NOTICE, "Received %s, stopping after the message in progress", name)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")


#: Threads that take turns at the consumer in an async-only run: one receives
#: (and does the work before each handler: limits, the job record) while the
#: other stands by to take over should that work block.
ASYNC_RECEIVERS = 2
#: Threads that do the work after each coroutine (the job record's end, a
#: retry copy, the failed store, the acknowledgement): the event loop never
#: makes a blocking driver or store call. A few suffice: each step is short.
SETTLE_THREADS = 4
#: Coroutines that ended in one turn of the event loop go to the settle threads
#: in lots of at most this many: a thread woken per lot, not per message.
SETTLE_LOT = 16


def handler_mix(dispatcher: Dispatcher | None) -> str:
    """``"sync"``, ``"async"`` or ``"mixed"``: how a concurrent run of ``dispatcher`` is laid out.

    ``async`` when every registered handler is an ``async def handle`` (and
    no plugin pairs hooks by thread, see :meth:`Dispatcher.runs_async`): a
    few threads, up to ``concurrency`` coroutines in flight. ``sync``: a
    thread per message in flight, as ever. ``mixed``: ``concurrency``
    threads for the sync ones, and ``concurrency`` bounds sync and async
    messages in flight together.
    """
    if dispatcher is None:
        return "sync"
    kinds = {
        inspect.iscoroutinefunction(handler.handle) or getattr(handler, "is_async", False) is True
        for handlers in dispatcher.registered().values()
        for handler in handlers
    }
    if True not in kinds or not dispatcher.async_hooks_ok():
        return "sync"
    return "async" if kinds == {True} else "mixed"


def _dispatcher(
    driver: Driver,
    handlers: object,
    failed: Driver | FailedStore | None,
    time_limit_s: float | None,
    logger: logging.Logger | None,
) -> Dispatcher | None:
    if isinstance(handlers, Dispatcher):
        if failed is not None or time_limit_s is not None:
            raise ConfigurationError(
                "failed= and time_limit_s= are the Dispatcher's: give them to Dispatcher(...)"
            )
        return handlers
    if isinstance(handlers, HandlerRegistry | Mapping):
        dispatcher = Dispatcher(driver, logger, time_limit_s=time_limit_s, failed=failed)
        if isinstance(handlers, HandlerRegistry):
            handlers.register(dispatcher)
        else:
            for type_, registered in handlers.items():
                many = isinstance(registered, list | tuple)
                dispatcher.register_handlers(type_, registered if many else [registered])
        return dispatcher
    if callable(handlers):
        return None
    raise ConfigurationError(
        f"Worker handlers must be a Dispatcher, a HandlerRegistry, a dict of type -> "
        f"handler(s) or a function (message, priority) -> bool, not {handlers!r}"
    )


def _describe(received: Received) -> str:
    if received.message is not None:
        return f"message #{received.message.id} ({received.message.type})"
    return f"the body from {received.origin or f'priority {received.priority}'}"


class _Loop:
    """The steps of a run, shared by the serial and the concurrent worker."""

    def __init__(self, worker: Worker, consumer: Consumer, stop: StopConditions) -> None:
        self.worker = worker
        self.driver = worker.driver
        self.handle = worker._handle
        self.consumer = consumer
        self.stop = stop
        self.stats = worker.stats
        self.backoff = Backoff()
        self.debug = logger.isEnabledFor(logging.DEBUG)
        self.count_lock = threading.Lock()
        #: Set when the run closed the consumer with handlers still running: what
        #: they finish later is not settled (the broker's own timeout decides).
        self.abandoned = False
        #: Guards ``abandoned`` against ``settling``: each message is either settled
        #: or abandoned, never both -- see :meth:`settle` and ``_ConcurrentRun._abandon``.
        #: Taken as a plain lock per settle; the condition is waited on only by the
        #: abandoning run, which sets ``abandoned`` first, so a settle notifies only then.
        self.settle_lock = threading.Lock()
        self.settle_turn = threading.Condition(self.settle_lock)
        #: Whether threads share this loop (a concurrent run): only then can a
        #: message be abandoned while it settles, so only then is a settle guarded.
        self.shared = False
        #: Settles under way: the run waits for them before it closes the consumer.
        self.settling = 0
        #: id(received) -> (type, id, since) of each message in the handlers now:
        #: what a heartbeat shows as in flight. No lock: each change is one dict
        #: store or delete and each reader takes a ``copy()``, both single steps
        #: under the interpreter lock.
        self.running: dict[int, tuple[str, str, float]] = {}
        self._hooks = plugin_manager().hook
        #: The async path (a run of coroutines without a thread each); None: every
        #: message runs on the thread that took it.
        self.coroutines: _Coroutines | None = None

    def run_serial(self) -> None:
        stop, take, deliver = self.stop, self.take, self.deliver
        servicing: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if _needs_service(self.consumer):
            # Held while this thread receives, and by the servicer while it services.
            turn = threading.Lock()

            def turn_for_service() -> bool:
                if not turn.acquire(blocking=False):
                    return False  # this thread receives: it keeps the connection alive itself
                if _handlers_busy(self):
                    return True
                turn.release()
                return False

            def take_in_turn() -> Received | None:
                with turn:
                    return self.take()

            take = take_in_turn
            servicing = _Servicer.running(self, turn_for_service, turn.release)
        with servicing:
            while not stop.should_stop():
                received = take()
                if received is not None:
                    stop.started += 1
                    deliver(received)

    def take(self) -> Received | None:
        """One message from the consumer, unserialized; None when idle, poisoned or unreachable."""
        driver = self.driver
        try:
            # The client's errors translated here, not by a context manager per call.
            try:
                received = self.consumer.receive(IDLE_WAIT_S)
            except Exception as exc:
                error = translated(driver, exc, "receiving")
                if error is None or error is exc:
                    raise
                raise error from exc
        except BrokerUnavailableError as exc:
            delay = self.backoff.next_delay_s()
            logger.warning(
                "%r: broker unavailable (attempt %d), retrying in %.2f s - %s",
                driver,
                self.backoff.failures,
                delay,
                exc,
            )
            self.stop.pause(delay)
            return None
        if self.backoff.failures:
            failures = self.backoff.reset()
            logger.info("%r: broker is back after %d failed attempt(s)", driver, failures)
        if received is None:
            return None
        if received.message is None:
            try:
                received.message = decode(received.body)
            except SerializeError as exc:
                self.reject(received, exc)
                return None
        limit = self.worker.max_deliveries
        if limit and received.delivery_count is not None and received.delivery_count > limit:
            self.set_aside(received, limit)
            return None
        if self.debug:
            message = received.message
            logger.debug("%r: took message #%s (%s)", driver, message.id, message.type)
        return received

    def reject(self, received: Received, exc: SerializeError) -> None:
        logger.error(
            "%r: set aside %s, which is not a Hermes message - %s",
            self.driver,
            _describe(received),
            exc,
        )
        self.settle("set aside", received, self.consumer.reject, str(exc))
        with self.count_lock:
            self.stats.rejected += 1
        notify(
            self._hooks.hermes_message_rejected,
            body=received.body,
            priority=received.priority,
            reason=str(exc),
        )

    def set_aside(self, received: Received, limit: int) -> None:
        """Keep a message delivered more than ``limit`` times from its handlers.

        Its earlier deliveries were never settled: each time, the worker died
        or stalled before the handler returned. Into the failed-message store
        (then acknowledged), else the consumer's reject path.
        """
        message = received.message
        assert message is not None
        reason = (
            f"delivered {received.delivery_count} times, more than max_deliveries={limit}, "
            "without its handler ever finishing (the worker died or stalled each time)"
        )
        dispatcher = self.worker.dispatcher
        store = dispatcher.failed if dispatcher is not None else None
        kept, where = False, "the driver's reject path"
        if store is not None:
            try:
                store.keep(message, reason, priority=received.priority)
                kept, where = True, "the failed-message store"
            except DriverError as exc:
                # Not released: it would come back and take a worker down again.
                where += f" (the failed-message store failed - {exc})"
        logger.error(
            "%r: set aside %s, %s; it goes to %s", self.driver, _describe(received), reason, where
        )
        records = dispatcher.records if dispatcher is not None else None
        if records is not None:
            try:
                records.finish(
                    message,
                    "set_aside",
                    state=JobState.GIVEN_UP,
                    error=JobError.reason(f"set aside: {reason}"),
                )
            except DriverError as exc:
                logger.error(
                    "%r: the record of #%s could not say so - %s", records, message.id, exc
                )
        if kept:
            self.settle("acknowledge", received, self.consumer.ack)
        else:
            self.settle("set aside", received, self.consumer.reject, reason)
        with self.count_lock:
            self.stats.set_aside += 1

    def deliver(self, received: Received) -> None:
        """Call the handlers, then acknowledge; release and re-raise when the call raises.

        A message the async path takes returns once its coroutine started.
        """
        message = received.message
        assert message is not None
        coroutines = self.coroutines
        if coroutines is not None and coroutines.dispatcher.runs_async(message):
            coroutines.start(received, message)
            return
        key = id(received)
        # One dict store, atomic under the interpreter lock (in_flight copies the dict).
        self.running[key] = (message.type, message.id, time.time())
        with self.count_lock:
            self.stats.started += 1
        token = _current.set(received)
        try:
            self.handle(message, received.priority)
        except BaseException:
            try:
                if self.settle("release", received, self.consumer.release) and self.debug:
                    logger.debug("%r: released message #%s", self.driver, message.id)
            finally:
                _current.reset(token)
                self.running.pop(key, None)
            raise
        _current.reset(token)
        settled = False
        try:
            settled = self.settle("acknowledge", received, self.consumer.ack)
            if settled and self.debug:
                logger.debug("%r: acknowledged message #%s", self.driver, message.id)
        finally:
            # In flight until it is acknowledged (settle() takes a settled one out).
            self.running.pop(key, None)
            if settled:
                with self.count_lock:
                    self.stats.processed += 1

    def settle(
        self, what: str, received: Received, action: Callable[..., None], *args: Any
    ) -> bool:
        """Call ``action(received, *args)``; a broker gone meanwhile is logged, not raised.

        True if it worked.
        """
        if not self.shared:  # a serial run: its one thread settles, nothing abandons
            return self._settle(what, received, action, *args)
        with self.settle_lock:
            abandoned = self.abandoned
            if not abandoned:
                self.settling += 1
        if abandoned:
            logger.info(
                "%r: did not %s %s: its handler outlived the grace period and the consumer "
                "is closed; the broker delivers it again",
                self.driver,
                what,
                _describe(received),
            )
            return False
        try:
            return self._settle(what, received, action, *args)
        finally:
            with self.settle_lock:
                self.running.pop(id(received), None)  # settled: not left to abandon
                self.settling -= 1
                if self.abandoned:  # the run waits for the settles under way
                    self.settle_turn.notify_all()

    def _settle(
        self, what: str, received: Received, action: Callable[..., None], *args: Any
    ) -> bool:
        try:
            try:
                action(received, *args)
            except Exception as exc:  # only a failure pays for the description
                error = translated(self.driver, exc, f"{what} {_describe(received)}")
                if error is None or error is exc:
                    raise
                raise error from exc
        except BrokerUnavailableError as exc:
            logger.warning(
                "%r: could not %s %s - %s",
                self.driver,
                what,
                _describe(received),
                exc,
                exc_info=True,
            )
            return False
        return True


class _Settlers:
    """A few daemon threads that advance messages whose coroutine ended."""

    def __init__(self, count: int) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._run, name=f"hermes-settle-{i + 1}", daemon=True)
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._queue.put((fn, args))

    def _run(self) -> None:
        get = self._queue.get
        while (item := get()) is not None:
            fn, args = item
            try:
                fn(*args)
            except BaseException:
                logger.exception("Hermes: settling a message failed")

    def stop(self) -> None:
        """End the threads once what is queued ran; does not wait."""
        for _ in self._threads:
            self._queue.put(None)


if TYPE_CHECKING:
    #: A coroutine that ended, as the steps of its message take it up again:
    #: ``(received, steps, context, value, exception)``.
    _Ended = tuple[
        Received, Generator[Awaiting, Any, bool], contextvars.Context, Any, BaseException | None
    ]


class _Coroutines:
    """The async path of a run: messages whose handlers are all ``async def``.

    The thread that took the message advances the Dispatcher's steps
    (:meth:`Dispatcher.message_steps`) up to the first coroutine -- the
    limits, the job record's start, the ``started`` hook -- starts it on the
    Dispatcher's event loop and goes back to receiving. When the coroutine
    ends, the event loop hands the rest (the record's end, a retry copy, the
    failed store, hooks, the acknowledgement) to a :class:`_Settlers`
    thread: the loop itself never calls the driver or a store. Each
    message's steps run in one :class:`contextvars.Context` of its own,
    whichever thread advances them. The message is in ``loop.running`` from
    its receive until it is settled: the run bounds that count by
    ``concurrency``, a heartbeat shows it, the grace period waits for it.
    """

    def __init__(
        self,
        loop: _Loop,
        dispatcher: Dispatcher,
        settlers: _Settlers,
        freed: Callable[[], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        self.loop = loop
        self.dispatcher = dispatcher
        self.settlers = settlers
        self.event_loop = dispatcher.event_loop
        #: Called after each message settles: a slot is free.
        self.freed = freed
        #: Called with what the steps raised: the run stops and raises it.
        self.failed = failed
        #: Coroutines that ended in this turn of the event loop, for the settle
        #: threads (touched on the event loop thread only).
        self.ended: list[_Ended] = []

    def start(self, received: Received, message: Message) -> None:
        loop = self.loop
        loop.running[id(received)] = (message.type, message.id, time.time())
        with loop.count_lock:
            loop.stats.started += 1
        context = contextvars.copy_context()
        context.run(_current.set, received)
        steps = self.dispatcher.message_steps(message, received.priority)
        self.advance(received, steps, context, None, None)

    def advance(
        self,
        received: Received,
        steps: Generator[Awaiting, Any, bool],
        context: contextvars.Context,
        value: Any,
        exc: BaseException | None,
        free: bool = True,
    ) -> None:
        """Run the steps up to the next coroutine (started) or to the end (settled).

        Settled, its slot is freed (``free``; else the caller frees it).
        """
        try:
            if exc is None:
                awaiting = context.run(steps.send, value)
            else:
                awaiting = context.run(steps.throw, exc)
        except StopIteration:
            self._settle(received, "acknowledge", self.loop.consumer.ack, free)
            return
        except BaseException as error:
            self.failed(error)  # the run stops first: nothing takes the message back meanwhile
            self._settle(received, "release", self.loop.consumer.release, free)
            return
        done = functools.partial(self._done, received, steps, context)
        try:
            self.event_loop.start(awaiting, context.copy(), done)
        except BaseException as error:
            awaiting.coroutine.close()
            self.settlers.submit(self.advance, received, steps, context, None, error)

    def _done(
        self,
        received: Received,
        steps: Generator[Awaiting, Any, bool],
        context: contextvars.Context,
        value: Any,
        exc: BaseException | None,
    ) -> None:
        # On the event loop thread: hand over, never block.
        if self.loop.abandoned:
            return  # its message stays unsettled; the steps, collected, write nothing
        import asyncio  # imported already: an event loop runs

        try:
            event_loop = asyncio.get_running_loop()
        except RuntimeError:  # the loop could not start it (closed): told on another thread
            self.settlers.submit(self.advance, received, steps, context, value, exc)
            return
        ended = self.ended
        ended.append((received, steps, context, value, exc))
        if len(ended) == 1:  # the first this turn: handed over with those after it
            event_loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        ended, self.ended = self.ended, []
        for at in range(0, len(ended), SETTLE_LOT):
            self.settlers.submit(self._advance_all, ended[at : at + SETTLE_LOT])

    def _advance_all(self, ended: list[_Ended]) -> None:
        try:
            for one in ended:
                try:
                    self.advance(*one, free=False)
                except BaseException:
                    logger.exception("Hermes: settling a message failed")
        finally:
            self.freed()  # once for the lot: a thread waiting for a slot wakes once

    def _settle(
        self, received: Received, what: str, action: Callable[..., None], free: bool = True
    ) -> None:
        loop = self.loop
        settled = False
        try:
            settled = loop.settle(what, received, action)
            if settled and loop.debug:
                assert received.message is not None
                logger.debug("%r: %sd message #%s", loop.driver, what, received.message.id)
        finally:
            loop.running.pop(id(received), None)
            if settled and what == "acknowledge":
                with loop.count_lock:
                    loop.stats.processed += 1
            if free:
                self.freed()


def _needs_service(consumer: Consumer) -> bool:
    """Whether ``consumer`` asks to be serviced while handlers run (it overrides ``service``)."""
    return type(consumer).service is not Consumer.service


def _handlers_busy(loop: _Loop) -> bool:
    """Whether a handler has run for :data:`SERVICE_INTERVAL_S` (nobody received since)."""
    now = time.time()
    return any(now - since >= SERVICE_INTERVAL_S for _, _, since in loop.running.copy().values())


class _Servicer:
    """A thread that services the consumer while handlers run and no thread receives.

    For a consumer that overrides :meth:`~hermes.core.driver.Consumer.service`
    (pika answers heartbeats only from inside its calls): with every handler
    thread in a long handler, nothing would call the client, the broker would
    drop the connection after its heartbeat timeout, and the messages in the
    handlers would be delivered again and never acknowledged. Every
    :data:`SERVICE_INTERVAL_S` this thread asks ``take()`` for the consumer --
    True once it holds it, as a receiving thread would, because no thread
    receives and a handler runs -- services it and calls ``give_back()``.

    A failure is one WARNING until servicing works again (the next receive
    reconnects a lost connection); the thread goes on, since a servicer that
    died silently would let every long handler run twice.
    """

    def __init__(
        self, loop: _Loop, take: Callable[[], bool], give_back: Callable[[], None]
    ) -> None:
        self.loop = loop
        self.take = take
        self.give_back = give_back
        self.failing = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hermes-service", daemon=True)

    @classmethod
    @contextlib.contextmanager
    def running(
        cls, loop: _Loop, take: Callable[[], bool], give_back: Callable[[], None]
    ) -> Iterator[None]:
        """Service ``loop``'s consumer while the block runs, if it asks for it.

        On leaving, waits for a service in progress: the consumer is closed after.
        """
        if not _needs_service(loop.consumer):
            yield
            return
        servicer = cls(loop, take, give_back)
        servicer._thread.start()
        try:
            yield
        finally:
            servicer._done.set()
            servicer._thread.join()

    def _run(self) -> None:
        while not self._done.wait(SERVICE_INTERVAL_S):
            if self.take():
                try:
                    self.service()
                finally:
                    self.give_back()

    def service(self) -> None:
        driver = self.loop.driver
        try:
            with translate_errors(driver, "servicing the consumer while handlers run"):
                self.loop.consumer.service()
        except Exception as exc:
            if not self.failing:
                logger.warning(
                    "%r: could not keep the consumer's connection alive while handlers run - %s",
                    driver,
                    exc,
                    exc_info=not isinstance(exc, DriverError),
                )
            self.failing = True
        else:
            self.failing = False


#: A message whose handlers have run this long on the thread that took it is
#: overtaken: an idle handler thread takes the consumer and the next message.
OVERTAKE_AFTER_S = 0.001
#: How often the standby thread looks at the consumer's holder: the first
#: value, doubling while every message it sees finishes in time, up to the second.
STANDBY_LOOK_S = (0.001, 0.05)
#: How often the calling thread of a concurrent run looks at the stop conditions.
_WATCH_S = 0.25


class _ConcurrentRun:
    """``concurrency`` threads that take turns at the consumer; each runs what it took.

    One thread at a time holds the consumer. It receives a message and runs
    its handlers itself, as a serial worker does, then receives the next. While
    it runs handlers another thread may take the consumer over and receive the
    next message: at once, a thread that has just finished a message of its
    own; otherwise the standby (one idle thread, looking every few
    milliseconds) once the handlers have run :data:`OVERTAKE_AFTER_S`. Short
    jobs thus run back to back on one thread, and long ones overlap up to
    ``concurrency``. A queue from a receiving thread to handler threads costs
    a handoff per message, and on short jobs the context switches it brings
    (several per message) cost more than the overlap gains.

    The consumer is used by one thread at a time, not always the same one; a
    settle may come from any thread (see :class:`~hermes.core.driver.Consumer`).
    A thread receives only while it runs nothing, so at most ``concurrency``
    messages are off the broker at once (plus what a consumer prefetches).

    While every thread runs a handler nothing receives; a consumer that needs
    its client called meanwhile is serviced by a :class:`_Servicer`, which
    takes the consumer like a thread that receives and gives it back at once.

    The calling thread receives nothing: it watches the stop conditions. When
    the run stops -- a stop condition, or a handle function that raised -- no
    more are taken; the handlers in flight get ``grace_s`` to finish, and what
    has not finished by then is left unsettled: the consumer is closed with it
    held, and a late handler settles nothing (the broker's own timeout
    decides). Handler threads are daemon threads: a second Ctrl-C ends the
    process at once.
    """

    def __init__(self, loop: _Loop, concurrency: int, grace_s: float, mix: str = "sync") -> None:
        self.loop = loop
        loop.shared = True
        self.concurrency = concurrency
        self.grace_s = grace_s
        #: "sync": a thread per message in flight; "async" and "mixed": messages
        #: whose handlers are all async def run as tasks (see :class:`_Coroutines`).
        self.mix = mix
        #: Handler threads: ``concurrency`` unless every handler is async def.
        self.threads = min(concurrency, ASYNC_RECEIVERS) if mix == "async" else concurrency
        #: Whether messages in flight are counted against ``concurrency`` (the
        #: threads bound them otherwise).
        self.bounded = mix != "sync"
        #: Threads waiting for a message in flight to settle before they may receive.
        self.slot_waiters = 0
        self.settlers: _Settlers | None = None
        self.lock = threading.Lock()
        #: Idle threads wait here for the consumer.
        self.turn = threading.Condition(self.lock)
        #: The thread (its ident) that holds the consumer; None while none does.
        self.holder: int | None = None
        #: When the holder handed its message to the handlers; None while it receives.
        self.busy_since: float | None = None
        #: True while the holder is inside ``receive``: the consumer may not be closed then.
        self.receiving = False
        #: Whether an idle thread is the standby (looks at the holder every few ms).
        self.has_standby = False
        #: ``should_stop()`` is asked by one thread at a time: the holder, or the calling thread.
        self.stop_lock = threading.Lock()
        #: Set by the thread that finds the run must stop: the calling thread wakes.
        self.stopping = threading.Event()
        #: The first exception a handle function or the consumer raised: the run
        #: stops and re-raises it.
        self.error: BaseException | None = None
        #: Set once the run gave up waiting: late handlers must not settle any more.
        self.abandoned = False

    def run(self) -> None:
        if self.bounded:
            dispatcher = self.loop.worker.dispatcher
            assert dispatcher is not None
            self.settlers = _Settlers(min(SETTLE_THREADS, self.concurrency))
            self.loop.coroutines = _Coroutines(
                self.loop, dispatcher, self.settlers, self._freed, self._failed
            )
        try:
            with _Servicer.running(self.loop, self._take_for_service, self._give_back):
                self._run()
        finally:
            if self.settlers is not None:
                self.settlers.stop()

    def _slot_free(self) -> bool:
        return not self.bounded or len(self.loop.running) < self.concurrency

    def _freed(self) -> None:
        """A message in flight settled: a thread waiting for a slot may receive."""
        if self.slot_waiters:
            with self.turn:
                self.turn.notify_all()

    def _failed(self, error: BaseException) -> None:
        """What a message's steps raised on a settle thread: the run stops and raises it."""
        self.loop.stop.request("a handler raised")
        with self.turn:
            if self.error is None:
                self.error = error
            self.stopping.set()
            self.turn.notify_all()

    def _take_for_service(self) -> bool:
        """Hold the consumer for the servicer, if nobody receives and a handler runs."""
        with self.turn:
            since = self.busy_since
            if (
                self.holder is None
                or (since is not None and time.monotonic() - since >= SERVICE_INTERVAL_S)
            ) and self.loop.running:
                self.holder, self.busy_since = threading.get_ident(), None
                return True
            return False

    def _give_back(self) -> None:
        with self.turn:
            if self.holder == threading.get_ident():
                self.holder = None
            self.turn.notify_all()

    def _run(self) -> None:
        threads = [
            threading.Thread(target=self._runner, name=f"hermes-handler-{i + 1}", daemon=True)
            for i in range(self.threads)
        ]
        for thread in threads:
            thread.start()
        stop, stop_lock = self.loop.stop, self.stop_lock
        try:
            # The holder asks the stop conditions before each receive; this thread
            # asks too, for the runs in which every thread is in a long handler.
            while not self.stopping.wait(_WATCH_S) and self.error is None:
                with stop_lock:
                    if stop.should_stop():
                        break
        finally:
            with self.turn:
                self.stopping.set()
                self.turn.notify_all()  # idle threads see the stop at once
            try:
                self._drain(threads)
            except BaseException:
                # A second Ctrl-C: the run ends now, and what still runs settles nothing.
                self.abandoned = self.loop.abandoned = True
                raise
        if self.error is not None:
            raise self.error

    def _runner(self) -> None:
        me = threading.get_ident()
        finished = False
        try:
            while self._take_turn(me, finished):
                finished = self._hold(me)
        except BaseException as exc:
            with self.turn:
                if self.error is None:
                    self.error = exc
        finally:
            with self.turn:
                if self.holder == me:
                    self.holder = self.busy_since = None
                if self.error is not None:
                    self.stopping.set()
                self.turn.notify_all()

    def _take_turn(self, me: int, finished: bool) -> bool:
        """Wait until this thread holds the consumer; False once the run stops.

        ``finished``: this thread has just run a message and was overtaken
        meanwhile; it takes the consumer back at once if its holder is busy.
        """
        look_s, max_look_s = STANDBY_LOOK_S
        standby = relook = False
        with self.turn:
            try:
                while not self.stopping.is_set():
                    if self.bounded and not self._slot_free():
                        # As many in flight as allowed: wait for one to settle. Counted
                        # first, then asked again: a settle in between either is seen
                        # here or sees the waiter and wakes it (no lost wake-up).
                        self.slot_waiters += 1
                        try:
                            if not self._slot_free():
                                self.turn.wait(IDLE_WAIT_S)
                        finally:
                            self.slot_waiters -= 1
                        continue
                    since = self.busy_since
                    if self.holder is None or (
                        since is not None
                        and (finished or time.monotonic() - since >= OVERTAKE_AFTER_S)
                    ):
                        self.holder, self.busy_since = me, None
                        return True
                    finished = False
                    if not standby and not self.has_standby:
                        standby = self.has_standby = True
                    if not standby:
                        self.turn.wait(IDLE_WAIT_S)  # the standby wakes one of us as it leaves
                    elif since is not None and not relook:
                        # A message in its handlers: look again when it is due to be overtaken.
                        relook = True
                        self.turn.wait(OVERTAKE_AFTER_S - (time.monotonic() - since))
                    else:
                        # The message looked at finished in time, or the holder
                        # receives: look less often while that is all there is.
                        relook = False
                        look_s = min(look_s * 2, max_look_s)
                        self.turn.wait(look_s)
                return False
            finally:
                if standby:
                    self.has_standby = False
                    self.turn.notify()  # another idle thread becomes the standby

    def _hold(self, me: int) -> bool:
        """Receive and run messages while this thread holds the consumer.

        True when it was overtaken while it ran a message; False when the run stops.
        """
        loop, stop, lock, stop_lock = self.loop, self.loop.stop, self.lock, self.stop_lock
        take, deliver, monotonic = loop.take, loop.deliver, time.monotonic
        while True:
            with stop_lock:
                stopping = stop.should_stop()
            if stopping or self.stopping.is_set():
                with self.turn:
                    self.holder = None
                    self.stopping.set()
                    self.turn.notify_all()
                return False
            if self.bounded and not self._slot_free():
                with self.turn:  # give the consumer back (serviceable meanwhile) and wait
                    if self.holder == me:
                        self.holder = self.busy_since = None
                    self.turn.notify_all()
                return False
            self.receiving = True
            try:
                received = take()
            finally:
                self.receiving = False
            if received is None:
                continue
            stop.started += 1
            self.busy_since = monotonic()
            try:
                deliver(received)
            except BaseException:
                stop.request("a handler raised")
                raise
            with lock:
                if self.holder == me:
                    self.busy_since = None
                    continue
            return True

    def _drain(self, threads: list[threading.Thread]) -> None:
        """Wait up to the grace period for every thread to finish what it runs.

        A thread inside ``receive`` is waited for past the grace period (a
        receive is bounded): the consumer is closed after it returns.
        """
        stop = self.loop.stop
        # Switching to other priorities waits for every handler, however long it
        # runs, until a stop comes: then the grace period counts from there.
        deadline = None if stop.switching else time.monotonic() + self.grace_s
        for thread in threads:
            while thread.is_alive():
                if deadline is None:
                    if stop.reason is None:
                        thread.join(0.5)
                        continue
                    deadline = time.monotonic() + self.grace_s
                left = deadline - time.monotonic()
                if left <= 0 and not self.receiving:
                    self._abandon()
                    return
                # In steps, so a second Ctrl-C is seen while handlers run.
                thread.join(min(max(left, 0.05), 0.5))
        # Coroutines still in flight (and their settles): no thread of the run waits for them.
        while self.bounded and self.loop.running:
            if deadline is None:
                if stop.reason is None:
                    time.sleep(0.05)
                    continue
                deadline = time.monotonic() + self.grace_s
            left = deadline - time.monotonic()
            if left <= 0:
                self._abandon()
                return
            time.sleep(min(left, 0.02))

    def _abandon(self) -> None:
        loop = self.loop
        with loop.settle_turn:
            self.abandoned = loop.abandoned = True
            # A settle already under way won: it ends before the consumer is closed,
            # and its message is no longer among those left.
            loop.settle_turn.wait_for(lambda: loop.settling == 0)
            left = len(loop.running)
        if left:
            logger.warning(
                "%r: %d handler(s) still running after the %g s grace period; "
                "their messages are not acknowledged (an at-least-once broker "
                "delivers them again)",
                loop.driver,
                left,
                self.grace_s,
            )
