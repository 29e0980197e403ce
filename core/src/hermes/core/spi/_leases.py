"""Keeping a consumer's claim alive while its handlers run, and handing settles to one thread.

Two schemes at-least-once drivers share:

* :class:`LeaseKeeper` -- a daemon thread that renews what a consumer holds
  (a Redis lease, an SQS visibility timeout, a row's deadline) every
  interval, and logs an outage once instead of once per attempt.
* :class:`Handover` -- settles made on handler threads, queued for the one
  thread that may touch a client that is not thread-safe (pika, a
  connection held by the receiving loop).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

from hermes.core.model._errors import DriverError

logger = logging.getLogger("hermes")


class LeaseKeeper:
    """Calls ``renew()`` every ``interval_s`` on a daemon thread until :meth:`stop`.

    ``renew`` raises :class:`DriverError` when it cannot reach the broker:
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
        name: str = "hermes-leases",
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.renew = renew
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
            self.renew()
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

    A settle the owner runs at once holds a lock that :meth:`claim` takes
    too: once another thread has claimed the client, the former owner's
    settles are queued, and one it was running has finished. So the client
    is never used by two threads at once, whichever thread receives next.
    """

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
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
                fn(*args)
            except DriverError as exc:
                if on_error is not None:
                    on_error(exc)
                elif first is None:
                    first = exc
        if first is not None:
            raise first
