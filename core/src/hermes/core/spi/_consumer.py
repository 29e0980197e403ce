"""The consumer contract a driver implements for core's :class:`~hermes.core.Worker`.

A driver does not write a loop. It hands the Worker a :class:`Consumer` --
one run's hold on the broker -- whose :meth:`~Consumer.receive` returns one
:class:`Received` body at a time; the Worker unserializes it, calls the
handlers, and settles it with exactly one of :meth:`~Consumer.ack`,
:meth:`~Consumer.release` or :meth:`~Consumer.reject`.
"""

from __future__ import annotations

import contextvars
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from hermes.core.model._errors import SerializeError
from hermes.core.model._message import Message
from hermes.core.model._serializer import MessageSerializer

_serializer = MessageSerializer()

#: Turns a body a consumer took into a :class:`Message`; raises :class:`SerializeError`.
decode = _serializer.unserialize

_current: contextvars.ContextVar[Received | None] = contextvars.ContextVar(
    "hermes_current_received", default=None
)


def current_received() -> Received | None:
    """The :class:`Received` whose callback runs on this thread, else None.

    A driver exposes broker facts to handlers through it (SQS: the receive
    count, as ``current_delivery()``), whichever handler thread runs them.
    """
    return _current.get()


def set_current(received: Received) -> Callable[[], None]:
    """Make ``received`` this thread's :func:`current_received`; call the result to undo it."""
    token = _current.set(received)
    return lambda: _current.reset(token)


#: The longest a consumer's ``receive`` may block: the worker checks shutdown and
#: max items at least this often, so a stop request is seen within about a second.
IDLE_WAIT_S = 1.0

#: How often the worker calls :meth:`Consumer.service` while every handler thread
#: runs a handler: well inside any heartbeat timeout a broker sensibly asks for.
SERVICE_INTERVAL_S = 0.25


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
    #: The body unserialized: set by core, or earlier by :meth:`decoded`.
    message: Message | None = None
    #: Where it came from, for log lines about it (``new/<file>``, ``queue jobs tag 7``);
    #: empty: its priority's queue.
    origin: str = ""
    #: How many times the broker has handed this body out, this time included,
    #: where the broker counts (SQS's receive count); None where it does not.
    delivery_count: int | None = None

    def decoded(self) -> Message | None:
        """The message, unserialized once for the consumer and core alike; None if poison.

        A consumer that must look inside before handing a body over (to hold
        it until its ``execute_at``) calls this instead of unserializing: core
        then reuses the result. A poison body returns None and is handed over
        as it is, for core to log and reject.
        """
        if self.message is None:
            try:
                self.message = decode(self.body)
            except SerializeError:
                return None
        return self.message


class Consumer(ABC):
    """One run of a worker's hold on the broker: take, acknowledge, release, reject.

    What a driver implements instead of a loop. The :class:`~hermes.core.Worker`
    calls :meth:`receive` until it stops and settles every :class:`Received`
    with at most one of :meth:`ack`, :meth:`release` or :meth:`reject`, then
    calls :meth:`close` once; nothing is settled after :meth:`close`. Contract:

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
    * :meth:`receive` is called by one thread at a time, but not always the
      same one: a worker that runs several handlers at once gives the
      consumer to whichever of its threads is free (the one that received
      last may still be running a handler). A client bound to one thread
      does not fit; one that is merely not thread-safe is fine, since no two
      receives overlap. :meth:`close` comes after the last receive returned.
    * :meth:`ack`, :meth:`release` and :meth:`reject` may be called from
      another thread than the one that received the message, and while
      another thread receives; a client that is not thread-safe hands the
      call to the thread that receives now
      (:class:`~hermes.core.drivertools.Handover`). They raise :class:`BrokerUnavailableError` when
      the broker is gone; core logs it and goes on (an at-least-once broker
      delivers the message again). Core translates around every call:
      raising the client's own exceptions is fine.
    * A message whose handler still runs when the worker's grace period ends
      is left unsettled when :meth:`close` is called: close must not hand it
      to another worker (no release of what is held); the broker's own
      timeout (a lease, a visibility timeout, a session) delivers it again
      once this worker is gone.
    * Nothing is taken far ahead of the handlers: a consumer that prefetches
      keeps its buffer small and gives it back in :meth:`close`.
    * A client that keeps its connection alive only while it is called
      (heartbeats answered from inside its calls, as pika does) overrides
      :meth:`service`: while no thread receives -- every handler thread is in
      a handler -- the worker calls it every :data:`SERVICE_INTERVAL_S` from a
      thread of its own, which takes the consumer as a receiving thread does.
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

    def service(self) -> None:  # noqa: B027 - most clients need no calls between receives
        """Keep the connection alive while the handlers run; return without waiting.

        Do what is due -- answer or send a heartbeat, read what the broker
        sent, send the settles other threads queued -- and return at once.
        Called only by a consumer that overrides it, from one thread at a
        time and never while another receives, as :meth:`receive` is; never
        before the first receive nor after :meth:`close`. A lost connection
        raises as :meth:`receive` would: core logs it once and goes on, and
        the next :meth:`receive` connects again.
        """

    def close(self) -> None:  # noqa: B027 - many consumers hold nothing of their own
        """End the run: give back what was prefetched and never handed out, leave groups,
        release connections. What is still held (a handler outlived the grace
        period) is not given back: the broker's timeout decides."""

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
