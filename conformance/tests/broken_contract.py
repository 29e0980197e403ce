"""Drivers that break one promise of the consumer contract each: the kit must fail them.

Loaded into the kit's runs with ``--hermes-plugin broken_contract``, next to
``broken_drivers``. Each is a :class:`MemoryDriver` subclass whose bug its
URL scheme names, broken the way a driver author might: a lease never
renewed, a close() that gives back what handlers still hold, acks deferred
and dropped at close, a release that becomes an ack on another thread, acks
sent on a client that is not thread-safe, a consumer bound to one thread,
job records that never expire or lose an update, ...
Two more are sound: ``keeps-held-on-drop``, the kit's control for the
dropped-connection check (the memory driver itself has no connection to drop),
and ``records-in-sqlite``, the control for the records row's processes (the
memory driver keeps its records in the process).
"""

from __future__ import annotations

import heapq
import json
import os
import sqlite3
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Hashable, Mapping, Sequence
from contextlib import closing
from dataclasses import replace
from typing import Any

from hermes.core import DEFAULT_PRIORITY, DriverError, Message, hookimpl
from hermes.core.driver import BrowsePage, Consumer, DriverPlugin, Outgoing, Received
from hermes.core.drivertools import outgoing
from hermes.core.spi._memory import MemoryDriver, _Lease, _MemoryConsumer


class _Broken(MemoryDriver):
    #: The URL scheme, which names the bug.
    scheme = ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.scheme}://{self.name}>"


class _Relay(Consumer):
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


# Leases ------------------------------------------------------------------------


class _LeaseRunsOut(_MemoryConsumer):
    def lease_expiry(self) -> float | None:
        return time.monotonic() + self.driver.capabilities.redelivery_timeout_s


class NeverRenewsItsLease(_Broken):
    """Leases a taken message for redelivery_timeout_s and never renews it: a handler
    that runs longer has its message handed to another worker meanwhile."""

    scheme = "no-lease-renewal"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        super().consumer(priorities, concurrency=concurrency)  # validates them
        return _LeaseRunsOut(self, priorities)


class _ReleasesOnClose(_MemoryConsumer):
    def close(self) -> None:
        for received in list(self.unsettled):
            self.release(received)


class ReleasesHeldMessagesOnClose(_Broken):
    """Its close() releases every message still held, as the previous memory driver did:
    a handler that outlived the grace period has its message run by another worker."""

    scheme = "releases-on-close"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        super().consumer(priorities, concurrency=concurrency)
        return _ReleasesOnClose(self, priorities)


# Sizes and values ----------------------------------------------------------------


class DefinesItsOwnSend(_Broken):
    """Keeps the send() and send_batch() it had before the driver contract moved them to
    core: they put bodies without checking max_message_bytes (declared 64 KiB)."""

    scheme = "own-send"
    capabilities = replace(MemoryDriver.capabilities, max_message_bytes=64 * 1024)

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        self.put([outgoing(message)], priority)

    def send_batch(self, messages: Sequence[Message], priority: int = DEFAULT_PRIORITY) -> None:
        self.put([outgoing(message) for message in messages], priority)


def _as_double(text: str) -> int | float:
    number = int(text)
    return number if abs(number) <= 2**53 else float(number)


class ReadsNumbersAsDoubles(_Broken):
    """Stores bodies through a JSON bridge that reads every number as a double, as a
    JavaScript one does: integers past 2**53 come back as floats."""

    scheme = "lossy-json"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        super().put([_through_doubles(item) for item in items], priority)


def _through_doubles(item: Outgoing) -> Outgoing:
    try:
        document = json.loads(item.body, parse_int=_as_double)
    except ValueError:
        return item  # the kit's poison: not JSON, passed on as it is
    body = json.dumps(document, separators=(",", ":")).encode()
    return replace(item, body=body)


# Settles -------------------------------------------------------------------------


