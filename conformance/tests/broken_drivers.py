"""Deliberately broken drivers: the conformance kit must fail every one of them.

Loaded into the kit's runs with ``--hermes-plugin broken_drivers``; each has
exactly one bug, named by its URL scheme.

* ``<bug>://NAME``: a :class:`MemoryDriver` subclass (in-process).
* ``<bug>+<inner URL>``: a wrapper around any installed driver that injects
  the bug at the Driver interface. Over ``file://`` it reaches the kit's
  worker-process tests, which an in-process driver cannot take.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import select
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hermes.core import (
    DEFAULT_PRIORITY,
    BrokerUnavailableError,
    DriverError,
    Message,
    SerializeError,
    connect,
    hookimpl,
)
from hermes.core.driver import (
    Consumer,
    Delay,
    Delivery,
    Driver,
    DriverPlugin,
    DriverUrl,
    Outgoing,
    QueueStats,
    Received,
    SupportsTeardown,
)
from hermes.core.drivertools import MessageSerializer, isolated_url, outgoing
from hermes.core.spi._memory import MemoryDriver


class _Relay(Consumer):
    """Passes every call on to ``inner``; subclasses break one thing."""

    def __init__(self, inner: Consumer) -> None:
        self.inner = inner

    def receive(self, timeout_s: float) -> Received | None:
        return self.inner.receive(timeout_s)

    def ack(self, received: Received) -> None:
        self.inner.ack(received)

    def release(self, received: Received) -> None:
        self.inner.release(received)

    def reject(self, received: Received, reason: str) -> None:
        self.inner.reject(received, reason)

    def close(self) -> None:
        self.inner.close()


# Memory subclasses ---------------------------------------------------------------


class _BrokenMemory(MemoryDriver):
    #: The URL scheme, which names the bug.
    scheme = ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.scheme}://{self.name}>"


class IgnoresExecuteAt(_BrokenMemory):
    """Delivers at once while declaring delay=NATIVE."""

    scheme = "ignores-delay"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        super().put([replace(item, execute_at=None) for item in items], priority)


class ReadsInRegistrationOrder(_BrokenMemory):
    """Reads priority queues in the order they were set up, not highest first."""

    scheme = "registration-order"

    def check_priorities(self, known: Any, wanted: Sequence[int]) -> list[int]:
        super().check_priorities(known, wanted)
        return list(wanted) if wanted else list(known)


class IgnoresRestriction(_BrokenMemory):
    """A worker restricted to some priorities reads every queue anyway."""

    scheme = "ignores-restriction"

    def check_priorities(self, known: Any, wanted: Sequence[int]) -> list[int]:
        return super().check_priorities(known, ())


class AcceptsUnknownPriority(_BrokenMemory):
    """Puts a message for a priority without a queue on the default queue."""

    scheme = "accepts-unknown-priority"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        if priority not in self._broker.queues:
            priority = DEFAULT_PRIORITY
        super().put(items, priority)


class DeclaresNoPriorities(_BrokenMemory):
    """Declares priorities=False but sets priority queues up without complaint."""

    scheme = "claims-no-priorities"
    capabilities = replace(MemoryDriver.capabilities, priorities=False)


class DeclaresIgnoredDelay(_BrokenMemory):
    """Declares delay=IGNORED but holds delayed messages back."""

    scheme = "claims-ignored-delay"
    capabilities = replace(MemoryDriver.capabilities, delay=Delay.IGNORED)


class _HeadOfLine(_Relay):
    """Holds the first body not yet due, and everything behind it, until it is due."""

    def __init__(self, inner: Consumer) -> None:
        super().__init__(inner)
        self.head: Received | None = None

    def receive(self, timeout_s: float) -> Received | None:
        if self.head is None:
            self.head = self.inner.receive(timeout_s)
            if self.head is None:
                return None
        message = self.head.decoded()
        due = message.execute_at if message is not None else None
        if due is not None and due > time.time():
            left = due - time.time()
            time.sleep(min(left, timeout_s))
            return None
        received, self.head = self.head, None
        return received

    def close(self) -> None:
        if self.head is not None:
            self.inner.release(self.head)
            self.head = None
        self.inner.close()


class WaitsBehindTheHead(_BrokenMemory):
    """Keeps delayed messages in line: one due later holds up every message behind it."""

    scheme = "head-of-line"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        super().put([replace(item, execute_at=None) for item in items], priority)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _HeadOfLine(super().consumer(priorities, concurrency=concurrency))


_twice_lock = threading.Lock()
_waiting: dict[str, set[int]] = {}
_handed_twice: set[str] = set()


class _AndToAnother(_Relay):
    def __init__(self, driver: HandsOneMessageToTwoConsumers, inner: Consumer) -> None:
        super().__init__(inner)
        self.driver = driver
        self.waiting = _waiting.setdefault(driver.name, set())
        with _twice_lock:
            self.waiting.add(id(self))

    def ack(self, received: Received) -> None:
        super().ack(received)
        message_id = received.message.id if received.message is not None else ""
        with _twice_lock:
            again = len(self.waiting) > 1 and message_id not in _handed_twice
            _handed_twice.add(message_id)
        if again:
            self.driver.put([Outgoing(bytes(_as_bytes(received.body)))], received.priority)

    def close(self) -> None:
        with _twice_lock:
            self.waiting.discard(id(self))
        super().close()


def _as_bytes(body: str | bytes) -> bytes:
    return body.encode() if isinstance(body, str) else body


class HandsOneMessageToTwoConsumers(_BrokenMemory):
    """While another consumer waits on the queue, gives it a copy of each handled message."""

    scheme = "two-consumers"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _AndToAnother(self, super().consumer(priorities, concurrency=concurrency))


_redelivered: set[str] = set()


class _ForgetsAcks(_Relay):
    def __init__(self, driver: Driver, inner: Consumer) -> None:
        super().__init__(inner)
        self.driver = driver

    def ack(self, received: Received) -> None:
        super().ack(received)
        message_id = received.message.id if received.message is not None else ""
        if message_id not in _redelivered:
            _redelivered.add(message_id)
            self.driver.put([Outgoing(_as_bytes(received.body))], received.priority)


class ForgetsAcks(_BrokenMemory):
    """Puts a handled message back on its queue once (an ack that never reached the broker)."""

    scheme = "forgets-acks"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _ForgetsAcks(self, super().consumer(priorities, concurrency=concurrency))


class _CountsEveryDeliveryAsTheFirst(_Relay):
    def receive(self, timeout_s: float) -> Received | None:
        received = super().receive(timeout_s)
        if received is not None:
            received.delivery_count = 1
        return received


class CountsEveryDeliveryAsTheFirst(_BrokenMemory):
    """Declares that it counts deliveries, and says 1 however often a message came back."""

    scheme = "first-delivery-always"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _CountsEveryDeliveryAsTheFirst(super().consumer(priorities, concurrency=concurrency))


class CountsUnknownAsZero(_BrokenMemory):
    """Says 0 in flight, whatever the workers hold: an unknown count shown as 0."""

    scheme = "zero-in-flight"

    def queue_stats(self) -> list[QueueStats]:
        return [replace(row, in_flight=0) for row in super().queue_stats()]


class DropsRetries(_BrokenMemory):
    """Loses the ``retries`` field on the way to the broker."""

    scheme = "drops-retries"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        super().put([_without_retries(item) for item in items], priority)


def _without_retries(item: Outgoing) -> Outgoing:
    serializer = MessageSerializer()
    try:
        message = serializer.unserialize(item.body)
    except SerializeError:
        return item  # the kit's poison: nothing to lose
    return replace(item, body=serializer.serialize(message.replace(retries=0)).encode())


class DropsHeaders(_BrokenMemory):
    """Keeps the message but not its headers: a driver that rebuilds the envelope itself."""

    scheme = "drops-headers"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        super().put([_without_headers(item) for item in items], priority)


def _without_headers(item: Outgoing) -> Outgoing:
    serializer = MessageSerializer()
    try:
        message = serializer.unserialize(item.body)
    except SerializeError:
        return item  # the kit's poison: nothing to lose
    return replace(item, body=serializer.serialize(message.replace(headers={})).encode())


def _message_id(body: str | bytes) -> str:
    """The id a log line names: read straight from the JSON, with no thought for poison."""
    try:
        document = json.loads(body)
    except ValueError:
        document = {}
    return str(document["message"]["id"])


class _ReadsIds(_Relay):
    def receive(self, timeout_s: float) -> Received | None:
        received = self.inner.receive(timeout_s)
        if received is not None:
            logging.getLogger("broken_drivers").debug("took #%s", _message_id(received.body))
        return received


class CrashesOnPoison(_BrokenMemory):
    """Reads each body's id for a log line: a body that is not a message raises out of receive."""

    scheme = "crashes-on-poison"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _ReadsIds(super().consumer(priorities, concurrency=concurrency))


