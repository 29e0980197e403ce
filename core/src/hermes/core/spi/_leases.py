"""Keeping a consumer's claim alive while its handlers run, and sending its settles.

Three schemes at-least-once drivers share:

* :class:`LeaseKeeper` -- a daemon thread that renews what a consumer holds
  (a Redis lease, an SQS visibility timeout, a row's deadline) every
  interval, and logs an outage once instead of once per attempt.
* :class:`Handover` -- settles made on handler threads, queued for the one
  thread that may touch a client that is not thread-safe (pika, a
  connection held by the receiving loop).
* :class:`AckBatch` -- acknowledgements held back a moment, so several
  reach the broker in one call (one ``basic_ack`` with ``multiple``, the
  script of the next take).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from hermes.core.model._errors import DriverError
from hermes.core.spi._door import reraise

if TYPE_CHECKING:
    from hermes.core.spi._driver import Driver

logger = logging.getLogger("hermes")

T = TypeVar("T")

#: Seconds the oldest acknowledgement of an :class:`AckBatch` waits, at most, while
#: the consumer hands out what it already holds instead of calling the broker.
ACK_DELAY_S = 0.1


class LeaseKeeper:
    """Calls ``renew()`` every ``interval_s`` on a daemon thread until :meth:`stop`.

    ``renew`` may raise ``driver``'s client exceptions: the keeper translates
    them (:meth:`Driver.classify_error`). When it cannot reach the broker,
    the first failure of an outage is one WARNING naming ``what`` (``"the
    lease of worker X"``), the recovery one INFO; the thread keeps trying.
    Choose ``interval_s`` well inside the lease (a third of it, say), so one
    missed renewal does not lose it. Any other exception is logged with its
    traceback and the thread keeps going: a renewer that dies silently would
    let every long handler run twice.
    """

    def __init__(
        self,
        renew: Callable[[], None],
        interval_s: float,
        what: str,
        *,
        driver: Driver,
        name: str = "hermes-leases",
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.renew = renew
        self.driver = driver
        self.interval_s = interval_s
        self.what = what
        self._stopping = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop renewing; wait at most ``timeout_s`` for a renewal in progress."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def renew_now(self) -> None:
        """One renewal on the calling thread, logged like the thread's own."""
        try:
            try:
                self.renew()
            except Exception as exc:
                reraise(self.driver, exc, f"renewing {self.what}")
        except DriverError as exc:
            if not self._failing:
                logger.warning(
                    "could not renew %s, trying again every %.1f s - %s",
                    self.what,
                    self.interval_s,
                    exc,
                )
            self._failing = True
            return
        except Exception:
            logger.exception("renewing %s failed unexpectedly; trying again", self.what)
            return
        if self._failing:
            logger.info("renews %s again", self.what)
        self._failing = False

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval_s):
            self.renew_now()