class _DefersAcks(_Relay):
    """Acks are sent with the next receive, in one round trip; close() forgets them."""

    def __init__(self, inner: Consumer) -> None:
        super().__init__(inner)
        self.pending: list[Received] = []
        self.lock = threading.Lock()

    def receive(self, timeout_s: float) -> Received | None:
        with self.lock:
            pending, self.pending = self.pending, []
        for received in pending:
            self.inner.ack(received)
        return self.inner.receive(timeout_s)

    def ack(self, received: Received) -> None:
        with self.lock:
            self.pending.append(received)


class DropsDeferredAcksOnClose(_Broken):
    """Defers each ack to the next receive (one round trip for several) and does not flush
    them in close(): the last messages of every run come back after the stop."""

    scheme = "defers-acks"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _DefersAcks(super().consumer(priorities, concurrency=concurrency))


class _BatchesAcks(_Relay):
    """Sends acks four at a time; close() forgets a batch not yet full."""

    def __init__(self, inner: Consumer) -> None:
        super().__init__(inner)
        self.pending: list[Received] = []
        self.lock = threading.Lock()

    def ack(self, received: Received) -> None:
        with self.lock:
            self.pending.append(received)
            if len(self.pending) < 4:
                return
            batch, self.pending = self.pending, []
        for each in batch:
            self.inner.ack(each)


class DropsBatchedAcksOnClose(_Broken):
    """From concurrency 4 up its prefetch allows batching: acks go out four at a time,
    and close() drops a batch not yet full. Serial and concurrency-2 runs are sound."""

    scheme = "batched-acks"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        inner = super().consumer(priorities, concurrency=concurrency)
        return _BatchesAcks(inner) if concurrency >= 4 else inner


class _AcksCumulatively(_Relay):
    """An ack covers every message taken before it too (``multiple=True``)."""

    def __init__(self, inner: Consumer) -> None:
        super().__init__(inner)
        self.taken: list[Received] = []
        self.lock = threading.Lock()

    def receive(self, timeout_s: float) -> Received | None:
        received = self.inner.receive(timeout_s)
        if received is not None:
            with self.lock:
                self.taken.append(received)
        return received

    def ack(self, received: Received) -> None:
        with self.lock:
            if received not in self.taken:
                return  # covered by an earlier cumulative ack
            upto = self.taken.index(received) + 1
            covered, self.taken = self.taken[:upto], self.taken[upto:]
        for each in covered:
            self.inner.ack(each)

    def release(self, received: Received) -> None:
        with self.lock:
            if received in self.taken:
                self.taken.remove(received)
        self.inner.release(received)

    def reject(self, received: Received, reason: str) -> None:
        with self.lock:
            if received in self.taken:
                self.taken.remove(received)
        self.inner.reject(received, reason)


class AcksCumulatively(_Broken):
    """Acknowledges like AMQP's ``multiple=True``: an ack also covers every message taken
    before it, a handler still running on one of them included."""

    scheme = "acks-multiple"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _AcksCumulatively(super().consumer(priorities, concurrency=concurrency))


class _ReleaseOffThreadAcks(_Relay):
    def __init__(self, inner: Consumer) -> None:
        super().__init__(inner)
        self.owner: int | None = None

    def receive(self, timeout_s: float) -> Received | None:
        self.owner = threading.get_ident()
        return self.inner.receive(timeout_s)

    def release(self, received: Received) -> None:
        if threading.get_ident() != self.owner:
            # Handed to the client's thread as "settle", which it sends as an ack.
            self.inner.ack(received)
        else:
            self.inner.release(received)


class ReleaseFromHandlerThreadAcks(_Broken):
    """A release made on a handler thread (concurrency above one) reaches the broker as an
    ack: a message whose callback raised is gone. On the receiving thread it is fine."""

    scheme = "release-acks-off-thread"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _ReleaseOffThreadAcks(super().consumer(priorities, concurrency=concurrency))


class _OneThread(_Relay):
    def __init__(self, inner: Consumer) -> None:
        super().__init__(inner)
        self.thread: int | None = None

    def receive(self, timeout_s: float) -> Received | None:
        me = threading.get_ident()
        if self.thread is None:
            self.thread = me
        elif me != self.thread:
            raise DriverError(f"the client belongs to thread {self.thread}, not to thread {me}")
        return self.inner.receive(timeout_s)