class TruncatesLargeBodies(_BrokenMemory):
    """Cuts bodies at 64 KiB while declaring 16 MiB."""

    scheme = "truncates-large"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        super().put([replace(item, body=item.body[: 64 * 1024]) for item in items], priority)


class WritesBeforeSerializing(_BrokenMemory):
    """Defines its own ``send``, against the contract: puts a best-effort body on the
    broker, then finds out the payload cannot be encoded."""

    scheme = "writes-before-serializing"

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        body = {
            "message": {
                "id": message.id,
                "type": message.type,
                "created": message.created,
                "payload": message.payload,
                "execute_at": message.execute_at,
                "retries": message.retries,
            }
        }
        self.put([Outgoing(json.dumps(body, default=repr).encode(), message.execute_at)], priority)
        outgoing(message)


class ThreadUnsafeSend(_BrokenMemory):
    """``put()`` updates the queue without a lock, like an unguarded client connection."""

    scheme = "thread-unsafe"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        queue = self._broker.queues[priority]
        bodies = list(queue)
        time.sleep(0.0005)  # another thread's put() lands here and is overwritten
        bodies.extend(item.body for item in items)
        queue.clear()
        queue.extend(bodies)
        with self._broker.condition:
            self._broker.condition.notify_all()


class SharesItsConnectionAcrossFork(_BrokenMemory):
    """Keeps using the connection the parent opened: fails in a forked child."""

    scheme = "fork-unsafe"

    def __init__(self, name: str = "default") -> None:
        super().__init__(name)
        self._owner = os.getpid()

    def _connection(self) -> None:
        if os.getpid() != self._owner:
            raise BrokerUnavailableError(
                f"{self!r}: the connection belongs to process {self._owner}, not {os.getpid()}"
            )

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        self._connection()
        super().put(items, priority)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        self._connection()
        return super().consumer(priorities, concurrency=concurrency)


