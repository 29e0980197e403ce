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
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hermes.core import (
    DEFAULT_PRIORITY,
    BrokerUnavailableError,
    Message,
    NotSupportedError,
    SerializeError,
    Shutdown,
    SupportsRawSend,
    connect,
    hookimpl,
)
from hermes.core.driver import (
    Callback,
    Consumer,
    Delay,
    Delivery,
    Driver,
    DriverPlugin,
    DriverUrl,
    MemoryDriver,
    MessageSerializer,
    QueueStats,
    Received,
    SupportsPurge,
    isolated_url,
)


def _should_stop(driver: Driver) -> bool:
    """What a driver that runs its own loop checks: max items reached, or shutdown asked."""
    if driver.max_process_items and driver.processed_items >= driver.max_process_items:
        return True
    return driver.shutdown is not None and driver.shutdown.should_shutdown(driver.start_time)


# Memory subclasses ---------------------------------------------------------------


class _BrokenMemory(MemoryDriver):
    #: The URL scheme, which names the bug.
    scheme = ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.scheme}://{self.name}>"


class IgnoresExecuteAt(_BrokenMemory):
    """Delivers at once while declaring delay=NATIVE."""

    scheme = "ignores-delay"

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        self._put(self.serializer.serialize(message), priority, None)


class ReadsInRegistrationOrder(_BrokenMemory):
    """Reads priority queues in the order they were set up, not highest first."""

    scheme = "registration-order"

    def check_priorities(self, known: Any, wanted: Sequence[int]) -> list[int]:
        super().check_priorities(known, wanted)
        return list(wanted) if wanted else list(known)


class IgnoresRestriction(_BrokenMemory):
    """``handle(priorities=[...])`` reads every queue anyway."""

    scheme = "ignores-restriction"

    def check_priorities(self, known: Any, wanted: Sequence[int]) -> list[int]:
        return super().check_priorities(known, ())


class AcceptsUnknownPriority(_BrokenMemory):
    """Sends a message for a priority without a queue to the default queue."""

    scheme = "accepts-unknown-priority"

    def _put(self, data: str | bytes, priority: int, execute_at: float | None) -> None:
        if priority not in self._broker.queues:
            priority = DEFAULT_PRIORITY
        super()._put(data, priority, execute_at)


class DeclaresNoPriorities(_BrokenMemory):
    """Declares priorities=False but sets priority queues up without complaint."""

    scheme = "claims-no-priorities"
    capabilities = replace(MemoryDriver.capabilities, priorities=False)


class DeclaresIgnoredDelay(_BrokenMemory):
    """Declares delay=IGNORED but holds delayed messages back."""

    scheme = "claims-ignored-delay"
    capabilities = replace(MemoryDriver.capabilities, delay=Delay.IGNORED)


class WaitsBehindTheHead(_BrokenMemory):
    """Keeps delayed messages in line: one due later holds up every message behind it."""

    scheme = "head-of-line"

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        self._put(self.serializer.serialize(message), priority, None)

    def wait(self, callback: Callback, priorities: Sequence[int] = (), **options: Any) -> None:
        def when_due(message: Message, priority: int) -> bool:
            while message.execute_at is not None and not _should_stop(self):
                left = message.execute_at - time.time()
                if left <= 0:
                    break
                time.sleep(min(left, 0.05))
            return callback(message, priority)

        super().wait(when_due, priorities, **options)


_twice_lock = threading.Lock()
_waiting: dict[str, set[int]] = {}
_handed_twice: set[str] = set()


class HandsOneMessageToTwoConsumers(_BrokenMemory):
    """While another consumer waits on the queue, gives it a copy of each handled message."""

    scheme = "two-consumers"

    def wait(self, callback: Callback, priorities: Sequence[int] = (), **options: Any) -> None:
        waiting = _waiting.setdefault(self.name, set())

        def and_to_another(message: Message, priority: int) -> bool:
            ok = callback(message, priority)
            with _twice_lock:
                again = len(waiting) > 1 and message.id not in _handed_twice
                _handed_twice.add(message.id)
            if again:
                self._put(self.serializer.serialize(message), priority, None)
            return ok

        with _twice_lock:
            waiting.add(id(self))
        try:
            super().wait(and_to_another, priorities, **options)
        finally:
            with _twice_lock:
                waiting.discard(id(self))


_redelivered: set[str] = set()


