from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable

from hermes.core._consumer import Consumer, Run, run
from hermes.core._errors import NotSupportedError, UnknownPriorityError
from hermes.core._message import Message
from hermes.core._serializer import MessageSerializer, Serializer
from hermes.core._shutdown import Shutdown

#: The priority of ``send()`` without one, and the one every driver has a queue for.
#: A higher number is a higher priority.
DEFAULT_PRIORITY = 100

#: ``callback(message, priority) -> bool``, what ``Driver.wait`` calls per message.
Callback = Callable[[Message, int], bool]


class Delivery(enum.Enum):
    """When the broker forgets a message, relative to the handler."""

    #: Removed before the callback: a worker that dies mid-handler loses it.
    AT_MOST_ONCE = "at-most-once"
    #: Removed after the callback returns: a worker that dies mid-handler gets it
    #: delivered again (to itself or another worker), so handlers must be idempotent.
    AT_LEAST_ONCE = "at-least-once"


class Delay(enum.Enum):
    """What the driver does with a message whose ``execute_at`` is in the future."""

    #: Holds it until ``execute_at``.
    NATIVE = "native"
    #: Delivers it at once; ``execute_at`` is kept in the message.
    IGNORED = "ignored"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a driver promises. Core, the CLI and the conformance kit all read this.

    The conformance kit tests both branches of every row: a feature that is
    off must show its declared fallback.
    """

    #: When the message leaves the broker relative to the callback.
    delivery: Delivery
    #: Whether ``execute_at`` holds a message back.
    delay: Delay
    #: ``setup_priority_queue`` works and queues are read highest first;
    #: when False it raises :class:`NotSupportedError`.
    priorities: bool
    #: Several workers on one queue never get the same message (barring
    #: at-least-once redelivery after a crash).
    competing_consumers: bool
    #: A message sent in one process can be received in another. Only an
    #: in-process driver (memory) says no; the kit then skips its subprocess tests.
    cross_process: bool = True
    #: The largest serialized message, in bytes, the driver promises to carry.
    max_message_bytes: int = 256 * 1024
    #: At-least-once: seconds after which a message claimed by a dead worker is
    #: handed out again (a visibility timeout, a session timeout, 0 = at once).
    redelivery_timeout_s: float = 0.0


class Driver(ABC):
    """A broker connection that sends messages and hands them to core's worker loop.

    A driver implements only what differs about its broker: :meth:`send`, and
    :meth:`consumer` — take, acknowledge, release, reject (see
    :class:`~hermes.core.Consumer`). :meth:`wait`, PHP Hermes's public method,
    is core's loop and the same for every driver. Contract of every driver:

    * ``send()`` serializes the message before any I/O, so a
      :class:`SerializeError` leaves the broker untouched. It is safe to call
      from many threads at once, and a driver created before ``os.fork()``
      works in the child without sharing the parent's sockets
      (:class:`~hermes.core.PerProcess` holds such clients). A message the
      broker did not take raises a :class:`DriverError` subclass; it never
      vanishes silently.
    * ``wait()`` blocks, calling ``callback(message, priority)`` for each
      message, until shutdown or max items; it checks both before every
      receive, and no receive blocks longer than about a second. Queues are
      read from the highest priority down; ``priorities`` restricts the
      worker to those, and one without a queue raises
      :class:`UnknownPriorityError`.
    * A body that is not a Hermes message is logged with the reason and set
      aside by the consumer (quarantine, dead-letter, or deleted); the loop goes on.
    * An exception escaping ``callback`` releases that message and propagates
      out of ``wait()``: an at-least-once driver delivers it again.
    * Broker failures are translated at the boundary
      (:func:`~hermes.core.translate_errors`): :class:`BrokerUnavailableError`
      makes the loop reconnect with backoff, any other :class:`DriverError`
      is raised out of ``wait()``.
    * ``setup_priority_queue(name, priority)`` adds, on this driver object, a
      queue for ``priority`` named ``name`` *within the driver's namespace*:
      the broker's own name is the driver's prefix followed by ``name`` (Redis:
      ``prefix + name``, so with no prefix ``name`` is PHP's key; RabbitMQ, SQS
      and Kafka: ``<queue>.<name>``), and drivers whose layout files a message
      by its priority alone (filesystem, memory) only record that the priority
      exists. It is not stored on the broker: every process that sends or
      reads a priority sets it up alike (the CLI's ``--priority`` does).
    """

    #: What this driver promises; instances may narrow it from their options.
    capabilities: Capabilities

    def __init__(self) -> None:
        self.serializer: Serializer = MessageSerializer()
        self.shutdown: Shutdown | None = None
        self.max_process_items = 0
        #: Messages acknowledged after their callback, over every run of this driver.
        self.processed_items = 0
        #: When this worker started: set at creation and again by ``Dispatcher.handle()``.
        #: A shutdown request older than it is ignored.
        self.start_time = time.time()

    @abstractmethod
    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        """Put ``message`` on the queue of ``priority``; see the class contract."""

    @abstractmethod
    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        """A :class:`Consumer` reading ``priorities`` (all queues when empty), highest first.

        Raises :class:`UnknownPriorityError` for a priority without a queue
        (:meth:`check_priorities` does it). Does no broker I/O: the consumer
        connects on its first ``receive``. ``concurrency`` is how many
        messages the worker will have in its handlers at once: a broker that
        limits unacknowledged deliveries (a prefetch) must allow at least that many.
        """

    def wait(
        self,
        callback: Callback,
        priorities: Sequence[int] = (),
        *,
        concurrency: int = 1,
        grace_s: float = 30.0,
    ) -> None:
        """Call ``callback`` for each message until stopped; see the class contract.

        Each call is a run of its own: max items counts from 0 again.
        ``concurrency`` > 1 runs the callbacks on that many threads; each
        message is still acknowledged only after its own callback returns. On
        a stop, callbacks in flight get ``grace_s`` seconds to finish.
        """
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        stopper = Run(self.max_process_items, self.shutdown, self.start_time)
        with self.consumer(priorities, concurrency=concurrency) as consumer:
            run(self, callback, consumer, stopper, concurrency, grace_s)

    def setup_priority_queue(self, name: str, priority: int) -> None:
        """Add a queue ``name`` that holds messages sent with ``priority``.

        Raises :class:`NotSupportedError` on a driver without priorities.
        """
        raise NotSupportedError(f"{type(self).__name__} has no priority queues")

    def close(self) -> None:  # noqa: B027 - most drivers have something to close, not all
        """Release the broker connection. Idempotent."""

    def set_max_process_items(self, count: int) -> None:
        """Make ``wait()`` return after ``count`` messages (0 = never)."""
        if count < 0:
            raise ValueError(f"max process items must be >= 0, got {count}")
        self.max_process_items = count

    def set_shutdown(self, shutdown: Shutdown | None) -> None:
        """Make ``wait()`` return once ``shutdown.should_shutdown(start_time)`` is true."""
        self.shutdown = shutdown

    def set_serializer(self, serializer: Serializer) -> None:
        self.serializer = serializer

    # Helpers for implementations -------------------------------------------

    def unknown_priority(
        self,
        priority: int,
        known: Iterable[int],
        hint: str = "add one with setup_priority_queue()",
    ) -> UnknownPriorityError:
        """The error for a ``priority`` without a queue: this driver, the known ones, a hint."""
        return UnknownPriorityError(
            f"{self!r} has no queue for priority {priority}; "
            f"known priorities: {sorted(known, reverse=True)}; {hint}",
            priority,
        )

    def check_priorities(self, known: Iterable[int], wanted: Sequence[int]) -> list[int]:
        """The priorities to read, highest first: ``wanted`` (validated) or all ``known``."""
        known = set(known)
        for priority in wanted:
            if priority not in known:
                raise self.unknown_priority(priority, known)
        return sorted(set(wanted) if wanted else known, reverse=True)

    def __enter__(self) -> Driver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


@runtime_checkable
class SupportsRawSend(Protocol):
    """Optional: put bytes on the broker as they are, without serializing.

    The conformance kit uses it to put poison messages where a worker will find them.
    """

    def send_raw(self, body: bytes, priority: int = DEFAULT_PRIORITY) -> None: ...


@runtime_checkable
class SupportsBatchSend(Protocol):
    """Optional: send many messages in one broker round trip where the broker allows."""

    def send_batch(self, messages: Sequence[Message], priority: int = DEFAULT_PRIORITY) -> None: ...


@runtime_checkable
class SupportsPurge(Protocol):
    """Optional: delete every message and every queue this driver object addresses.

    The conformance kit calls it to clean up after each test.
    """

    def purge(self) -> None: ...


@dataclass(frozen=True, slots=True)
class QueueStats:
    """What one priority queue holds, as far as the broker can say cheaply.

    A count the broker cannot give is None ("unknown"), never 0.
    """

    priority: int
    #: The broker's name for the queue (a key, a queue, a topic, a directory).
    name: str
    #: Waiting and due: the next worker takes these.
    ready: int | None = None
    #: Held back until their ``execute_at``.
    scheduled: int | None = None
    #: Taken by a worker and not yet acknowledged.
    in_flight: int | None = None
    #: Quarantined or dead-lettered: not Hermes messages, or given up on by the broker.
    set_aside: int | None = None


@runtime_checkable
class SupportsStats(Protocol):
    """Optional: count what each priority queue holds (``hermes stats`` reads it).

    Cheap broker calls only (a set's size, a queue's message count, a
    directory listing); never reads the messages' bodies one by one.
    """

    def queue_stats(self) -> list[QueueStats]:
        """One row per priority queue this driver object knows, highest priority first."""
        ...


@runtime_checkable
class SupportsClear(Protocol):
    """Optional: delete the messages waiting (ready and scheduled) in priority queues.

    Unlike :meth:`SupportsPurge.purge`, the queues stay, and so do messages
    in flight and set aside. ``hermes purge`` calls it.
    """

    def clear(self, priority: int | None = None) -> int:
        """Delete what waits in the queue of ``priority`` (every queue: None); how many.

        Raises :class:`UnknownPriorityError` for a priority without a queue.
        """
        ...