class CapsDelays(_BrokenMemory):
    """Holds a delayed message at most 10 s (times the kit's time scale), however far its
    execute_at: what the kit's few-second delays cannot see."""

    scheme = "caps-delay"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        scale = float(os.environ.get("HERMES_KIT_TIME_SCALE") or 1.0)
        cap = time.time() + 10.0 * scale
        super().put(
            [
                replace(item, execute_at=min(item.execute_at, cap))
                if item.execute_at is not None
                else item
                for item in items
            ],
            priority,
        )


class StretchesDelays(_BrokenMemory):
    """Holds a delayed message twice as long as its execute_at asks."""

    scheme = "stretches-delay"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        now = time.time()
        super().put(
            [
                replace(item, execute_at=now + 2 * (item.execute_at - now))
                if item.execute_at is not None and item.execute_at > now
                else item
                for item in items
            ],
            priority,
        )


class _StaleView(Consumer):
    """Takes everything waiting when its view is empty, and hands that out first."""

    def __init__(self, inner: Consumer) -> None:
        self.inner = inner
        self.view: deque[Received] = deque()

    def receive(self, timeout_s: float) -> Received | None:
        if not self.view:
            first = self.inner.receive(timeout_s)
            if first is None:
                return None
            self.view.append(first)
            while (more := self.inner.receive(0)) is not None:
                self.view.append(more)
        return self.view.popleft()

    def ack(self, received: Received) -> None:
        self.inner.ack(received)

    def release(self, received: Received) -> None:
        self.inner.release(received)

    def reject(self, received: Received, reason: str) -> None:
        self.inner.reject(received, reason)

    def close(self) -> None:
        while self.view:  # the last taken goes back first: the queue keeps its order
            self.inner.release(self.view.pop())
        self.inner.close()