class ForgetsAcks(_BrokenMemory):
    """Puts a handled message back on its queue once (an ack that never reached the broker)."""

    scheme = "forgets-acks"

    def wait(self, callback: Callback, priorities: Sequence[int] = (), **options: Any) -> None:
        def and_again(message: Message, priority: int) -> bool:
            ok = callback(message, priority)
            if message.id not in _redelivered:
                _redelivered.add(message.id)
                self._put(self.serializer.serialize(message), priority, None)
            return ok

        super().wait(and_again, priorities, **options)


class CountsUnknownAsZero(_BrokenMemory):
    """Says 0 in flight, whatever the workers hold: an unknown count shown as 0."""

    scheme = "zero-in-flight"

    def queue_stats(self) -> list[QueueStats]:
        return [replace(row, in_flight=0) for row in super().queue_stats()]


class DropsRetries(_BrokenMemory):
    """Loses the ``retries`` field on the way to the broker."""

    scheme = "drops-retries"

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        super().send(message.replace(retries=0), priority)


class _RaisesKeyError:
    def __init__(self) -> None:
        self.inner = MessageSerializer()

    def serialize(self, message: Message) -> str:
        return self.inner.serialize(message)

    def unserialize(self, data: str | bytes) -> Message:
        try:
            return self.inner.unserialize(data)
        except SerializeError as exc:
            raise KeyError("message") from exc


class CrashesOnPoison(_BrokenMemory):
    """A body that is not a message raises out of wait(): the worker dies."""

    scheme = "crashes-on-poison"

    def __init__(self, name: str = "default") -> None:
        super().__init__(name)
        self.serializer = _RaisesKeyError()


class TruncatesLargeBodies(_BrokenMemory):
    """Cuts bodies at 64 KiB while declaring 16 MiB."""

    scheme = "truncates-large"

    def _put(self, data: str | bytes, priority: int, execute_at: float | None) -> None:
        super()._put(data[: 64 * 1024], priority, execute_at)


class WritesBeforeSerializing(_BrokenMemory):
    """Puts a best-effort body on the broker, then finds out the payload cannot be encoded."""

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
        self._put(json.dumps(body, default=repr), priority, message.execute_at)
        self.serializer.serialize(message)


class ThreadUnsafeSend(_BrokenMemory):
    """``send()`` updates the queue without a lock, like an unguarded client connection."""

    scheme = "thread-unsafe"

    def _put(self, data: str | bytes, priority: int, execute_at: float | None) -> None:
        queue = self._broker.queues[priority]
        items = list(queue)
        time.sleep(0.0005)  # another thread's send() lands here and is overwritten
        items.append(data)
        queue.clear()
        queue.extend(items)
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

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        self._connection()
        super().send(message, priority)

    def wait(self, callback: Callback, priorities: Sequence[int] = (), **options: Any) -> None:
        self._connection()
        super().wait(callback, priorities, **options)


class CapsDelays(_BrokenMemory):
    """Holds a delayed message at most 10 s (times the kit's time scale), however far its
    execute_at: what the kit's few-second delays cannot see."""

    scheme = "caps-delay"

    def _put(self, data: str | bytes, priority: int, execute_at: float | None) -> None:
        if execute_at is not None:
            scale = float(os.environ.get("HERMES_KIT_TIME_SCALE") or 1.0)
            execute_at = min(execute_at, time.time() + 10.0 * scale)
        super()._put(data, priority, execute_at)


class StretchesDelays(_BrokenMemory):
    """Holds a delayed message twice as long as its execute_at asks."""

    scheme = "stretches-delay"

    def _put(self, data: str | bytes, priority: int, execute_at: float | None) -> None:
        now = time.time()
        if execute_at is not None and execute_at > now:
            execute_at = now + 2 * (execute_at - now)
        super()._put(data, priority, execute_at)


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

    def _put(self, data: str | bytes, priority: int, execute_at: float | None) -> None:
        broker = self._broker
        with broker.condition:
            subscriber = _subscribers.get(self.name)
            if (
                subscriber is not None
                and priority in broker.queues
                and (execute_at is None or execute_at <= time.time())
            ):
                subscriber.inbox.append(Received(data, priority))
                broker.in_flight[priority] += 1
                broker.condition.notify_all()
                return
        super()._put(data, priority, execute_at)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _Pushed(self, super().consumer(priorities, concurrency=concurrency))


