"""Deliberately broken limit stores: the kit's limits row must fail each of them.

Loaded into the kit's runs with ``--hermes-plugin broken_limits``; each is a
memory driver whose ``limit_*`` methods have one bug, named by its URL scheme.
One is sound: ``limits-in-sqlite`` keeps its limits in an SQLite file that
every process opens, the control for the row's processes (the memory driver
keeps its limits in the process).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import replace

from broken_claim import BrokenMemory, describe_variant, memory_plugin

from hermes.core import hookimpl
from hermes.core.driver import DriverPlugin, LimitRule, Take
from hermes.core.drivertools import limit_state
from hermes.core.spi._memory import MemoryDriver


class TakesWithoutALock(BrokenMemory):
    """Reads a key's state, decides, and writes it back a round trip later, with no
    lock or transaction around the three: takers racing all read the same state, and
    more start than the limit allows."""

    scheme = "limits-not-atomic"

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        with self._broker.condition:
            stored = self._broker.limits.get(key)
            raw = limit_state.encode(stored) if stored is not None else None
        state = limit_state.decode(raw)
        answer = limit_state.take(state, rule, slot, charged, lease_s, time.time())
        time.sleep(0.05)  # the write goes back later: the other takers read meanwhile
        with self._broker.condition:
            self._broker.limits[key] = state
        return answer


class LeasesNeverRunOut(BrokenMemory):
    """Holds every slot for a day, whatever lease it is taken or renewed with: a dead
    worker's slot is never free again."""

    scheme = "limits-lease-forever"

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        return super().limit_take(key, rule, slot, charged, 86400.0)

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        return super().limit_renew(key, slot, 86400.0)


class RenewDoesNothing(BrokenMemory):
    """``limit_renew`` says whether the slot is held and leaves its lease as it was: a
    job longer than its lease loses its slot while it runs."""

    scheme = "limits-renew-does-nothing"

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        with self._broker.condition:
            state = self._broker.limits.get(key)
            held = state["slots"].get(slot) if state is not None else None
            return held is not None and held[0] > time.time()


class ChargesTwice(BrokenMemory):
    """Ignores ``charged``: a job that comes back at its reserved turn is charged again,
    and waits another interval."""

    scheme = "limits-charges-twice"

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        return super().limit_take(key, rule, slot, False, lease_s)


class NoReservation(BrokenMemory):
    """A take refused for the rate is told when the next turn comes but reserves
    nothing: every job refused at once is given the same turn, and they all come back
    together."""

    scheme = "limits-no-reservation"

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        with self._broker.condition:
            state = self._broker.limits.setdefault(key, limit_state.fresh())
            tat = state["tat"]
            answer = limit_state.take(state, rule, slot, charged, lease_s, time.time())
            if answer.wait_s > 0 and answer.charged and not charged:
                state["tat"] = tat
            return answer


class ListsTurnsItDidNotReserve(BrokenMemory):
    """Answers a take refused for the rate with the further turns ``reserve`` asks for, but
    moves the rate on by one turn only: the turns it listed are given again to the next
    takers, and the rate runs over."""

    scheme = "limits-more-not-reserved"

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        answer = super().limit_take(key, replace(rule, reserve=1), slot, charged, lease_s)
        if answer.wait_s > 0 and answer.charged and not charged and rule.interval_s:
            more = [answer.wait_s + n * rule.interval_s for n in range(1, rule.reserve)]
            return answer._replace(more=tuple(more))
        return answer


class ChargesSlotWaiters(BrokenMemory):
    """Charges the rate before it looks at the slots: a job that waits for a slot uses
    up a turn, and the rate runs slower than it says whenever the slots are full."""

    scheme = "limits-charges-slot-waiters"

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        now = time.time()
        with self._broker.condition:
            state = self._broker.limits.setdefault(key, limit_state.fresh())
            held = [lease for lease in state["slots"].values() if lease[0] > now]
            full = rule.concurrency is not None and len(held) >= rule.concurrency
            if full and rule.interval_s is not None and not charged:
                state["tat"] = max(state["tat"], now) + rule.interval_s
                charged = True
            return limit_state.take(state, rule, slot, charged, lease_s, now)


class ExpiresByTheRate(BrokenMemory):
    """Keeps a key only until its rate's next turn, as a store whose expiry is set from
    that alone would: a key with slots held and no turn to come is forgotten at once,
    and its slots with it."""

    scheme = "limits-expire-by-rate"

    def _sweep(self) -> None:
        now = time.time()
        with self._broker.condition:
            kept = {k: v for k, v in self._broker.limits.items() if v["tat"] > now}
            self._broker.limits = kept

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        self._sweep()
        return super().limit_take(key, rule, slot, charged, lease_s)

    def limit_release(self, key: str, slot: str) -> None:
        self._sweep()
        super().limit_release(key, slot)

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        self._sweep()
        return super().limit_renew(key, slot, lease_s)

    def limit_scan(self, limit: int) -> list[tuple[str, bytes]]:
        self._sweep()
        return super().limit_scan(limit)