class ReadsAStaleView(_BrokenMemory):
    """Lists the queues only when it has handed out everything it listed last time."""

    scheme = "stale-view"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _StaleView(super().consumer(priorities, concurrency=concurrency))


#: memory name -> the idle consumer that new messages are pushed to.
_subscribers: dict[str, _Pushed] = {}


class _Pushed(Consumer):
    """Pulls while messages wait; once idle, subscribes, and takes arrivals in arrival order."""

    def __init__(self, driver: PushesInArrivalOrder, inner: Consumer) -> None:
        self.driver = driver
        self.inner = inner
        self.broker = driver._broker
        #: Pushed to this consumer, not yet handed out: in arrival order.
        self.inbox: deque[Received] = deque()
        #: Pushed and handed out, not yet settled.
        self.out: set[Received] = set()

    def receive(self, timeout_s: float) -> Received | None:
        with self.broker.condition:
            if self.inbox:
                return self._hand_out()
        received = self.inner.receive(0)
        if received is not None:
            return received
        with self.broker.condition:
            _subscribers[self.driver.name] = self
            self.broker.condition.wait_for(lambda: self.inbox, timeout_s)
            return self._hand_out() if self.inbox else None

    def _hand_out(self) -> Received:
        received = self.inbox.popleft()
        self.out.add(received)
        return received

    def ack(self, received: Received) -> None:
        with self.broker.condition:
            if received not in self.out:
                self.inner.ack(received)
                return
            self.out.discard(received)
            self.broker.in_flight[received.priority] -= 1

    def release(self, received: Received) -> None:
        with self.broker.condition:
            if received not in self.out:
                self.inner.release(received)
                return
            self.out.discard(received)
            self.broker.in_flight[received.priority] -= 1
            self.broker.queues[received.priority].appendleft(received.body)
            self.broker.condition.notify_all()

    def reject(self, received: Received, reason: str) -> None:
        self.ack(received)

    def close(self) -> None:
        with self.broker.condition:
            if _subscribers.get(self.driver.name) is self:
                del _subscribers[self.driver.name]
            pushed = list(self.inbox)
            self.inbox.clear()
            self.out.update(pushed)
        for received in reversed(pushed):
            self.release(received)
        self.inner.close()


class PushesInArrivalOrder(_BrokenMemory):
    """Once a worker idles, pushes it every new message as it arrives; it hands them out
    in arrival order, whatever their priority."""

    scheme = "push-in-arrival-order"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        broker = self._broker
        with broker.condition:
            subscriber = _subscribers.get(self.name)
            if subscriber is not None and priority in broker.queues:
                now = time.time()
                due = [item for item in items if item.execute_at is None or item.execute_at <= now]
                for item in due:
                    subscriber.inbox.append(Received(item.body, priority))
                    broker.in_flight[priority] += 1
                broker.condition.notify_all()
                items = [item for item in items if item not in due]
        if items:
            super().put(items, priority)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _Pushed(self, super().consumer(priorities, concurrency=concurrency))


class ReadsEveryQueueForAnUnknownPriority(_BrokenMemory):
    """``handle(priorities=[P])`` with no queue for P reads every queue instead of raising."""

    scheme = "unknown-restriction"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        known = [p for p in priorities if p in self._broker.queues]
        return super().consumer(known, concurrency=concurrency)


