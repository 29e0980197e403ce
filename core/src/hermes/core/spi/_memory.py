"""The memory driver: an in-process broker for tests and the conformance kit's self-test."""

from __future__ import annotations

import collections
import heapq
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hermes.core.spi import _limits as limits
from hermes.core.spi._browse import BrowsePage, page_of
from hermes.core.spi._consumer import Consumer, Received
from hermes.core.spi._driver import (
    DEFAULT_PRIORITY,
    Capabilities,
    Delay,
    Delivery,
    Driver,
    QueueStats,
)
from hermes.core.spi._outgoing import Outgoing
from hermes.core.spi._registry import DriverPlugin, hookimpl
from hermes.core.spi._url import DriverUrl

#: Claims held before the expired ones are swept out.
_CLAIMS_BEFORE_SWEEP = 10_000

#: How long a message whose consumer closed with it unsettled stays in flight.
REDELIVERY_TIMEOUT_S = 1.0


@dataclass(eq=False)
class _Lease:
    """One body taken from a queue and not yet settled: a :class:`Received`'s token."""

    priority: int
    body: str | bytes
    #: ``time.monotonic()`` at which the broker hands it out again; None while an
    #: open consumer holds it (its worker is alive, as a connection would say).
    expires_at: float | None = None
    #: It went back to its queue, was settled, or its broker was cleared:
    #: settling it again does nothing (a stale receipt).
    over: bool = False