class ScanNeverForgets(BrokenMemory):
    """``limit_scan`` lists every key ever used, those that say nothing any more too:
    the keys of a fleet pile up for ever."""

    scheme = "limits-scan-never-forgets"

    def limit_scan(self, limit: int) -> list[tuple[str, bytes]]:
        with self._broker.condition:
            states = list(self._broker.limits.items())[:limit]
            return [(key, limit_state.encode(state)) for key, state in states]


#: Every namespace's limits, by key alone (the bug of SharedNamespace).
_shared: dict[str, limit_state.State] = {}
_shared_lock = threading.Lock()


class SharedNamespace(BrokenMemory):
    """Keeps limit keys outside its namespace: two namespaces on one broker share every
    key of the same name, its slots and its rate."""

    scheme = "limits-shared-namespace"

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        with _shared_lock:
            state = _shared.setdefault(key, limit_state.fresh())
            return limit_state.take(state, rule, slot, charged, lease_s, time.time())

    def limit_release(self, key: str, slot: str) -> None:
        with _shared_lock:
            if key in _shared:
                limit_state.release(_shared[key], slot, time.time())

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        with _shared_lock:
            state = _shared.get(key)
            return state is not None and limit_state.renew(state, slot, lease_s, time.time())

    def limit_scan(self, limit: int) -> list[tuple[str, bytes]]:
        now = time.time()
        with _shared_lock:
            live = [(k, v) for k, v in _shared.items() if limit_state.keep_for(v, now) > 0]
            return [(key, limit_state.encode(state)) for key, state in live[:limit]]


class LimitsInProcess(BrokenMemory):
    """Declares itself cross-process but keeps limits in the process (a dict): every
    process has its own slots, and each lets the whole limit run."""

    scheme = "limits-in-process"
    capabilities = replace(MemoryDriver.capabilities, cross_process=True)


class LimitsInSqlite(BrokenMemory):
    """Sound: limits in an SQLite file that every process opens, each change in one
    transaction (the control for the limits row's processes; its messages stay in the
    process)."""

    scheme = "limits-in-sqlite"
    capabilities = replace(MemoryDriver.capabilities, cross_process=True)

    def _db(self) -> sqlite3.Connection:
        base = os.environ.get("BROKEN_DRIVERS_DIR") or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        path = os.path.join(base, f"limits-{self.name}.db")
        db = sqlite3.connect(path, timeout=30, isolation_level=None)
        db.execute(
            "CREATE TABLE IF NOT EXISTS limits (key TEXT PRIMARY KEY, state BLOB, until REAL)"
        )
        return db

    @contextmanager
    def _state(self, key: str) -> Iterator[tuple[limit_state.State, float]]:
        """The state of ``key`` and the time, in one write transaction; written back after."""
        with closing(self._db()) as db:
            db.execute("BEGIN IMMEDIATE")  # one writer at a time, across processes
            try:
                now = time.time()
                sql = "SELECT state FROM limits WHERE key = ? AND until > ?"
                row = db.execute(sql, (key, now)).fetchone()
                state = limit_state.decode(bytes(row[0]) if row is not None else None)
                yield state, now
                keep_s = limit_state.keep_for(state, now)
                if keep_s > 0:
                    sql = "INSERT OR REPLACE INTO limits (key, state, until) VALUES (?, ?, ?)"
                    db.execute(sql, (key, limit_state.encode(state), now + keep_s))
                else:
                    db.execute("DELETE FROM limits WHERE key = ?", (key,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        with self._state(key) as (state, now):
            return limit_state.take(state, rule, slot, charged, lease_s, now)

    def limit_release(self, key: str, slot: str) -> None:
        with self._state(key) as (state, now):
            limit_state.release(state, slot, now)

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        with self._state(key) as (state, now):
            return limit_state.renew(state, slot, lease_s, now)

    def limit_scan(self, limit: int) -> list[tuple[str, bytes]]:
        with closing(self._db()) as db:
            sql = "SELECT key, state FROM limits WHERE until > ? LIMIT ?"
            return [(key, bytes(state)) for key, state in db.execute(sql, (time.time(), limit))]

    def teardown(self) -> None:
        super().teardown()
        with closing(self._db()) as db:
            db.execute("DELETE FROM limits")


VARIANTS: list[type[BrokenMemory]] = [
    TakesWithoutALock,
    LeasesNeverRunOut,
    RenewDoesNothing,
    ChargesTwice,
    NoReservation,
    ListsTurnsItDidNotReserve,
    ChargesSlotWaiters,
    ExpiresByTheRate,
    ScanNeverForgets,
    SharedNamespace,
    LimitsInProcess,
    LimitsInSqlite,
]


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [memory_plugin(cls.scheme, cls) for cls in VARIANTS]


def describe(scheme: str) -> str | None:
    """The bug a scheme names (the class docstring), or None if it is not one of these."""
    return describe_variant(VARIANTS, scheme)
