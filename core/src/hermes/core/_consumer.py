"""The consumer contract a driver implements, and core's one loop that drives it.

A driver does not write a loop. It hands core a :class:`Consumer` — one run's
hold on the broker — whose :meth:`~Consumer.receive` returns one
:class:`Received` body at a time; core unserializes it, calls the callback, and
settles it with exactly one of :meth:`~Consumer.ack`, :meth:`~Consumer.release`
or :meth:`~Consumer.reject`. Everything else a worker needs is here, once: the
stop checks, max items, the poison log, reconnect backoff.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from hermes.core._errors import BrokerUnavailableError, SerializeError
from hermes.core._message import Message

if TYPE_CHECKING:
    from hermes.core._driver import Callback, Driver
    from hermes.core._shutdown import Shutdown

logger = logging.getLogger("hermes")

_current: contextvars.ContextVar[Received | None] = contextvars.ContextVar(
    "hermes_current_received", default=None
)


def current_received() -> Received | None:
    """The :class:`Received` whose callback runs on this thread, else None.

    A driver exposes broker facts to handlers through it (SQS: the receive
    count, as ``current_delivery()``), whichever handler thread runs them.
    """
    return _current.get()


#: The longest a consumer's ``receive`` may block: the worker checks shutdown and
#: max items at least this often, so a stop request is seen within about a second.
IDLE_WAIT_S = 1.0


@dataclass(slots=True, eq=False)
class Received:
    """One body a consumer took from the broker, until core settles it."""

    #: The bytes (or text) as the broker holds them: core unserializes them.
    body: str | bytes
    #: The priority of the queue it came from.
    priority: int
    #: Whatever the consumer needs to settle it later (a delivery tag, a receipt
    #: handle, a path, an offset); core never looks inside.
    token: Any = None
    #: Set by core once the body has been unserialized.
    message: Message | None = None
    #: Where it came from, for log lines about it (``new/<file>``, ``queue jobs tag 7``);
    #: empty: its priority's queue.
    origin: str = ""


class Consumer(ABC):
    """One run of a worker's hold on the broker: take, acknowledge, release, reject.

    What a driver implements instead of a loop. :meth:`Driver.wait` (core)
    calls :meth:`receive` until it stops and settles every :class:`Received`
    with exactly one of :meth:`ack`, :meth:`release` or :meth:`reject`, then
    calls :meth:`close` once. Contract:

    * Creating a consumer does no I/O beyond what cannot wait; :meth:`receive`
      connects on first use and again after it raised
      :class:`BrokerUnavailableError` (core backs off, jittered and capped,
      between the attempts). Any other :class:`DriverError` ends the run.
    * :meth:`receive` blocks at most ``timeout_s`` (core passes at most
      :data:`IDLE_WAIT_S`) and returns None when nothing is ready. A broker
      that can wake a waiting worker (a blocking pop, a push consumer, a long
      poll capped at ``timeout_s``) should use it. Queues are read from the
      highest priority down, and a message whose ``execute_at`` the driver
      holds is returned only once due.
    * :meth:`ack`, :meth:`release` and :meth:`reject` may be called from
      another thread than the one that received the message (a worker may run
      several handlers at once); a client that is not thread-safe hands the
      call to its own thread. They raise :class:`BrokerUnavailableError` when
      the broker is gone; core logs it and goes on (an at-least-once broker
      delivers the message again).
    * Nothing is taken far ahead of the handlers: a consumer that prefetches
      keeps its buffer small and gives it back in :meth:`close`.
    """

    @abstractmethod
    def receive(self, timeout_s: float) -> Received | None:
        """The next body, highest priority first; None when nothing came within ``timeout_s``."""

    def ack(self, received: Received) -> None:  # noqa: B027 - at-most-once removed it on receive
        """The handlers are done: the broker may forget it (at-least-once drivers delete it here).

        An at-most-once consumer removed the message when it took it and does nothing here.
        """

    def release(self, received: Received) -> None:  # noqa: B027 - at-most-once has nothing to give back
        """Give it back so it is delivered again: the callback raised, or the worker stops first.

        An at-most-once consumer, which removed the message when it took it, may do nothing.
        """

    def reject(self, received: Received, reason: str) -> None:
        """The body is not a Hermes message: set it aside or delete it.

        Core has already logged ``reason``. Quarantine or dead-letter it where
        the broker can; the default deletes it (:meth:`ack`).
        """
        self.ack(received)

    def close(self) -> None:  # noqa: B027 - many consumers hold nothing of their own
        """End the run: give back anything prefetched, leave groups, release connections."""

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


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

    def next_delay_s(self) -> float:
        """Count one more failure; how long to wait before the next attempt."""
        self.failures += 1
        delay = min(self.cap_s, self.first_s * 2.0 ** min(self.failures - 1, 32))
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> int:
        """Count a success; the failures before it."""
        failures, self.failures = self.failures, 0
        return failures


class Run:
    """One run of the loop: its own count, limit, shutdown and start time.

    A second ``wait()`` after one that stopped at max items starts again from 0.
    """

    def __init__(self, max_items: int, shutdown: Shutdown | None, start_time: float) -> None:
        self.max_items = max_items
        self.shutdown = shutdown
        self.start_time = start_time
        #: Messages settled (acknowledged after their callback) in this run.
        self.processed = 0

    def should_stop(self) -> bool:
        if self.max_items and self.processed >= self.max_items:
            return True
        return self.shutdown is not None and self.shutdown.should_shutdown(self.start_time)

    def pause(self, seconds: float, step_s: float = 0.25) -> None:
        """Sleep ``seconds``, returning early once :meth:`should_stop`."""
        deadline = time.monotonic() + seconds
        while not self.should_stop():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, step_s))


def _settle(
    driver: Driver, what: str, received: Received, action: Callable[..., None], *args: Any
) -> bool:
    """Call ``action(received, *args)``; a broker gone meanwhile is logged, not raised.

    True if it worked.
    """
    try:
        action(received, *args)
    except BrokerUnavailableError as exc:
        logger.warning(
            "%r: could not %s %s - %s", driver, what, _describe(received), exc, exc_info=True
        )
        return False
    return True


def _describe(received: Received) -> str:
    if received.message is not None:
        return f"message #{received.message.id} ({received.message.type})"
    return f"the body from {received.origin or f'priority {received.priority}'}"


class _Loop:
    """The steps of core's loop, shared by the serial and the concurrent worker."""

    def __init__(
        self, driver: Driver, callback: Callback, consumer: Consumer, stopper: Run
    ) -> None:
        self.driver = driver
        self.callback = callback
        self.consumer = consumer
        self.stopper = stopper
        self.backoff = Backoff()
        self.debug = logger.isEnabledFor(logging.DEBUG)
        self.count_lock = threading.Lock()

    def take(self) -> Received | None:
        """One message from the consumer, unserialized; None when idle, poisoned or unreachable."""
        driver, consumer = self.driver, self.consumer
        try:
            received = consumer.receive(IDLE_WAIT_S)
        except BrokerUnavailableError as exc:
            delay = self.backoff.next_delay_s()
            logger.warning(
                "%r: broker unavailable (attempt %d), retrying in %.2f s - %s",
                driver,
                self.backoff.failures,
                delay,
                exc,
            )
            self.stopper.pause(delay)
            return None
        if self.backoff.failures:
            failures = self.backoff.reset()
            logger.info("%r: broker is back after %d failed attempt(s)", driver, failures)
        if received is None:
            return None
        try:
            received.message = driver.serializer.unserialize(received.body)
        except SerializeError as exc:
            logger.error(
                "%r: set aside %s, which is not a Hermes message - %s",
                driver,
                _describe(received),
                exc,
            )
            _settle(driver, "set aside", received, consumer.reject, str(exc))
            return None
        if self.debug:
            message = received.message
            logger.debug("%r: took message #%s (%s)", driver, message.id, message.type)
        return received

    def deliver(self, received: Received) -> None:
        """Call back, then acknowledge; release and re-raise when the callback raises."""
        driver, message = self.driver, received.message
        assert message is not None
        current = _current.set(received)
        try:
            self.callback(message, received.priority)
        except BaseException:
            if _settle(driver, "release", received, self.consumer.release) and self.debug:
                logger.debug("%r: released message #%s", driver, message.id)
            raise
        finally:
            _current.reset(current)
        if _settle(driver, "acknowledge", received, self.consumer.ack) and self.debug:
            logger.debug("%r: acknowledged message #%s", driver, message.id)
        with self.count_lock:
            self.stopper.processed += 1
            driver.processed_items += 1


