"""Deliberately broken tallies: the kit's tally row must fail each of them.

Loaded into the kit's runs with ``--hermes-plugin broken_tally``; each is a
memory driver whose ``tally_*`` methods have one bug, named by its URL scheme.
One is sound: ``tally-in-sqlite`` keeps its tallies in an SQLite file that
every process opens, the control for the row's processes (the memory driver
keeps its tallies in the process).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from contextlib import closing
from dataclasses import replace
from typing import ClassVar

from broken_claim import BrokenMemory, describe_variant, memory_plugin

from hermes.core import hookimpl
from hermes.core.driver import DriverPlugin
from hermes.core.spi._memory import MemoryDriver


class CountsWithoutALock(BrokenMemory):
    """Reads the set, adds the member, and writes the set back a moment later, with no
    lock around the three: adders racing all read the same set, members are lost, and
    no call sees the full count (a group that never ends)."""

    scheme = "tally-not-atomic"

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        with self._broker.condition:
            kept = self._broker.tallies.get(key)
            live = kept is not None and kept[0] > time.monotonic()
            members = dict(kept[1]) if kept is not None and live else {}
        added = member not in members
        if added:
            members[member] = bytes(value)
        time.sleep(0.001)  # the write goes back later: the other adders read meanwhile
        with self._broker.condition:
            self._broker.tallies[key] = (time.monotonic() + ttl_s, members)
        return added, len(members)


class LastValueWins(BrokenMemory):
    """A member added again replaces its value (and says it was not added)."""

    scheme = "tally-last-value-wins"

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        added, count = super().tally_add(key, member, value, ttl_s)
        with self._broker.condition:
            self._broker.tallies[key][1][member] = bytes(value)
        return added, count


class SaysAddedEveryTime(BrokenMemory):
    """Every add says it added the member, so every copy of a group's member would
    decide as if it were the first."""

    scheme = "tally-always-added"

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        _, count = super().tally_add(key, member, value, ttl_s)
        return True, count


class NeverExpires(BrokenMemory):
    """Keeps every set for a day, whatever ttl it is added with."""

    scheme = "tally-never-expires"

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        return super().tally_add(key, member, value, 86400.0)


class SharedNamespace(BrokenMemory):
    """Keeps every namespace's sets in one place: a key of one namespace is the same
    set in every other."""

    scheme = "tally-shared-namespace"
    _all: ClassVar[dict[str, tuple[float, dict[str, bytes]]]] = {}

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        with self._broker.condition:
            self._broker.tallies = SharedNamespace._all
            return super().tally_add(key, member, value, ttl_s)

    def tally_read(self, key: str) -> dict[str, bytes]:
        with self._broker.condition:
            self._broker.tallies = SharedNamespace._all
            return super().tally_read(key)


class TallyInProcess(BrokenMemory):
    """Claims its tallies are shared by processes, and keeps them in the process: members
    added by other processes are never seen."""

    scheme = "tally-in-process"
    capabilities = replace(MemoryDriver.capabilities, cross_process=True)


class TallyInSqlite(BrokenMemory):
    """Sound: tallies in an SQLite file that every process opens, each add in one
    transaction (the control for the tally row's processes)."""

    scheme = "tally-in-sqlite"
    capabilities = replace(MemoryDriver.capabilities, cross_process=True)

    def _db(self) -> sqlite3.Connection:
        base = os.environ.get("BROKEN_DRIVERS_DIR") or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        db = sqlite3.connect(
            os.path.join(base, f"tally-{self.name}.db"), timeout=30, isolation_level=None
        )
        db.execute(
            "CREATE TABLE IF NOT EXISTS tally (key TEXT, member TEXT, value BLOB, until REAL,"
            " PRIMARY KEY (key, member))"
        )
        return db

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        with closing(self._db()) as db:
            db.execute("BEGIN IMMEDIATE")  # one writer at a time, across processes
            try:
                now = time.time()
                db.execute("DELETE FROM tally WHERE key = ? AND until <= ?", (key, now))
                sql = "INSERT OR IGNORE INTO tally (key, member, value, until) VALUES (?, ?, ?, ?)"
                added = db.execute(sql, (key, member, bytes(value), now + ttl_s)).rowcount == 1
                db.execute("UPDATE tally SET until = ? WHERE key = ?", (now + ttl_s, key))
                (count,) = db.execute("SELECT count(*) FROM tally WHERE key = ?", (key,)).fetchone()
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return added, int(count)

    def tally_read(self, key: str) -> dict[str, bytes]:
        with closing(self._db()) as db:
            sql = "SELECT member, value FROM tally WHERE key = ? AND until > ?"
            return {m: bytes(v) for m, v in db.execute(sql, (key, time.time())).fetchall()}


VARIANTS: list[type[BrokenMemory]] = [
    CountsWithoutALock,
    LastValueWins,
    SaysAddedEveryTime,
    NeverExpires,
    SharedNamespace,
    TallyInProcess,
    TallyInSqlite,
]


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [memory_plugin(cls.scheme, cls) for cls in VARIANTS]


def describe(scheme: str) -> str | None:
    """The bug a scheme names (the class docstring), or None if it is not one of these."""
    return describe_variant(VARIANTS, scheme)