class _LosesPrefetch(_Relay):
    """Takes everything waiting ahead of the handlers; close() drops what it never handed out."""

    def __init__(self, inner: Consumer) -> None:
        super().__init__(inner)
        self.ahead: deque[Received] = deque()

    def receive(self, timeout_s: float) -> Received | None:
        if not self.ahead:
            first = self.inner.receive(timeout_s)
            if first is None:
                return None
            self.ahead.append(first)
            while (more := self.inner.receive(0)) is not None:
                self.ahead.append(more)
        return self.ahead.popleft()

    def close(self) -> None:
        while self.ahead:  # acknowledged, not given back: the prefetch is lost
            self.inner.ack(self.ahead.popleft())
        self.inner.close()


class LosesItsPrefetchOnClose(_BrokenMemory):
    """Prefetches every waiting message; a worker that stops deletes those it never started."""

    scheme = "loses-prefetch"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _LosesPrefetch(super().consumer(priorities, concurrency=concurrency))


_used: set[str] = set()


class HangsInClose(_BrokenMemory):
    """Once it has sent, ``close()`` waits for a flush that never ends."""

    scheme = "hangs-close"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        super().put(items, priority)
        _used.add(f"close {id(self)}")

    def close(self) -> None:
        if f"close {id(self)}" in _used:
            threading.Event().wait()


class HangsInTeardown(_BrokenMemory):
    """Once messages were sent on its queues, ``teardown()`` waits for a reply that never comes."""

    scheme = "hangs-teardown"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        super().put(items, priority)
        _used.add(f"teardown {self.name}")

    def teardown(self) -> None:
        if f"teardown {self.name}" in _used:
            threading.Event().wait()
        super().teardown()


_MEMORY_VARIANTS: list[type[_BrokenMemory]] = [
    IgnoresExecuteAt,
    ReadsInRegistrationOrder,
    IgnoresRestriction,
    AcceptsUnknownPriority,
    DeclaresNoPriorities,
    DeclaresIgnoredDelay,
    WaitsBehindTheHead,
    HandsOneMessageToTwoConsumers,
    ForgetsAcks,
    CountsEveryDeliveryAsTheFirst,
    DropsRetries,
    DropsHeaders,
    CountsUnknownAsZero,
    CrashesOnPoison,
    TruncatesLargeBodies,
    WritesBeforeSerializing,
    ThreadUnsafeSend,
    SharesItsConnectionAcrossFork,
    CapsDelays,
    StretchesDelays,
    ReadsAStaleView,
    PushesInArrivalOrder,
    ReadsEveryQueueForAnUnknownPriority,
    LosesItsPrefetchOnClose,
    HangsInClose,
    HangsInTeardown,
]


# Wrappers around any driver ------------------------------------------------------


class _Wrapper(Driver):
    """Delegates everything to ``inner``; subclasses break one thing."""

    bug = ""

    def __init__(self, inner: Driver) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities

    @classmethod
    def build(cls, inner: Driver, url: str) -> _Wrapper:
        return cls(inner)

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        self.inner.put(items, priority)

    def setup_priority_queue(self, name: str, priority: int) -> None:
        self.inner.setup_priority_queue(name, priority)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return self.inner.consumer(priorities, concurrency=concurrency)

    def classify_error(self, exc: BaseException) -> type[DriverError] | None:
        return self.inner.classify_error(exc)

    def teardown(self) -> None:
        if isinstance(self.inner, SupportsTeardown):
            self.inner.teardown()

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.bug}+{self.inner!r}>"


class _AcksOnReceive(_Relay):
    def receive(self, timeout_s: float) -> Received | None:
        received = self.inner.receive(timeout_s)
        if received is not None:
            self.inner.ack(received)  # before any handler has run
        return received

    def ack(self, received: Received) -> None:
        """Acknowledged already, when it was taken."""

    def release(self, received: Received) -> None:
        """Nothing to give back: it was acknowledged when it was taken."""

    def reject(self, received: Received, reason: str) -> None:
        """Acknowledged already, when it was taken."""


class AcksWhenTaken(_Wrapper):
    """Its consumer acknowledges each message as it takes it, before the handler runs."""

    bug = "ack-on-receive"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _AcksOnReceive(self.inner.consumer(priorities, concurrency=concurrency))