def run(
    driver: Driver,
    callback: Callback,
    consumer: Consumer,
    stopper: Run,
    concurrency: int = 1,
    grace_s: float = 30.0,
) -> None:
    """Core's loop: receive, unserialize, call back, settle, until ``stopper`` says stop.

    An exception escaping ``callback`` releases that message and propagates.
    With ``concurrency`` > 1 the callbacks run on that many handler threads;
    see :class:`_ConcurrentRun`.
    """
    loop = _Loop(driver, callback, consumer, stopper)
    if concurrency > 1:
        _ConcurrentRun(loop, concurrency, grace_s).run()
        return
    while not stopper.should_stop():
        received = loop.take()
        if received is not None:
            loop.deliver(received)


class _ConcurrentRun:
    """``concurrency`` handler threads fed by this thread, never more taken than they can run.

    This thread receives only while a handler thread is free, so at most
    ``concurrency`` messages are off the broker at once (plus what a consumer
    prefetches). Max items counts messages started, so no more than asked are
    taken. When the run stops — shutdown, max items, or a callback that raised
    — no more are taken; the handlers in flight get ``grace_s`` to finish,
    and what has not finished by then is left unacknowledged (an at-least-once
    broker delivers it again). Handler threads are daemon threads: a second
    Ctrl-C ends the process at once.
    """

    def __init__(self, loop: _Loop, concurrency: int, grace_s: float) -> None:
        self.loop = loop
        self.concurrency = concurrency
        self.grace_s = grace_s
        self.free = threading.Semaphore(concurrency)
        self.work: queue.SimpleQueue[Received | None] = queue.SimpleQueue()
        self.lock = threading.Condition()
        self.in_flight = 0
        self.started = 0
        #: The first exception a callback raised: the run stops and re-raises it.
        self.error: BaseException | None = None
        #: Set once the run gave up waiting: late handlers must not settle any more.
        self.abandoned = False

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._work, name=f"hermes-handler-{i + 1}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        try:
            self._feed()
        finally:
            for _ in threads:
                self.work.put(None)
            self._drain()
        if self.error is not None:
            raise self.error

    def _stopping(self) -> bool:
        if self.error is not None:
            return True
        stopper = self.loop.stopper
        if stopper.max_items and self.started >= stopper.max_items:
            return True
        return stopper.shutdown is not None and stopper.shutdown.should_shutdown(stopper.start_time)

    def _feed(self) -> None:
        while not self._stopping():
            if not self.free.acquire(timeout=IDLE_WAIT_S):
                continue  # every handler busy: look at the stop conditions again
            received = self.loop.take() if not self._stopping() else None
            if received is None:
                self.free.release()
                continue
            with self.lock:
                self.in_flight += 1
                self.started += 1
            self.work.put(received)

    def _work(self) -> None:
        while (received := self.work.get()) is not None:
            try:
                if self.abandoned:  # taken, never started: give it back
                    loop = self.loop
                    _settle(loop.driver, "release", received, loop.consumer.release)
                    continue
                self.loop.deliver(received)
            except BaseException as exc:
                with self.lock:
                    if self.error is None:
                        self.error = exc
            finally:
                self.free.release()
                with self.lock:
                    self.in_flight -= 1
                    self.lock.notify_all()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.grace_s
        with self.lock:
            while self.in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.abandoned = True
                    logger.warning(
                        "%r: %d handler(s) still running after the %.0f s grace period; "
                        "their messages are not acknowledged (an at-least-once broker "
                        "delivers them again)",
                        self.loop.driver,
                        self.in_flight,
                        self.grace_s,
                    )
                    return
                self.lock.wait(min(left, 0.5))