class ReceivesOnOneThread(_Broken):
    """Its consumer works only on the thread of its first receive, as a client bound to
    one thread would: a worker that hands the consumer to another thread fails."""

    scheme = "receives-on-one-thread"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _OneThread(super().consumer(priorities, concurrency=concurrency))


class _UnlockedClient(_Relay):
    """One client, no lock: a frame written while another thread is inside the client
    interleaves with that thread's, and the broker drops the garbled frame."""

    def __init__(self, inner: Consumer) -> None:
        super().__init__(inner)
        self.lock = threading.Lock()
        self.receiving: set[int] = set()

    def receive(self, timeout_s: float) -> Received | None:
        me = threading.get_ident()
        with self.lock:
            self.receiving.add(me)
        try:
            return self.inner.receive(timeout_s)
        finally:
            with self.lock:
                self.receiving.discard(me)

    def ack(self, received: Received) -> None:
        with self.lock:
            garbled = bool(self.receiving - {threading.get_ident()})
        if not garbled:
            self.inner.ack(received)


class AcksOnAClientThatIsNotThreadSafe(_Broken):
    """Acknowledges straight from each handler thread on a client that is not thread-safe
    (as pika's): an ack sent while another thread waits in a receive is garbled and lost,
    and its message comes back after the worker stops. Serial runs are sound."""

    scheme = "acks-off-thread-unlocked"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _UnlockedClient(super().consumer(priorities, concurrency=concurrency))


class _RejectKeepsHeld(_Relay):
    def reject(self, received: Received, reason: str) -> None:
        """Logged by core; the body is left as it is (held, under its lease)."""


class RejectLeavesPoisonHeld(_Broken):
    """Its reject() does nothing: a poison body stays held and returns when its lease
    runs out, to be logged and rejected again by the next worker."""

    scheme = "reject-keeps-held"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _RejectKeepsHeld(super().consumer(priorities, concurrency=concurrency))


class _Dropped(_MemoryConsumer):
    def drop(self) -> None:
        with self.broker.condition:
            for received in self.unsettled:
                lease: _Lease = received.token
                self.broker.end(lease)  # acknowledged, as far as the broker knows


class AcksWhatItHeldOnReconnect(_Broken):
    """When its connection drops it reconnects clean, acknowledging what the old connection
    held: a message whose handler then fails is never delivered again."""

    scheme = "loses-held-on-drop"

    def __init__(self, name: str = "default") -> None:
        super().__init__(name)
        self.consumers: list[_Dropped] = []

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        super().consumer(priorities, concurrency=concurrency)
        consumer = _Dropped(self, priorities)
        self.consumers.append(consumer)
        return consumer

    def drop_connection(self) -> None:
        for consumer in self.consumers:
            consumer.drop()


class KeepsHeldOnDrop(_Broken):
    """Sound: a dropped connection changes nothing the broker holds (the control)."""

    scheme = "keeps-held-on-drop"

    def drop_connection(self) -> None:
        """A broker with leases keeps what the connection held until the lease ends."""


class _TakesAhead(_Relay):
    """Takes up to five waiting messages at once and hands them out one by one."""

    def __init__(self, inner: Consumer, *, give_back: bool) -> None:
        super().__init__(inner)
        self.give_back = give_back
        self.ahead: list[Received] = []

    def receive(self, timeout_s: float) -> Received | None:
        if not self.ahead:
            first = self.inner.receive(timeout_s)
            if first is None:
                return None
            self.ahead.append(first)
            while len(self.ahead) < 5 and (more := self.inner.receive(0)) is not None:
                self.ahead.append(more)
        return self.ahead.pop(0)

    def close(self) -> None:
        if self.give_back:
            while self.ahead:  # the last taken goes back first: the queue keeps its order
                self.inner.release(self.ahead.pop())
        self.inner.close()