class _ReleaseAcks(_Relay):
    def release(self, received: Received) -> None:
        self.inner.ack(received)


class ReleaseDeletes(_Wrapper):
    """Its ``release()`` acknowledges: a message whose handler raised is gone."""

    bug = "release-acks"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _ReleaseAcks(self.inner.consumer(priorities, concurrency=concurrency))


class DeclaresAtMostOnce(_Wrapper):
    """Declares AT_MOST_ONCE over a driver that delivers again."""

    bug = "claims-at-most-once"

    def __init__(self, inner: Driver) -> None:
        super().__init__(inner)
        self.capabilities = replace(inner.capabilities, delivery=Delivery.AT_MOST_ONCE)


class _SleepsLong(_Relay):
    def receive(self, timeout_s: float) -> Received | None:
        return self.inner.receive(max(timeout_s, 5.0))


class DropsWhatItTookAhead(_Wrapper):
    """Takes every waiting message ahead of the handlers, on any driver; a worker that
    stops (max items reached) deletes those it never started."""

    bug = "drops-ahead"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _LosesPrefetch(self.inner.consumer(priorities, concurrency=concurrency))


class SlowShutdown(_Wrapper):
    """Its idle receive waits 5 s, whatever the worker asks: a shutdown is noticed late."""

    bug = "slow-shutdown"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _SleepsLong(self.inner.consumer(priorities, concurrency=concurrency))