class _Broker:
    """The queues of one ``memory://NAME``, shared by every driver object of that name."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        #: Job records have a lock of their own: a record written wakes its
        #: waiters, not every idle consumer.
        self.records_changed = threading.Condition()
        self.sequence = itertools.count()
        self.clear()

    def clear(self) -> None:
        """Forget every message and every extra priority queue (the caller holds the lock)."""
        self.queues: dict[int, deque[str | bytes]] = {DEFAULT_PRIORITY: deque()}
        #: (execute_at, sequence, priority, data): held until due.
        self.scheduled: list[tuple[float, int, int, str | bytes]] = []
        #: Bodies that were not Hermes messages, with the reason.
        self.dead_letters: list[tuple[str | bytes, str]] = []
        #: priority -> bodies taken by a consumer and not yet settled.
        self.in_flight: collections.Counter[int] = collections.Counter()
        for lease in getattr(self, "held", ()):
            lease.over = True  # taken before the clear: gone with everything else
        #: Every lease not yet over.
        self.held: set[_Lease] = set()
        #: The held leases that run out (their consumer closed): in flight until then.
        self.expiring: list[_Lease] = []
        #: priority -> bodies set aside.
        self.set_aside: collections.Counter[int] = collections.Counter()
        #: Claim key -> when it expires (``time.monotonic()``).
        self.claims: dict[str, float] = {}
        #: Body -> how many times a consumer took it without settling it for good
        #: (acknowledged or rejected); keyed by the body, as a Redis lease counts.
        self.deliveries: dict[str | bytes, int] = {}
        #: Worker id -> (when its heartbeat expires, ``time.monotonic()``; the record as JSON).
        self.heartbeats: dict[str, tuple[float, str]] = {}
        #: Job record key -> (when it expires, ``time.monotonic()``; its bytes; its
        #: place, from :attr:`sequence` at its creation). Insertion order is creation
        #: order: a write keeps a key's place, an expired key is deleted before a new one.
        self.records: dict[str, tuple[float, bytes, int]] = {}
        #: Limit key -> its state (see :mod:`hermes.core.spi._limits`).
        self.limits: dict[str, limits.State] = {}
        #: key -> (expires at, monotonic; member -> value): the tallies of SupportsTally.
        self.tallies: dict[str, tuple[float, dict[str, bytes]]] = {}

    def move_due(self, now: float) -> None:
        while self.scheduled and self.scheduled[0][0] <= now:
            _, _, priority, data = heapq.heappop(self.scheduled)
            self.queues.setdefault(priority, deque()).append(data)

    def take(self, priority: int, body: str | bytes, expires_at: float | None) -> _Lease:
        lease = _Lease(priority, body, expires_at)
        self.held.add(lease)
        self.in_flight[priority] += 1
        if expires_at is not None:
            self.expiring.append(lease)
        return lease

    def end(self, lease: _Lease) -> bool:
        """The lease is over (settled or expired); False if it already was."""
        if lease.over:
            return False
        lease.over = True
        self.held.discard(lease)
        if lease.expires_at is not None:
            self.expiring.remove(lease)
        self.in_flight[lease.priority] -= 1
        return True

    def expire(self, now: float) -> float | None:
        """Put bodies whose lease ran out back at the head of their queue; the next expiry."""
        later: list[float] = []
        for lease in list(self.expiring):
            assert lease.expires_at is not None  # only expiring leases are listed
            if lease.expires_at > now:
                later.append(lease.expires_at)
                continue
            self.end(lease)
            queue = self.queues.get(lease.priority)
            if queue is not None:
                queue.appendleft(lease.body)
        return min(later, default=None)


_brokers: dict[str, _Broker] = {}
_brokers_lock = threading.Lock()


def _broker(name: str) -> _Broker:
    with _brokers_lock:
        return _brokers.setdefault(name, _Broker())


class MemoryDriver(Driver):
    """Queues in this process's memory: nothing crosses a process boundary.

    Every ``MemoryDriver(name)`` with the same ``name`` shares one broker, so an
    Emitter and a Dispatcher in one process can each ``connect("memory://jobs")``.
    Messages are stored serialized, so the serializer is exercised as on a real
    broker. Removal happens after the callback returns (at-least-once): a
    callback that raises leaves its message at the head of its queue.

    A taken message is in flight while its consumer is open, however long its
    handler runs (the consumer is the worker's connection). A consumer closed
    with messages unsettled -- handlers that outlived the grace period -- does
    not give them back: they return to the head of their queue
    ``redelivery_timeout_s`` later, as a broker's lease would run out.
    """

    capabilities = Capabilities(
        delivery=Delivery.AT_LEAST_ONCE,
        delay=Delay.NATIVE,
        priorities=True,
        competing_consumers=True,
        cross_process=False,
        max_message_bytes=16 * 1024 * 1024,
        counts_deliveries=True,
        redelivery_timeout_s=REDELIVERY_TIMEOUT_S,
        wake_up_s=0.0,
    )

    def __init__(
        self, name: str = "default", *, redelivery_timeout_s: float = REDELIVERY_TIMEOUT_S
    ) -> None:
        if not redelivery_timeout_s >= 0:
            raise ValueError(f"redelivery_timeout_s must be >= 0, got {redelivery_timeout_s!r}")
        #: The broker name: ``memory://NAME``.
        self.name = name
        self._broker = _broker(name)
        if redelivery_timeout_s != type(self).capabilities.redelivery_timeout_s:
            self.capabilities = replace(
                type(self).capabilities, redelivery_timeout_s=redelivery_timeout_s
            )

    def setup_priority_queue(self, name: str, priority: int) -> None:
        with self._broker.condition:
            self._broker.queues.setdefault(priority, deque())

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        broker = self._broker
        with broker.condition:
            if priority not in broker.queues:
                raise self.unknown_priority(priority, broker.queues)
            now = time.time()
            for item in items:
                if item.execute_at is not None and item.execute_at > now:
                    entry = (item.execute_at, next(broker.sequence), priority, item.body)
                    heapq.heappush(broker.scheduled, entry)
                else:
                    broker.queues[priority].append(item.body)
            broker.condition.notify_all()

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        with self._broker.condition:
            self.check_priorities(self._broker.queues, priorities)
        return _MemoryConsumer(self, priorities)

    def queue_stats(self) -> list[QueueStats]:
        broker = self._broker
        with broker.condition:
            scheduled = collections.Counter(priority for _, _, priority, _ in broker.scheduled)
            return [
                QueueStats(
                    priority,
                    f"memory://{self.name}/{priority}",
                    ready=len(broker.queues[priority]),
                    scheduled=scheduled[priority],
                    in_flight=broker.in_flight[priority],
                    set_aside=broker.set_aside[priority],
                )
                for priority in sorted(broker.queues, reverse=True)
            ]

    def purge(self, priority: int | None = None) -> int:
        broker = self._broker
        with broker.condition:
            priorities = self.check_priorities(
                broker.queues, () if priority is None else [priority]
            )
            removed = 0
            for p in priorities:
                removed += len(broker.queues[p])
                broker.queues[p].clear()
            kept = [entry for entry in broker.scheduled if entry[2] not in priorities]
            removed += len(broker.scheduled) - len(kept)
            heapq.heapify(kept)
            broker.scheduled = kept
            return removed

    def claim(self, key: str, ttl_s: float) -> bool:
        """Set ``key`` unless it is held; True when this caller won it (see ``SupportsClaim``)."""
        if not ttl_s > 0:
            raise ValueError(f"a claim's ttl_s must be > 0, got {ttl_s!r}")
        broker = self._broker
        now = time.monotonic()
        with broker.condition:
            if broker.claims.get(key, now) > now:
                return False
            broker.claims[key] = now + ttl_s
            if len(broker.claims) > _CLAIMS_BEFORE_SWEEP:
                # Tick keys are never claimed again: forget the expired ones now
                # and then, so a long test run does not grow without bound.
                broker.claims = {k: at for k, at in broker.claims.items() if at > now}
            return True

    def beat(self, record: Mapping[str, Any], ttl_s: float) -> None:
        """Keep ``record`` for ``ttl_s`` seconds (see ``SupportsHeartbeats``)."""
        if not ttl_s > 0:
            raise ValueError(f"a heartbeat's ttl_s must be > 0, got {ttl_s!r}")
        # Kept as JSON, as a broker would: a record that is not JSON-able fails here
        # in tests too, and a reader never shares the publisher's dict.
        text = json.dumps(record)
        with self._broker.condition:
            self._broker.heartbeats[str(record["id"])] = (time.monotonic() + ttl_s, text)

    def forget(self, worker_id: str) -> None:
        with self._broker.condition:
            self._broker.heartbeats.pop(worker_id, None)

    def heartbeats(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self._broker.condition:
            beats = self._broker.heartbeats
            for worker_id in [w for w, (expires, _) in beats.items() if expires <= now]:
                del beats[worker_id]
            texts = [text for _, text in beats.values()]
        return [json.loads(text) for text in texts]

    def limit_take(
        self, key: str, rule: limits.LimitRule, slot: str, charged: bool, lease_s: float
    ) -> limits.Take:
        """Decide one start under ``rule`` (see ``SupportsLimits``)."""
        with self._broker.condition:
            state = self._broker.limits.setdefault(key, limits.fresh())
            return limits.take(state, rule, slot, charged, lease_s, time.time())

    def limit_release(self, key: str, slot: str) -> None:
        with self._broker.condition:
            state = self._broker.limits.get(key)
            if state is not None:
                limits.release(state, slot, time.time())

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        with self._broker.condition:
            state = self._broker.limits.get(key)
            return state is not None and limits.renew(state, slot, lease_s, time.time())

    def limit_scan(self, limit: int) -> list[tuple[str, bytes]]:
        now = time.time()
        with self._broker.condition:
            kept = {k: v for k, v in self._broker.limits.items() if limits.keep_for(v, now) > 0}
            self._broker.limits = kept
            return [(key, limits.encode(state)) for key, state in list(kept.items())[:limit]]

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        """Add ``member`` once (see ``SupportsTally``)."""
        if not ttl_s > 0:
            raise ValueError(f"a tally's ttl_s must be > 0, got {ttl_s!r}")
        now = time.monotonic()
        with self._broker.condition:
            tallies = self._broker.tallies
            kept = tallies.get(key)
            if kept is None or kept[0] <= now:
                kept = tallies[key] = (now, {})
            members = kept[1]
            added = member not in members
            if added:
                members[member] = bytes(value)
            tallies[key] = (now + ttl_s, members)
            if len(tallies) > _CLAIMS_BEFORE_SWEEP:
                self._broker.tallies = {k: v for k, v in tallies.items() if v[0] > now}
            return added, len(members)

    def tally_read(self, key: str) -> dict[str, bytes]:
        with self._broker.condition:
            kept = self._broker.tallies.get(key)
            if kept is None or kept[0] <= time.monotonic():
                return {}
            return dict(kept[1])

    def record_get(self, key: str) -> bytes | None:
        with self._broker.records_changed:
            return self._record(key)

    def _record(self, key: str) -> bytes | None:
        stored = self._broker.records.get(key)
        if stored is None:
            return None
        if stored[0] <= time.monotonic():
            del self._broker.records[key]
            return None
        return stored[1]

    def record_put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        """Compare-and-set ``key`` (see ``SupportsRecords``)."""
        if not ttl_s > 0:
            raise ValueError(f"a record's ttl_s must be > 0, got {ttl_s!r}")
        broker = self._broker
        with broker.records_changed:
            if self._record(key) != expect:
                return False
            kept = broker.records.get(key)
            place = next(broker.sequence) if kept is None else kept[2]
            broker.records[key] = (time.monotonic() + ttl_s, bytes(value), place)
            if len(broker.records) > _CLAIMS_BEFORE_SWEEP:
                now = time.monotonic()
                broker.records = {k: v for k, v in broker.records.items() if v[0] > now}
            broker.records_changed.notify_all()
            return True

    def record_wait(self, key: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        with self._broker.records_changed:
            while True:
                current = self._record(key)
                left = deadline - time.monotonic()
                if current != seen or left <= 0:
                    return current
                self._broker.records_changed.wait(left)

    def record_wait_any(
        self, seen: Mapping[str, bytes | None], timeout_s: float
    ) -> dict[str, bytes | None]:
        deadline = time.monotonic() + timeout_s
        with self._broker.records_changed:
            while True:
                changed = {
                    key: current
                    for key, was in seen.items()
                    if (current := self._record(key)) != was
                }
                left = deadline - time.monotonic()
                if changed or left <= 0:
                    return changed
                self._broker.records_changed.wait(left)

    def record_scan(self, limit: int) -> list[bytes]:
        now = time.monotonic()
        with self._broker.records_changed:
            # Insertion order is write order; the newest last.
            live = [kept[1] for kept in self._broker.records.values() if kept[0] > now]
        return live[::-1][:limit]

    def record_page(
        self, after: str | None, limit: int, max_bytes: int, *, oldest_first: bool = False
    ) -> BrowsePage:
        """Records in creation order past ``after`` (see ``SupportsRecordPages``)."""
        past = _place(after)
        now = time.monotonic()
        with self._broker.records_changed:
            kept = list(self._broker.records.items())
        if not oldest_first:
            kept.reverse()
        places = {
            key: place
            for key, (expires, _, place) in kept
            if expires > now and (past is None or (place > past if oldest_first else place < past))
        }
        listed = ((key, kept_value[1]) for key, kept_value in kept if key in places)
        taken = page_of(listed, max(1, limit), max_bytes)
        more = len(taken) < len(places)
        return BrowsePage(taken, str(places[str(taken[-1][0])]) if more else None)

    def teardown(self) -> None:
        # Cleared in place: every driver object of this name (a worker's, an
        # emitter's) sees the same empty broker afterwards, not two diverging ones.
        with self._broker.condition:
            self._broker.clear()
            self._broker.condition.notify_all()

    def __repr__(self) -> str:
        return f"<MemoryDriver memory://{self.name}>"


class _MemoryConsumer(Consumer):
    """Pops under the broker's lock; a released body goes back to the head of its queue.

    :meth:`close` gives nothing back: what is still unsettled stays in flight
    for ``redelivery_timeout_s``, then returns to the head of its queue.
    """

    def __init__(self, driver: MemoryDriver, priorities: Sequence[int]) -> None:
        self.driver = driver
        self.broker = driver._broker
        #: Empty: every queue, including one an emitter sets up meanwhile.
        self.priorities = priorities
        #: Taken and not yet settled.
        self.unsettled: set[Received] = set()

    def receive(self, timeout_s: float) -> Received | None:
        broker = self.broker
        deadline = time.monotonic() + timeout_s
        with broker.condition:
            while True:
                order = self.driver.check_priorities(broker.queues, self.priorities)
                now = time.time()
                next_expiry = broker.expire(time.monotonic())
                broker.move_due(now)
                for priority in order:
                    queue = broker.queues.get(priority)
                    if queue:
                        body = queue.popleft()
                        count = broker.deliveries[body] = broker.deliveries.get(body, 0) + 1
                        lease = broker.take(priority, body, self.lease_expiry())
                        received = Received(body, priority, lease, delivery_count=count)
                        self.unsettled.add(received)
                        return received
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if broker.scheduled:
                    left = min(left, max(0.0, broker.scheduled[0][0] - now))
                if next_expiry is not None:
                    left = min(left, max(0.0, next_expiry - time.monotonic()))
                broker.condition.wait(left)

    def lease_expiry(self) -> float | None:
        """When a body taken now is handed out again: never while this consumer is open."""
        return None

    def _settle(self, received: Received) -> bool:
        """End ``received``'s lease (the caller holds the lock); False if it was over.

        A lease runs out only after its consumer closed; a late settle of one
        still held works, one that ran out does nothing (it is back on its queue).
        """
        if received not in self.unsettled:
            return False  # settled already
        self.unsettled.discard(received)
        lease: _Lease = received.token
        return self.broker.end(lease)

    def ack(self, received: Received) -> None:
        with self.broker.condition:
            if self._settle(received):
                self.broker.deliveries.pop(received.body, None)

    def release(self, received: Received) -> None:
        with self.broker.condition:
            if not self._settle(received):
                return
            queue = self.broker.queues.get(received.priority)
            if queue is not None:  # else purged meanwhile: gone with the rest
                queue.appendleft(received.body)
            self.broker.condition.notify_all()

    def reject(self, received: Received, reason: str) -> None:
        with self.broker.condition:
            self._settle(received)
            self.broker.deliveries.pop(received.body, None)
            self.broker.dead_letters.append((received.body, reason))
            self.broker.set_aside[received.priority] += 1

    def close(self) -> None:
        # Unsettled here means a handler outlived the grace period and may still
        # run: giving its message back now would let another worker run it too.
        # It stays in flight until its lease runs out, as on a broker with leases.
        broker = self.broker
        expires_at = time.monotonic() + self.driver.capabilities.redelivery_timeout_s
        with broker.condition:
            for received in self.unsettled:
                lease: _Lease = received.token
                if not lease.over and lease.expires_at is None:
                    lease.expires_at = expires_at
                    broker.expiring.append(lease)
            broker.condition.notify_all()


class _MemoryBrowser:
    """The bodies waiting on a memory broker (queued and scheduled), without taking them."""

    def __init__(self, driver: Driver) -> None:
        assert isinstance(driver, MemoryDriver)
        self.broker = driver._broker

    def entries(self) -> Iterator[tuple[Hashable, str | bytes]]:
        for _, body in self._bodies():
            yield id(body), body

    def _bodies(self) -> list[tuple[int, str | bytes]]:
        """``(priority, body)`` of each queued message, highest priority first, then the
        scheduled ones in due order."""
        with self.broker.condition:
            queues = sorted(self.broker.queues.items(), key=lambda item: -item[0])
            queued = [(priority, body) for priority, queue in queues for body in queue]
            queued += [(p, body) for _, _, p, body in sorted(self.broker.scheduled)]
        return queued

    def page(self, after: str | None, limit: int, max_bytes: int) -> BrowsePage:
        start = int(after) if after else 0
        bodies = self._bodies()
        priority: dict[Hashable, int] = {id(body): p for p, body in bodies}
        taken = page_of(((id(b), b) for _, b in bodies[start:]), limit, max_bytes)
        more = start + len(taken) < len(bodies)
        shown = {entry: priority[entry] for entry, _ in taken}
        return BrowsePage(taken, str(start + len(taken)) if more else None, shown)

    def remove(self, entry: Hashable) -> bool:
        broker = self.broker
        with broker.condition:
            for queue in broker.queues.values():
                for body in queue:
                    if id(body) == entry:
                        queue.remove(body)
                        return True
            for item in broker.scheduled:
                if id(item[3]) == entry:
                    broker.scheduled.remove(item)
                    heapq.heapify(broker.scheduled)
                    return True
        return False


def _from_url(url: DriverUrl) -> MemoryDriver:
    url.reject_unknown(())
    return MemoryDriver(url.host or url.path or "default")


def _isolate(url: DriverUrl, namespace: str) -> str:
    return f"memory://{namespace}"


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        DriverPlugin(
            name="memory",
            schemes=("memory",),
            factory=_from_url,
            capabilities=MemoryDriver.capabilities,
            isolate=_isolate,
            example_url="memory://jobs",
            browse=_MemoryBrowser,
        )
    ]


def _place(after: str | None) -> int | None:
    """The place a memory record page's ``next`` names; None from the start."""
    if after is None:
        return None
    try:
        return int(after)
    except ValueError:
        raise ValueError(f"not a page of this store's job records: {after!r}") from None