class KeepsWhatItTookAheadOnClose(_Broken):
    """Takes five messages ahead of its handlers (an 8 s lease); close() leaves those it
    never handed out to their lease, so the next worker waits 8 s for them."""

    scheme = "keeps-ahead"

    def __init__(self, name: str = "default") -> None:
        super().__init__(name, redelivery_timeout_s=8.0)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        inner = super().consumer(priorities, concurrency=concurrency)
        return _TakesAhead(inner, give_back=False)


class GivesBackWhatItTookAhead(_Broken):
    """Sound: takes five ahead (an 8 s lease) and gives back at close those it never
    handed out. The control of ``keeps-ahead``."""

    scheme = "gives-back-ahead"

    def __init__(self, name: str = "default") -> None:
        super().__init__(name, redelivery_timeout_s=8.0)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        inner = super().consumer(priorities, concurrency=concurrency)
        return _TakesAhead(inner, give_back=True)


class _Polls(_Relay):
    """Looks for a message once a second instead of waiting on the broker."""

    def receive(self, timeout_s: float) -> Received | None:
        deadline = time.monotonic() + timeout_s
        while True:
            received = self.inner.receive(0)
            if received is not None:
                return received
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(1.0, left))


class PollsWhileDeclaringAPush(_Broken):
    """Declares wake_up_s=0 (as a broker that pushes) but an idle worker looks for new
    messages once a second."""

    scheme = "polls-each-second"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _Polls(super().consumer(priorities, concurrency=concurrency))


# Purge ---------------------------------------------------------------------------


class PurgesEveryPrioritysSchedule(_Broken):
    """purge(priority) clears that priority's queue and every priority's delayed messages."""

    scheme = "purge-all-delayed"

    def purge(self, priority: int | None = None) -> int:
        removed = super().purge(priority)
        with self._broker.condition:
            self._broker.scheduled.clear()
        return removed


class PurgesTheDefaultScheduleWithAnother(_Broken):
    """purge(priority) of a priority other than the default also deletes the default
    priority's delayed messages (one schedule for all, emptied whichever is purged)."""

    scheme = "purge-default-delayed"

    def purge(self, priority: int | None = None) -> int:
        removed = super().purge(priority)
        if priority is not None and priority != DEFAULT_PRIORITY:
            broker = self._broker
            with broker.condition:
                kept = [entry for entry in broker.scheduled if entry[2] != DEFAULT_PRIORITY]
                broker.scheduled = kept
                heapq.heapify(broker.scheduled)
        return removed


class PurgesInFlight(_Broken):
    """purge(priority) also deletes the messages running handlers hold: released, they
    are gone."""

    scheme = "purge-in-flight"

    def purge(self, priority: int | None = None) -> int:
        removed = super().purge(priority)
        broker = self._broker
        with broker.condition:
            for lease in list(broker.held):
                if priority is None or lease.priority == priority:
                    broker.end(lease)
        return removed


# Away from the easy moment -------------------------------------------------------

#: Messages a broker hands out before it counts as warm (busy for a while).
_WARM = 100
#: Broker name -> messages handed out, by every consumer of that name.
_handed_out: Counter[str] = Counter()


def _warm(driver: MemoryDriver) -> bool:
    return _handed_out[driver.name] >= _WARM


class _TurnsFair(_MemoryConsumer):
    def __init__(self, driver: MemoryDriver, priorities: Sequence[int]) -> None:
        super().__init__(driver, priorities)
        self.turn = 0

    def receive(self, timeout_s: float) -> Received | None:
        if _warm(self.driver):
            with self.broker.condition:
                order = self.driver.check_priorities(self.broker.queues, self.priorities)
                self.broker.move_due(time.time())
                for step in range(len(order)):
                    priority = order[(self.turn + step) % len(order)]
                    queue = self.broker.queues.get(priority)
                    if queue:
                        self.turn += step + 1
                        body = queue.popleft()
                        received = Received(body, priority, self.broker.take(priority, body, None))
                        self.unsettled.add(received)
                        return received
        received = super().receive(timeout_s)
        if received is not None:
            _handed_out[self.driver.name] += 1
        return received


class TurnsFairUnderLoad(_Broken):
    """Reads highest priority first until it has handed out 100 messages, then takes
    from each priority queue in turn (fairness under sustained load)."""

    scheme = "turns-fair"

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        super().consumer(priorities, concurrency=concurrency)
        return _TurnsFair(self, priorities)