def _first_time(key: str, message_id: str) -> bool:
    """True once per (key, message id), across processes."""
    base = os.environ.get("BROKEN_DRIVERS_DIR") or tempfile.gettempdir()
    directory = os.path.join(base, "hermes-kit-fan-out", key)
    os.makedirs(directory, exist_ok=True)
    try:
        os.close(os.open(os.path.join(directory, message_id), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


class _AndAgain(_Relay):
    def __init__(self, driver: DeliversEachMessageTwice, inner: Consumer) -> None:
        super().__init__(inner)
        self.driver = driver

    def ack(self, received: Received) -> None:
        super().ack(received)
        message_id = received.message.id if received.message is not None else ""
        if _first_time(self.driver.key, message_id):
            self.driver.inner.put([Outgoing(_as_bytes(received.body))], received.priority)


class DeliversEachMessageTwice(_Wrapper):
    """After a message is handled, puts a copy back for the next consumer to take."""

    bug = "fan-out"

    def __init__(self, inner: Driver, url: str) -> None:
        super().__init__(inner)
        self.key = hashlib.sha1(url.encode()).hexdigest()[:16]

    @classmethod
    def build(cls, inner: Driver, url: str) -> _Wrapper:
        return cls(inner, url)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _AndAgain(self, self.inner.consumer(priorities, concurrency=concurrency))


class SharesItsSocketAcrossFork(_Wrapper):
    """Opens its connection once; forked children use the parent's, and confirms go astray.

    Every ``put()`` waits for the broker's confirm on the connection. One
    process at a time gets its own confirm back; when forked children and the
    parent send at once, a process may read another's confirm and report a
    timeout, although its message was stored.
    """

    bug = "shared-socket"

    def __init__(self, inner: Driver) -> None:
        super().__init__(inner)
        self._socket: tuple[int, int] | None = None
        self._lock = threading.Lock()  # guards the connection within a process
        self._lock_pid = os.getpid()

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        self.inner.put(items, priority)
        if self._socket is None:
            self._socket = os.pipe()
        if self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        read_fd, write_fd = self._socket
        mine = os.getpid().to_bytes(8, "big")
        with self._lock:
            os.write(write_fd, mine)  # the broker's confirm comes back on the stream ...
            time.sleep(0.002)  # ... one round trip later
            ready, _, _ = select.select([read_fd], [], [], 1.0)
            confirm = os.read(read_fd, 8) if ready else b""
        if confirm != mine:
            ids = ", ".join(f"#{item.message_id}" for item in items)
            raise BrokerUnavailableError(
                f"{self!r}: no confirm for message {ids} within 1 s "
                "(it went to another process on the same connection)"
            )


class RecoversOnlyAtStart(_Wrapper):
    """Declares its inner driver's redelivery timeout, yet recovers a dead worker's
    messages only when a consumer starts (over file://: a recovery interval of an hour).
    A worker already running never gets them."""

    bug = "recovers-at-start"

    @classmethod
    def build(cls, inner: Driver, url: str) -> _Wrapper:
        declared = inner.capabilities
        inner.close()
        separator = "&" if "?" in url else "?"
        wrapper = cls(connect(f"{url}{separator}recovery_interval_s=3600"))
        wrapper.capabilities = declared
        return wrapper


#: (driver repr, body) -> deliveries this process saw: gone when the process dies.
_counted_here: Counter[tuple[str, str | bytes]] = Counter()


class _CountsInProcess(_Relay):
    def __init__(self, inner: Consumer, key: str) -> None:
        super().__init__(inner)
        self.key = key

    def receive(self, timeout_s: float) -> Received | None:
        received = self.inner.receive(timeout_s)
        if received is not None:
            _counted_here[self.key, received.body] += 1
            received.delivery_count = _counted_here[self.key, received.body]
        return received

    def ack(self, received: Received) -> None:
        _counted_here.pop((self.key, received.body), None)
        self.inner.ack(received)


class CountsDeliveriesInTheProcess(_Wrapper):
    """Counts deliveries in the worker process's memory: releases are counted, but a
    worker that dies takes its counts with it, and a message that kills every worker
    it reaches is never set aside."""

    bug = "counts-in-process"

    def __init__(self, inner: Driver, url: str) -> None:
        super().__init__(inner)
        self.key = url

    @classmethod
    def build(cls, inner: Driver, url: str) -> _Wrapper:
        return cls(inner, url)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _CountsInProcess(self.inner.consumer(priorities, concurrency=concurrency), self.key)


_WRAPPERS: list[type[_Wrapper]] = [
    AcksWhenTaken,
    ReleaseDeletes,
    DeclaresAtMostOnce,
    DropsWhatItTookAhead,
    SlowShutdown,
    DeliversEachMessageTwice,
    SharesItsSocketAcrossFork,
    RecoversOnlyAtStart,
    CountsDeliveriesInTheProcess,
]
_INNER_SCHEMES = ("memory", "file")


def _inner_url(url: DriverUrl) -> str:
    return url.raw.split("+", 1)[1]


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    drivers = [
        DriverPlugin(
            name=f"broken-{cls.scheme}",
            schemes=(cls.scheme,),
            factory=lambda url, cls=cls, **options: cls(url.host or url.path or "default"),
            capabilities=cls.capabilities,
            isolate=lambda url, namespace: f"{url.scheme}://{namespace}",
        )
        for cls in _MEMORY_VARIANTS
    ]
    for wrapper in _WRAPPERS:
        drivers.append(
            DriverPlugin(
                name=f"broken-{wrapper.bug}",
                schemes=tuple(f"{wrapper.bug}+{inner}" for inner in _INNER_SCHEMES),
                factory=lambda url, wrapper=wrapper, **options: wrapper.build(
                    connect(_inner_url(url)), _inner_url(url)
                ),
                capabilities=MemoryDriver.capabilities,
                isolate=lambda url, namespace, bug=wrapper.bug: (
                    f"{bug}+{isolated_url(_inner_url(url), namespace)}"
                ),
            )
        )
    return drivers


def describe(scheme: str) -> str:
    """The bug a scheme names (the class docstring), for the self-test's messages."""
    bug = scheme.split("+", 1)[0]
    for cls in _MEMORY_VARIANTS:
        if cls.scheme == bug:
            return (cls.__doc__ or "").strip()
    for wrapper in _WRAPPERS:
        if wrapper.bug == bug:
            return (wrapper.__doc__ or "").strip()
    raise KeyError(f"no broken driver has the scheme {scheme!r}")