class Handover:
    """Runs settles on the thread that owns a client; other threads queue them.

    :meth:`claim` makes the calling thread the owner: call it at the start of
    every ``receive`` and in ``close``, since the worker may receive on a
    different thread each time (one at a time). :meth:`call` runs
    ``fn(*args)`` at once on the owner, and from any other thread queues it
    and calls ``wake`` (pika's ``add_callback_threadsafe``, say) so the owner
    comes round to it. The owner runs what is queued with :meth:`run_pending`:
    before each receive, from its client's callback, and in ``close``.

    A queued settle may raise ``driver``'s client exceptions: :meth:`run_pending`
    translates them, as core does around a settle it calls itself.

    A settle the owner runs at once holds a lock that :meth:`claim` takes
    too: once another thread has claimed the client, the former owner's
    settles are queued, and one it was running has finished. So the client
    is never used by two threads at once, whichever thread receives next.
    """

    def __init__(self, driver: Driver, wake: Callable[[], None] | None = None) -> None:
        self.driver = driver
        self.owner: int | None = None
        self.wake = wake
        self._pending: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._lock = threading.Lock()

    def claim(self) -> None:
        """Make the calling thread the owner, once a settle the former owner runs has finished."""
        with self._lock:
            self.owner = threading.get_ident()

    @property
    def on_owner(self) -> bool:
        return threading.get_ident() == self.owner

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        me = threading.get_ident()
        if me == self.owner:  # on_owner, without a property call per settle
            with self._lock:
                if me == self.owner:  # still: no other thread claimed it meanwhile
                    fn(*args)
                    return
        self._pending.append((fn, args))
        if self.wake is not None:
            self.wake()

    def pending(self) -> int:
        return len(self._pending)

    def run_pending(self, on_error: Callable[[DriverError], None] | None = None) -> None:
        """On the owner: run what other threads queued, in order.

        A :class:`DriverError` goes to ``on_error`` (the rest still run)
        or, without one, is raised after the others ran.
        """
        first: DriverError | None = None
        while self._pending:
            fn, args = self._pending.popleft()
            try:
                try:
                    fn(*args)
                except Exception as exc:
                    reraise(self.driver, exc, "settling a message another thread handled")
            except DriverError as exc:
                if on_error is not None:
                    on_error(exc)
                elif first is None:
                    first = exc
        if first is not None:
            raise first


class AckBatch(Generic[T]):
    """Acknowledgements held back to reach the broker together; safe from any thread.

    A consumer calls :meth:`add` with each acknowledgement (a delivery tag, what its
    script needs) and sends what :meth:`take` gives it in one call: with its
    next call to the broker (a take), before its receiving thread waits idle,
    in ``close``, and whenever :meth:`due` says -- ``most`` are waiting, or the
    oldest has waited ``delay_s`` while the consumer handed out messages it
    held without calling the broker. So a busy worker pays one call for
    many acknowledgements, and a quiet one sits on none.

    While the receiving thread waits idle (inside :meth:`idle`), :meth:`add`
    holds nothing and returns False: the caller sends that one at once,
    since no take is coming to carry it. A send that failed
    hands what it took to :meth:`put_back`, to go first with the next; a consumer
    whose acknowledgements mean nothing on a new connection (RabbitMQ's
    delivery tags) drops them instead.
    """

    def __init__(self, most: int = 0, delay_s: float = ACK_DELAY_S) -> None:
        #: Due once this many wait (0: however many; only age or the next call sends them).
        self.most = most
        self.delay_s = delay_s
        self._items: list[T] = []
        #: ``time.monotonic()`` of the oldest waiting (None: none waits).
        self._since: float | None = None
        self._idle = False
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: T) -> bool:
        """Hold ``item`` for the next send; False while idle: send it now yourself."""
        with self._lock:
            if self._idle:
                return False
            self._items.append(item)
            if self._since is None:
                self._since = time.monotonic()
            return True

    def due(self) -> bool:
        """Whether what waits should go now: ``most`` of them, or the oldest waited ``delay_s``."""
        since = self._since
        if since is None:
            return False
        return (0 < self.most <= len(self._items)) or time.monotonic() - since > self.delay_s

    def take(self) -> list[T]:
        """Everything waiting, oldest first; the batch is empty after."""
        with self._lock:
            items, self._items, self._since = self._items, [], None
        return items

    def put_back(self, items: list[T]) -> None:
        """What a failed send took: it goes first with the next one."""
        if not items:
            return
        with self._lock:
            self._items[:0] = items
            if self._since is None:
                self._since = time.monotonic()

    @property
    def is_idle(self) -> bool:
        """Whether the receiving thread waits idle (inside :meth:`idle`)."""
        return self._idle

    @contextlib.contextmanager
    def idle(self) -> Iterator[bool]:
        """While the receiving thread waits idle; yields whether anything waits (send it).

        An :meth:`add` inside returns False, so nothing is left waiting for a
        take that does not come.
        """
        with self._lock:
            self._idle = True
            waiting = bool(self._items)
        try:
            yield waiting
        finally:
            with self._lock:
                self._idle = False