class ReadsEveryQueueForAnUnknownPriority(_BrokenMemory):
    """``handle(priorities=[P])`` with no queue for P reads every queue instead of raising."""

    scheme = "unknown-restriction"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        known = [p for p in priorities if p in self._broker.queues]
        return super().consumer(known, concurrency=concurrency)


class _OnlyWhenIdle:
    """A shutdown honoured only once no message waits."""

    def __init__(self, shutdown: Shutdown, driver: MemoryDriver) -> None:
        self.shutdown_ = shutdown
        self.driver = driver

    def should_shutdown(self, start_time: float) -> bool:
        if not self.shutdown_.should_shutdown(start_time):
            return False
        broker = self.driver._broker
        with broker.condition:
            return not any(broker.queues.values())

    def shutdown(self, at: float | None = None) -> bool:
        return self.shutdown_.shutdown(at)


class StopsOnlyWhenIdle(_BrokenMemory):
    """Honours a shutdown request only once the queues are empty."""

    scheme = "stops-when-idle"

    def set_shutdown(self, shutdown: Shutdown | None) -> None:
        super().set_shutdown(_OnlyWhenIdle(shutdown, self) if shutdown is not None else None)


_used: set[str] = set()


class HangsInClose(_BrokenMemory):
    """Once it has sent, ``close()`` waits for a flush that never ends."""

    scheme = "hangs-close"

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        super().send(message, priority)
        _used.add(f"close {id(self)}")

    def close(self) -> None:
        if f"close {id(self)}" in _used:
            threading.Event().wait()


class HangsInPurge(_BrokenMemory):
    """Once messages were sent on its queues, ``purge()`` waits for a reply that never comes."""

    scheme = "hangs-purge"

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        super().send(message, priority)
        _used.add(f"purge {self.name}")

    def purge(self) -> None:
        if f"purge {self.name}" in _used:
            threading.Event().wait()
        super().purge()


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
    DropsRetries,
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
    StopsOnlyWhenIdle,
    HangsInClose,
    HangsInPurge,
]


# Wrappers around any driver ------------------------------------------------------


class _Wrapper(Driver):
    """Delegates everything to ``inner``; subclasses break one thing."""

    bug = ""

    def __init__(self, inner: Driver) -> None:
        super().__init__()
        self.inner = inner
        self.capabilities = inner.capabilities

    @classmethod
    def build(cls, inner: Driver, url: str) -> _Wrapper:
        return cls(inner)

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        self.inner.send(message, priority)

    def send_raw(self, body: bytes, priority: int = DEFAULT_PRIORITY) -> None:
        if not isinstance(self.inner, SupportsRawSend):
            raise NotSupportedError(f"{self.inner!r} has no send_raw")
        self.inner.send_raw(body, priority)

    def setup_priority_queue(self, name: str, priority: int) -> None:
        self.inner.setup_priority_queue(name, priority)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return self.inner.consumer(priorities, concurrency=concurrency)

    def wait(self, callback: Callback, priorities: Sequence[int] = (), **options: Any) -> None:
        self.inner.start_time = self.start_time
        self.inner.wait(callback, priorities, **options)

    def set_max_process_items(self, count: int) -> None:
        super().set_max_process_items(count)
        self.inner.set_max_process_items(count)

    def set_shutdown(self, shutdown: Shutdown | None) -> None:
        super().set_shutdown(shutdown)
        self.inner.set_shutdown(shutdown)

    def purge(self) -> None:
        if isinstance(self.inner, SupportsPurge):
            self.inner.purge()

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.bug}+{self.inner!r}>"


class AcksBeforeTheCallback(_Wrapper):
    """Takes each message off the broker, and only then calls the callback."""

    bug = "early-ack"

    def wait(self, callback: Callback, priorities: Sequence[int] = (), **options: Any) -> None:
        taken: list[tuple[Message, int]] = []

        def take(message: Message, priority: int) -> bool:
            taken.append((message, priority))
            return True  # the inner driver acks now

        self.inner.set_shutdown(self.shutdown)
        self.inner.start_time = self.start_time
        while not _should_stop(self):
            self.inner.set_max_process_items(1)  # counted per wait() call: one at a time
            self.inner.wait(take, priorities, **options)
            while taken:
                callback(*taken.pop(0))
                self.processed_items += 1


