"""Deliberately broken claims: the kit's claim row must fail each of them.

Loaded into the kit's runs with ``--hermes-plugin broken_claim``; each is a
memory driver whose ``claim`` has one bug, named by its URL scheme. One is
sound: ``claims-in-sqlite`` keeps its claims in an SQLite file that every
process opens, the control for the row's processes (the memory driver keeps
its claims in the process), which start knowing its scheme only from the
``--hermes-plugin`` modules the kit was given.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import replace

from hermes.core import hookimpl
from hermes.core.driver import DriverPlugin, DriverUrl
from hermes.core.spi._memory import MemoryDriver

#: Every broken driver's claims, by key: when each expires (monotonic seconds).
_claims: dict[str, float] = {}
_lock = threading.Lock()


class NotAtomic(MemoryDriver):
    """Looks, then sets, with a gap between: concurrent claimers all see the key free."""

    def claim(self, key: str, ttl_s: float) -> bool:
        now = time.monotonic()
        if _claims.get(self.name + key, now) > now:
            return False
        time.sleep(0.01)  # another claimer looks meanwhile
        _claims[self.name + key] = now + ttl_s
        return True


class NeverExpires(MemoryDriver):
    """Ignores the ttl: a claim once won is held for ever."""

    def claim(self, key: str, ttl_s: float) -> bool:
        with _lock:
            if self.name + key in _claims:
                return False
            _claims[self.name + key] = float("inf")
            return True


class ExpiresAtOnce(MemoryDriver):
    """Ignores the ttl the other way: a claim is free again a moment after it was won."""

    def claim(self, key: str, ttl_s: float) -> bool:
        now = time.monotonic()
        with _lock:
            if _claims.get(self.name + key, now) > now:
                return False
            _claims[self.name + key] = now + 0.05
            return True


class ClaimsInProcess(MemoryDriver):
    """Declares itself cross-process but keeps claims in the process (a dict): every
    process wins every key."""

    capabilities = replace(MemoryDriver.capabilities, cross_process=True)


class ClaimsInSqlite(MemoryDriver):
    """Sound: claims in an SQLite file that every process opens, each in one write
    transaction (its messages stay in the process)."""

    capabilities = replace(MemoryDriver.capabilities, cross_process=True)

    def _db(self) -> sqlite3.Connection:
        base = os.environ.get("BROKEN_DRIVERS_DIR") or tempfile.gettempdir()
        db = sqlite3.connect(os.path.join(base, f"claims-{self.name}.db"), timeout=30)
        db.isolation_level = None
        db.execute("CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, until REAL)")
        return db

    def claim(self, key: str, ttl_s: float) -> bool:
        with closing(self._db()) as db:
            db.execute("BEGIN IMMEDIATE")  # one claimer at a time, across processes
            now = time.time()
            row = db.execute("SELECT until FROM claims WHERE key = ?", (key,)).fetchone()
            won = row is None or row[0] <= now
            if won:
                sql = "INSERT OR REPLACE INTO claims (key, until) VALUES (?, ?)"
                db.execute(sql, (key, now + ttl_s))
            db.execute("COMMIT")
            return won

    def teardown(self) -> None:
        super().teardown()
        with closing(self._db()) as db:
            db.execute("DELETE FROM claims")


BROKEN = {
    "claim-not-atomic": NotAtomic,
    "claim-never-expires": NeverExpires,
    "claim-expires-at-once": ExpiresAtOnce,
    "claims-in-process": ClaimsInProcess,
    "claims-in-sqlite": ClaimsInSqlite,
}


class BrokenMemory(MemoryDriver):
    """A memory driver with one bug, named by its URL scheme (the limits and tally rows')."""

    #: The URL scheme, which names the bug.
    scheme = ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.scheme}://{self.name}>"


def describe_variant(variants: Sequence[type[BrokenMemory]], scheme: str) -> str | None:
    """The bug ``scheme`` names among ``variants`` (its class docstring), or None."""
    for cls in variants:
        if cls.scheme == scheme:
            return " ".join((cls.__doc__ or "").split())
    return None


def memory_plugin(scheme: str, cls: type[MemoryDriver]) -> DriverPlugin:
    """The plugin of ``scheme``: a broken variant ``cls`` of the memory driver.

    The broken stores of the heartbeat, limits and tally rows register theirs with it too.
    """

    def build(url: DriverUrl) -> MemoryDriver:
        return cls(f"{scheme}-{url.host or url.path or 'default'}")

    return DriverPlugin(
        name=scheme,
        schemes=(scheme,),
        factory=build,
        capabilities=cls.capabilities,
        isolate=lambda url, namespace: f"{scheme}://{namespace}",
        example_url=f"{scheme}://jobs",
    )


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [memory_plugin(scheme, cls) for scheme, cls in BROKEN.items()]