class _CountsHandedOut(_Relay):
    def __init__(self, inner: Consumer, driver: MemoryDriver) -> None:
        super().__init__(inner)
        self.driver = driver

    def receive(self, timeout_s: float) -> Received | None:
        received = self.inner.receive(timeout_s)
        if received is not None:
            _handed_out[self.driver.name] += 1
        return received


class FetchesTheScheduleAhead(_Broken):
    """Once it has handed out 100 messages it saves round trips: a message due within a
    minute goes to the busy workers at once, with the ready ones -- early."""

    scheme = "schedule-ahead"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        if _warm(self):
            soon = time.time() + 60
            items = [
                replace(item, execute_at=None)
                if item.execute_at is not None and item.execute_at < soon
                else item
                for item in items
            ]
        super().put(items, priority)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _CountsHandedOut(super().consumer(priorities, concurrency=concurrency), self)


class DropsTheOldestPastFiveHundred(_Broken):
    """Each queue holds at most 500 waiting messages (a capped list): the oldest go."""

    scheme = "caps-queue"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        super().put(items, priority)
        with self._broker.condition:
            queue = self._broker.queues[priority]
            while len(queue) > 500:
                queue.popleft()


class TrimsTheSchedule(_Broken):
    """Its schedule keeps the 500 soonest delayed messages (a trimmed sorted set)."""

    scheme = "caps-schedule"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        super().put(items, priority)
        broker = self._broker
        with broker.condition:
            if len(broker.scheduled) > 500:
                broker.scheduled = heapq.nsmallest(500, broker.scheduled)
                heapq.heapify(broker.scheduled)


class LooksAtTheFirstHundredScheduled(_Broken):
    """Moves due messages from the first 100 of its schedule in the order they were
    sent: one due soon, sent after 100 due later, waits until those are due."""

    scheme = "schedule-first-hundred"

    def __init__(self, name: str = "default") -> None:
        super().__init__(name)
        broker = self._broker

        def move_due(now: float) -> None:
            first = sorted(broker.scheduled, key=lambda entry: entry[1])[:100]
            due = [entry for entry in first if entry[0] <= now]
            for entry in due:
                broker.scheduled.remove(entry)
                broker.queues.setdefault(entry[2], deque()).append(entry[3])
            heapq.heapify(broker.scheduled)
            if not due and broker.scheduled and broker.scheduled[0][0] <= now:
                time.sleep(0.05)  # its consumers would spin on the due head it ignores

        broker.move_due = move_due  # type: ignore[method-assign]


# Job records -----------------------------------------------------------------------


class _BrokenRecords(_Broken):
    def _write(self, key: str, value: bytes, ttl_s: float) -> None:
        """Store ``value`` whatever is stored now, and wake the waiters."""
        broker = self._broker
        with broker.records_changed:
            kept = broker.records.get(key)
            place = next(broker.sequence) if kept is None else kept[2]
            broker.records[key] = (time.monotonic() + ttl_s, bytes(value), place)
            broker.records_changed.notify_all()


#: One reply on the simulated connection: a length, then the bytes, padded.
_FRAME = 512


class RecordsShareTheirConnectionAcrossFork(_BrokenRecords):
    """Opens its connection on first use and keeps it: forked children read their
    replies on the parent's, and a reply can go to another process than asked."""

    scheme = "records-shared-socket"

    def __init__(self, name: str = "default") -> None:
        super().__init__(name)
        self._socket: tuple[int, int] | None = None
        self._lock = threading.Lock()  # guards the connection within a process
        self._lock_pid = os.getpid()

    def record_get(self, key: str) -> bytes | None:
        value = super().record_get(key)
        if self._socket is None:
            self._socket = os.pipe()
        if self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        read_fd, write_fd = self._socket
        payload = b"\xff" if value is None else value
        frame = len(payload).to_bytes(4, "big") + payload.ljust(_FRAME - 4, b"\0")
        with self._lock:
            os.write(write_fd, frame)  # the server's reply comes back on the stream ...
            time.sleep(0.002)  # ... one round trip later
            reply = os.read(read_fd, _FRAME)
        size = int.from_bytes(reply[:4], "big")
        body = reply[4 : 4 + size]
        return None if body == b"\xff" else body