class _AcksOnReceive(Consumer):
    def __init__(self, inner: Consumer) -> None:
        self.inner = inner

    def receive(self, timeout_s: float) -> Received | None:
        received = self.inner.receive(timeout_s)
        if received is not None:
            self.inner.ack(received)  # before any handler has run
        return received

    def release(self, received: Received) -> None:
        """Nothing to give back: it was acknowledged when it was taken."""

    def close(self) -> None:
        self.inner.close()


class AcksWhenTaken(_Wrapper):
    """Its consumer acknowledges each message as it takes it, before the handler runs."""

    bug = "ack-on-receive"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _AcksOnReceive(self.inner.consumer(priorities, concurrency=concurrency))

    def wait(self, callback: Callback, priorities: Sequence[int] = (), **options: Any) -> None:
        Driver.wait(self, callback, priorities, **options)


class DeclaresAtMostOnce(_Wrapper):
    """Declares AT_MOST_ONCE over a driver that delivers again."""

    bug = "claims-at-most-once"

    def __init__(self, inner: Driver) -> None:
        super().__init__(inner)
        self.capabilities = replace(inner.capabilities, delivery=Delivery.AT_MOST_ONCE)


class IgnoresMaxItems(_Wrapper):
    """Never passes max items on: ``wait()`` does not return after n messages."""

    bug = "ignores-max-items"

    def set_max_process_items(self, count: int) -> None:
        Driver.set_max_process_items(self, count)


class _Late:
    """A shutdown that is noticed only some seconds after it was asked for."""

    def __init__(self, shutdown: Shutdown, late_s: float) -> None:
        self.shutdown_ = shutdown
        self.late_s = late_s
        self.asked: float | None = None

    def should_shutdown(self, start_time: float) -> bool:
        if self.asked is None and self.shutdown_.should_shutdown(start_time):
            self.asked = time.monotonic()
        return self.asked is not None and time.monotonic() - self.asked >= self.late_s

    def shutdown(self, at: float | None = None) -> bool:
        return self.shutdown_.shutdown(at)


class SlowShutdown(_Wrapper):
    """Notices a shutdown request 5 s late (an idle wait that sleeps too long)."""

    bug = "slow-shutdown"

    def set_shutdown(self, shutdown: Shutdown | None) -> None:
        Driver.set_shutdown(self, shutdown)
        self.inner.set_shutdown(_Late(shutdown, 5.0) if shutdown is not None else None)


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


class DeliversEachMessageTwice(_Wrapper):
    """After a message is handled, puts a copy back for the next consumer to take."""

    bug = "fan-out"

    def __init__(self, inner: Driver, url: str) -> None:
        super().__init__(inner)
        self.key = hashlib.sha1(url.encode()).hexdigest()[:16]

    @classmethod
    def build(cls, inner: Driver, url: str) -> _Wrapper:
        return cls(inner, url)

    def wait(self, callback: Callback, priorities: Sequence[int] = (), **options: Any) -> None:
        def and_again(message: Message, priority: int) -> bool:
            ok = callback(message, priority)
            if _first_time(self.key, message.id):
                self.inner.send(message, priority)
            return ok

        self.inner.start_time = self.start_time
        self.inner.wait(and_again, priorities, **options)


logger = logging.getLogger("broken_drivers")


class SwallowsCallbackErrors(_Wrapper):
    """Its ``wait()`` logs an Exception from the callback and goes on; the message is gone."""

    bug = "swallows-errors"

    def wait(self, callback: Callback, priorities: Sequence[int] = (), **options: Any) -> None:
        def logged(message: Message, priority: int) -> bool:
            try:
                return callback(message, priority)
            except Exception:
                logger.exception("callback failed for message #%s; going on", message.id)
                return False

        Driver.wait(self, logged, priorities, **options)


class SharesItsSocketAcrossFork(_Wrapper):
    """Opens its connection once; forked children use the parent's, and confirms go astray.

    Every ``send()`` waits for the broker's confirm on the connection. One
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

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        self.inner.send(message, priority)
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
            raise BrokerUnavailableError(
                f"{self!r}: no confirm for message #{message.id} within 1 s "
                "(it went to another process on the same connection)"
            )


_WRAPPERS: list[type[_Wrapper]] = [
    AcksBeforeTheCallback,
    AcksWhenTaken,
    DeclaresAtMostOnce,
    IgnoresMaxItems,
    SlowShutdown,
    DeliversEachMessageTwice,
    SwallowsCallbackErrors,
    SharesItsSocketAcrossFork,
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
