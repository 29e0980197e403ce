from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from hermes.core.model._errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    DriverError,
    NotSupportedError,
    UnknownPriorityError,
)
from hermes.core.model._message import Message
from hermes.core.spi._browse import BrowsePage
from hermes.core.spi._consumer import Consumer
from hermes.core.spi._door import Door
from hermes.core.spi._outgoing import Outgoing

#: The priority of ``send()`` without one, and the one every driver has a queue for.
#: A higher number is a higher priority.
DEFAULT_PRIORITY = 100


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
    #: At-least-once: the consumer sets ``Received.delivery_count`` (1 on the
    #: first delivery, more after each redelivery), so ``max_deliveries`` can
    #: set aside a message that keeps taking its worker down. False: it is
    #: None, and the Worker cannot tell a redelivery from a first delivery.
    counts_deliveries: bool = False
    #: Seconds an idle worker may take to see a message sent to it: about 0 for
    #: a broker that pushes or answers a blocking wait, the poll interval for
    #: one that is polled. The conformance kit holds the driver to it.
    wake_up_s: float = 1.0


ErrorKinds = tuple[type[BaseException], ...]


class Driver(ABC):
    """Broker I/O: put bodies core serialized on a priority's queue, and hand them to a Worker.

    A driver implements only what differs about its broker: :meth:`put`, and
    :meth:`consumer` -- take, acknowledge, release, reject (see
    :class:`~hermes.core.driver.Consumer`). It holds no run state and no
    serializer: the :class:`~hermes.core.Worker` owns the run, and core
    serializes before calling :meth:`put`. Contract of every driver:

    * :meth:`put` is safe to call from many threads at once, and a driver
      created before ``os.fork()`` works in the child without sharing the
      parent's sockets (:class:`~hermes.core.drivertools.PerProcess` holds such
      clients). Bodies the broker did not take raise a :class:`DriverError`;
      none vanishes silently.
    * Broker errors are declared, not mapped by hand: :attr:`refused_errors`
      (credentials, a missing database or vhost, a permission: the worker
      stops with exit 2 and one line), :attr:`unavailable_errors` (the worker
      reconnects with backoff) and :attr:`client_errors` (any other failure).
      Raise the client's exceptions as they come: core translates them at
      every call it makes into the driver (its :class:`~hermes.core.drivertools.Door`)
      and its consumers (the Worker), and around what a ``LeaseKeeper`` or
      ``Handover`` runs, chaining the client's exception as ``__cause__``;
      :meth:`classify_error` decides where one class means two things. Where a
      driver handles a failure itself (logs it and goes on), it catches
      :attr:`broker_errors`; it never translates by hand.
    * A body that is not a Hermes message is logged by core and set aside by
      the consumer (quarantine, dead-letter, or deleted); the run goes on.
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
    #: Client exceptions that mean the broker refused *this* client: wrong
    #: credentials, a database or vhost that does not exist, no permission.
    #: Retrying cannot help: a worker stops with exit 2.
    refused_errors: ErrorKinds = ()
    #: Client exceptions that mean the broker cannot be reached now (refused
    #: connection, timeout, restart): a worker backs off and tries again.
    unavailable_errors: ErrorKinds = ()
    #: Any other exception of the client library: a :class:`DriverError`.
    client_errors: ErrorKinds = ()

    @abstractmethod
    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        """Put ``items`` on the queue of ``priority``, in one broker round trip where it can.

        A driver that holds delayed messages reads ``item.execute_at``; one
        that does not keeps it in the body. Raises :class:`UnknownPriorityError`
        for a priority without a queue, before any I/O.
        """

    @abstractmethod
    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        """A :class:`Consumer` reading ``priorities`` (all queues when empty), highest first.

        Raises :class:`UnknownPriorityError` for a priority without a queue
        (:meth:`check_priorities` does it). Does no broker I/O: the consumer
        connects on its first ``receive``. ``concurrency`` is how many
        messages the worker will have in its handlers at once: a broker that
        limits unacknowledged deliveries (a prefetch) must allow at least that many.
        """

    # What core builds on put() ------------------------------------------------

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        """Serialize ``message`` and put it on the queue of ``priority``.

        A :class:`SerializeError` leaves the broker untouched, and so does a
        message whose serialized bytes exceed ``capabilities.max_message_bytes``:
        a :class:`DeliveryError` naming its size and the limit.
        """
        Door(self).send((message,), priority)

    def send_batch(self, messages: Sequence[Message], priority: int = DEFAULT_PRIORITY) -> None:
        """Serialize every message, then put them all in one :meth:`put`.

        One message over ``max_message_bytes`` refuses the whole batch, before any I/O.
        """
        Door(self).send(messages, priority)

    def send_raw(self, body: bytes, priority: int = DEFAULT_PRIORITY) -> None:
        """Put ``body`` on the broker as it is (the kit's poison, a copy of PHP's bytes).

        Not held to ``max_message_bytes``: the bytes go to :meth:`put` unchecked.
        """
        Door(self).send_raw(body, priority)

    # Errors -----------------------------------------------------------------

    @property
    def broker_errors(self) -> ErrorKinds:
        """Every client exception declared above: what a driver catches where it
        handles a broker failure itself (logs it and goes on) instead of raising it to core."""
        return (*self.refused_errors, *self.unavailable_errors, *self.client_errors)

    def classify_error(self, exc: BaseException) -> type[DriverError] | None:
        """The Hermes error ``exc`` means, or None when it is not the client's.

        By the declared tuples, refused first (a client's authentication error
        is often a subclass of its connection error). Override it where one
        exception class carries several meanings in a code.
        """
        if self.refused_errors and isinstance(exc, self.refused_errors):
            return BrokerRefusedError
        if self.unavailable_errors and isinstance(exc, self.unavailable_errors):
            return BrokerUnavailableError
        if self.client_errors and isinstance(exc, self.client_errors):
            return DriverError
        return None

    # Priorities ---------------------------------------------------------------

    def setup_priority_queue(self, name: str, priority: int) -> None:
        """Add a queue ``name`` that holds messages sent with ``priority``.

        Raises :class:`NotSupportedError` on a driver without priorities.
        """
        raise NotSupportedError(f"{type(self).__name__} has no priority queues")

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

    def close(self) -> None:  # noqa: B027 - most drivers have something to close, not all
        """Release the broker connection. Idempotent."""

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
class SupportsTeardown(Protocol):
    """Optional: delete every queue this driver object addresses, and what they hold.

    The conformance kit calls it to clean up after each test; ``hermes`` never does.
    """

    def teardown(self) -> None: ...


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
    #: Taken by a worker and not yet acknowledged, those its consumer claimed ahead of its
    #: handlers (prefetch) included.
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
class SupportsPurge(Protocol):
    """Optional: delete the messages waiting (ready and scheduled) in priority queues.

    The queues stay, and so do messages in flight (a running handler's) and
    set aside. ``hermes purge`` calls it.
    """

    def purge(self, priority: int | None = None) -> int:
        """Delete what waits in the queue of ``priority`` (every queue: None); how many.

        Raises :class:`UnknownPriorityError` for a priority without a queue.
        """
        ...


@runtime_checkable
class SupportsClaim(Protocol):
    """Optional: an atomic set-if-absent with an expiry, what periodic and unique jobs stand on.

    ``hermes scheduler`` claims each tick of an entry (``tick:<name>@<time>``)
    before it emits it, and ``Emitter.emit(..., unique_for=s)`` claims
    ``unique:<type>:<key>``: only the caller that wins emits, however many
    processes and hosts try at once. The contract, which the conformance kit
    checks on every driver that has the method:

    * Atomic: among any number of concurrent callers (threads, processes,
      hosts) claiming one key that is absent or expired, exactly one gets True.
    * Held: once won, the key is not won again for ``ttl_s`` seconds.
    * Expires: after ``ttl_s`` seconds (plus the broker's expiry precision,
      at most a second) it can be won again.
    * Keys live in the driver's own namespace (its prefix, its queue
      directory), so two applications on one broker do not claim each other's.
    * Thread-safe and fork-safe like :meth:`Driver.put`; broker failures raise
      like it (core translates them). Nothing here
      removes a claim early: a claim is a fact about the past, not a lock.
    """

    def claim(self, key: str, ttl_s: float) -> bool:
        """Claim ``key`` for ``ttl_s`` seconds (> 0); True when this caller won it."""
        ...


@runtime_checkable
class SupportsRecords(Protocol):
    """Optional: keep job records, small JSON documents each under a key, with an expiry.

    What ``--results-url`` names: core (:mod:`hermes.core.app._jobs`) owns the
    records' meaning -- states, attempts, results -- and a store only keeps
    bytes. The contract, which the conformance kit checks on every driver
    that has these methods:

    * :meth:`record_get` returns the bytes last written under ``key``, or
      None when there are none or they expired.
    * :meth:`record_put` is a compare-and-set: it writes ``value`` only when
      the bytes stored now are ``expect`` (None: nothing stored, or expired),
      atomically among any number of processes and hosts, and says whether it
      wrote. A write lost to a concurrent one is never reported as written.
    * A written record expires ``ttl_s`` seconds after that write (plus the
      broker's expiry precision, at most a second).
    * :meth:`record_wait` blocks until the bytes under ``key`` differ from
      ``seen`` or ``timeout_s`` passes, and returns what is stored then. It
      must not poll faster than every 50 ms; a broker that can notify
      (pub/sub, LISTEN/NOTIFY) wakes at once.
    * :meth:`record_scan` lists stored records, at most ``limit``, newest
      first where the broker can tell. ``hermes jobs`` and the dashboard
      page through them with :class:`SupportsRecordPages` where the store
      has it (every store that ships with Hermes does).
    * Keys live in the driver's namespace, like claims. Thread-safe and
      fork-safe like :meth:`Driver.put`; broker failures raise like it.
    """

    def record_get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``; None when there are none (or they expired)."""
        ...

    def record_put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        """Store ``value`` for ``ttl_s`` seconds if ``expect`` is what is stored now."""
        ...

    def record_wait(self, key: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        """What is stored under ``key`` once it differs from ``seen``, or at the timeout."""
        ...

    def record_scan(self, limit: int) -> list[bytes]:
        """Up to ``limit`` stored records, newest first where the broker can tell."""
        ...


@runtime_checkable
class SupportsRecordWatch(Protocol):
    """Optional, beside :class:`SupportsRecords`: wait on several records at once.

    A worker watches the records of the jobs it runs, to hear of a cancel,
    from one thread. Without this method core waits on one of them
    (:meth:`SupportsRecords.record_wait`) and reads the others when it
    returns, so a cancel of another reaches it only at the end of that wait.

    * :meth:`record_wait_any` blocks until the bytes under one of the keys
      of ``seen`` differ from the bytes given for it, or ``timeout_s``
      passes, and returns every key whose bytes differ then, with what is
      stored (None: nothing), or an empty dict. Same polling floor and
      wake-up as :meth:`SupportsRecords.record_wait`.
    """

    def record_wait_any(
        self, seen: Mapping[str, bytes | None], timeout_s: float
    ) -> dict[str, bytes | None]:
        """The keys of ``seen`` whose bytes changed, once one did, or at the timeout."""
        ...


@runtime_checkable
class SupportsRecordPages(Protocol):
    """Optional, beside :class:`SupportsRecords`: list the records a page at a time.

    Records are in the order they were created: a record's place is set by
    the write that stored it when nothing was stored under its key (or what
    was had expired), and later writes to it keep that place.

    * :meth:`record_page` returns a :class:`BrowsePage` whose entries are
      ``(key, bytes)`` of live records, newest first (``oldest_first``:
      oldest first), starting past the record ``after`` names (a page's
      ``next``; None: the start). ``next`` is None on the last page.
    * Stable: following ``next`` from None lists every record that lived all
      along exactly once, whatever is written, created or expires between
      two pages; one created meanwhile is listed on an oldest-first walk
      that has not passed its place, and not on a newest-first one (up to
      the precision of the store's order: Redis orders the records created
      in one millisecond by key).
    * Bounded: a page holds at most ``limit`` entries, fewer once their bytes
      reach ``max_bytes`` (one at least), and reads about as many records as
      it shows: a page may end early (even empty) where it met expired ones,
      with a ``next`` to go on from.
    * ``after`` is opaque text of the store's making; one the store cannot
      read raises :class:`ValueError`. Thread-safe and fork-safe like
      :meth:`Driver.put`; broker failures raise like it.
    """

    def record_page(
        self, after: str | None, limit: int, max_bytes: int, *, oldest_first: bool = False
    ) -> BrowsePage:
        """Up to ``limit`` records past ``after``, newest first unless ``oldest_first``."""
        ...


@runtime_checkable
class SupportsTally(Protocol):
    """Optional: count the members of a set once each, atomically (a workflow's group ends).

    Core counts a group's members here as they end (:mod:`hermes.core.app._workflows`);
    a store without these methods is counted by compare-and-set on a record
    (:class:`SupportsRecords`), which costs a read and a write per member and
    retries when members end at once. The contract, which the conformance kit
    checks on every driver that has these methods:

    * :meth:`tally_add` adds ``member`` with ``value`` to the set under
      ``key`` unless it is there already, atomically among any number of
      processes and hosts, and returns whether this call added it and how many
      members the set holds then. Of concurrent adds, the one that brings the
      set to its last member sees that count (several may).
    * Adding a member that is there changes nothing: its first value stays.
    * :meth:`tally_read` returns every member and its value.
    * A set is kept ``ttl_s`` seconds after its last add (the broker's expiry
      precision, at most a second, aside). Keys live in the driver's
      namespace, like records. Thread-safe and fork-safe like
      :meth:`Driver.put`; broker failures raise like it.
    """

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        """Add ``member`` to ``key``'s set unless there; (added by this call, members now)."""
        ...

    def tally_read(self, key: str) -> dict[str, bytes]:
        """Every member of ``key``'s set and its value (empty: no set)."""
        ...


@runtime_checkable
class SupportsHeartbeats(Protocol):
    """Optional: keep the heartbeat records of running workers, each with an expiry.

    Every running :class:`~hermes.core.Worker` (and scheduler) renews its
    record every few seconds from a thread of its own; ``hermes workers`` and
    the dashboard list them. The contract, which the conformance kit checks
    on every driver that has these methods:

    * :meth:`beat` stores ``record`` under ``record["id"]``, replacing the
      previous one, and the record counts as gone ``ttl_s`` seconds later
      unless beaten again (plus the broker's expiry precision, at most a second).
    * :meth:`heartbeats` lists the live records, as JSON values equal to what
      was beaten; :meth:`forget` removes one at once (a worker that stops).
    * Records live in the driver's namespace (its prefix, its queue
      directory, its table), like claims. Thread-safe and fork-safe like
      :meth:`Driver.put`; broker failures raise like it. A handful of small
      records per worker: nothing here scans messages.
    """

    def beat(self, record: Mapping[str, Any], ttl_s: float) -> None:
        """Store ``record`` (JSON-able, with a str ``"id"``) for ``ttl_s`` seconds (> 0)."""
        ...

    def forget(self, worker_id: str) -> None:
        """Remove the record of ``worker_id``; nothing happens when there is none."""
        ...

    def heartbeats(self) -> list[dict[str, Any]]:
        """Every record not expired, in no particular order."""
        ...