class RecordsNeverExpire(_BrokenRecords):
    """Keeps every record for a day, whatever ttl it is written with."""

    scheme = "records-never-expire"

    def record_put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        return super().record_put(key, value, 86400.0, expect)


class RecordsIgnoreExpect(_BrokenRecords):
    """Its compare-and-set ignores ``expect``: a plain write, one round trip to the broker."""

    scheme = "records-ignore-expect"

    def record_put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        time.sleep(0.001)  # the round trip: other writers read meanwhile
        self._write(key, value, ttl_s)
        return True


class RecordsCompareThenWrite(_BrokenRecords):
    """Compares in one round trip and writes in a second (a GET, then a SET): two
    writers that both saw the same bytes both write, and one update is lost."""

    scheme = "records-not-atomic"

    def record_put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        if self.record_get(key) != expect:
            return False
        time.sleep(0.001)  # the second round trip: another writer compares meanwhile
        self._write(key, value, ttl_s)
        return True


class RecordWaitSleeps(_BrokenRecords):
    """``record_wait`` sleeps its whole timeout and then reads: no write wakes it."""

    scheme = "records-wait-sleeps"

    def record_wait(self, key: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        time.sleep(timeout_s)
        return self.record_get(key)


class RecordWaitReturnsAtOnce(_BrokenRecords):
    """``record_wait`` reads once and returns: a caller waiting for a change spins."""

    scheme = "records-wait-at-once"

    def record_wait(self, key: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        return self.record_get(key)


class RecordWaitAnyOnFirst(_BrokenRecords):
    """``record_wait_any`` waits on its first key alone, then reads the others: a write to
    another key is seen only when that wait times out (a cancel reaches no other job)."""

    scheme = "records-wait-any-first"

    def record_wait_any(
        self, seen: Mapping[str, bytes | None], timeout_s: float
    ) -> dict[str, bytes | None]:
        key, was = next(iter(seen.items()))
        self.record_wait(key, was, timeout_s)
        return {k: now for k, v in seen.items() if (now := self.record_get(k)) != v}


class RecordScanListsExpired(_BrokenRecords):
    """``record_scan`` lists every record still in storage, expired ones not yet swept too."""

    scheme = "records-scan-expired"

    def record_scan(self, limit: int) -> list[bytes]:
        with self._broker.records_changed:
            return [kept[1] for kept in self._broker.records.values()][::-1][:limit]


class RecordPagesByOffset(_BrokenRecords):
    """``record_page``'s cursor is how many records were listed (an OFFSET): a record
    created between two newest-first pages shifts the rest, and one is listed twice."""

    scheme = "records-page-offset"

    def record_page(
        self, after: str | None, limit: int, max_bytes: int, *, oldest_first: bool = False
    ) -> BrowsePage:
        now, skip = time.monotonic(), int(after or 0)
        with self._broker.records_changed:
            kept = [(key, v[1]) for key, v in self._broker.records.items() if v[0] > now]
        if not oldest_first:
            kept.reverse()
        listed: list[tuple[Hashable, bytes | str]] = list(kept[skip : skip + limit])
        more = skip + len(listed) < len(kept)
        return BrowsePage(listed, str(skip + len(listed)) if more else None)


class RecordsInProcess(_Broken):
    """Declares itself cross-process but keeps records in the process (a dict): every
    process sees only its own, and each wins every new key."""

    scheme = "records-in-process"
    capabilities = replace(MemoryDriver.capabilities, cross_process=True)


class RecordsInSqlite(_Broken):
    """Sound: records in an SQLite file that every process opens (the control for
    the records row's processes; its messages stay in the process)."""

    scheme = "records-in-sqlite"
    capabilities = replace(MemoryDriver.capabilities, cross_process=True)

    def _db(self) -> sqlite3.Connection:
        base = os.environ.get("BROKEN_DRIVERS_DIR") or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        path = os.path.join(base, f"records-{self.name}.db")
        db = sqlite3.connect(path, timeout=30, isolation_level=None)
        db.execute(
            "CREATE TABLE IF NOT EXISTS records (key TEXT PRIMARY KEY, value BLOB, expires REAL)"
        )
        return db

    def record_get(self, key: str) -> bytes | None:
        with closing(self._db()) as db:
            sql = "SELECT value FROM records WHERE key = ? AND expires > ?"
            row = db.execute(sql, (key, time.time())).fetchone()
        return bytes(row[0]) if row is not None else None

    def record_put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        with closing(self._db()) as db:
            db.execute("BEGIN IMMEDIATE")  # one writer at a time, across processes
            try:
                sql = "SELECT value FROM records WHERE key = ? AND expires > ?"
                row = db.execute(sql, (key, time.time())).fetchone()
                if (bytes(row[0]) if row is not None else None) != expect:
                    return False
                sql = "INSERT OR REPLACE INTO records (key, value, expires) VALUES (?, ?, ?)"
                db.execute(sql, (key, value, time.time() + ttl_s))
                return True
            finally:
                db.execute("COMMIT")

    def record_wait(self, key: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        while (current := self.record_get(key)) == seen and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return current

    def record_scan(self, limit: int) -> list[bytes]:
        with closing(self._db()) as db:
            sql = "SELECT value FROM records WHERE expires > ? ORDER BY rowid DESC LIMIT ?"
            return [bytes(row[0]) for row in db.execute(sql, (time.time(), limit))]

    def teardown(self) -> None:
        super().teardown()
        with closing(self._db()) as db:
            db.execute("DELETE FROM records")


# Hangs ---------------------------------------------------------------------------


class HangsInSend(_Broken):
    """Its put() waits for a broker confirm that never comes."""

    scheme = "hangs-send"

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        threading.Event().wait()


VARIANTS: list[type[_Broken]] = [
    NeverRenewsItsLease,
    ReleasesHeldMessagesOnClose,
    DefinesItsOwnSend,
    ReadsNumbersAsDoubles,
    DropsDeferredAcksOnClose,
    DropsBatchedAcksOnClose,
    AcksCumulatively,
    ReleaseFromHandlerThreadAcks,
    ReceivesOnOneThread,
    AcksOnAClientThatIsNotThreadSafe,
    RejectLeavesPoisonHeld,
    AcksWhatItHeldOnReconnect,
    KeepsHeldOnDrop,
    PurgesEveryPrioritysSchedule,
    PollsWhileDeclaringAPush,
    KeepsWhatItTookAheadOnClose,
    GivesBackWhatItTookAhead,
    PurgesTheDefaultScheduleWithAnother,
    PurgesInFlight,
    TurnsFairUnderLoad,
    FetchesTheScheduleAhead,
    DropsTheOldestPastFiveHundred,
    TrimsTheSchedule,
    LooksAtTheFirstHundredScheduled,
    HangsInSend,
    RecordsShareTheirConnectionAcrossFork,
    RecordsNeverExpire,
    RecordsIgnoreExpect,
    RecordsCompareThenWrite,
    RecordWaitSleeps,
    RecordWaitReturnsAtOnce,
    RecordWaitAnyOnFirst,
    RecordScanListsExpired,
    RecordPagesByOffset,
    RecordsInProcess,
    RecordsInSqlite,
]


def _factory(cls: type[_Broken]) -> Any:
    return lambda url, **options: cls(url.host or url.path or "default")


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        DriverPlugin(
            name=f"broken-{cls.scheme}",
            schemes=(cls.scheme,),
            factory=_factory(cls),
            capabilities=cls.capabilities,
            isolate=lambda url, namespace: f"{url.scheme}://{namespace}",
        )
        for cls in VARIANTS
    ]


def describe(scheme: str) -> str | None:
    """The bug a scheme names (the class docstring), or None if it is not one of these."""
    for cls in VARIANTS:
        if cls.scheme == scheme:
            return (cls.__doc__ or "").strip()
    return None
