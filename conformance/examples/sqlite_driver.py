"""A complete Hermes driver in one file: messages in an SQLite table.

``sqlite:///path/to/jobs.db?table=hermes``. At-least-once: a worker leases a
row (``lease_until``), deletes it when the handlers are done, and a row whose
lease ran out (its worker died) is taken again. Register it with one entry
point::

    [project.entry-points.hermes]
    sqlite = "sqlite_driver"
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any

from hermes.core import BrokerRefusedError, BrokerUnavailableError, DriverError
from hermes.core.driver import (
    DEFAULT_PRIORITY,
    Capabilities,
    Consumer,
    Delay,
    Delivery,
    Driver,
    DriverPlugin,
    DriverUrl,
    Outgoing,
    Received,
    hookimpl,
)
from hermes.core.drivertools import LeaseKeeper, PerProcess

#: A taken row is handed out again this long after its worker stopped renewing it.
LEASE_S = 3.0
#: An idle worker looks at the table this often (SQLite cannot wake it).
POLL_S = 0.05


class SqliteDriver(Driver):
    capabilities = Capabilities(
        delivery=Delivery.AT_LEAST_ONCE,
        delay=Delay.NATIVE,
        priorities=True,
        competing_consumers=True,
        redelivery_timeout_s=LEASE_S,
        wake_up_s=POLL_S,
    )
    # Core turns these into Hermes errors around every call it makes.
    client_errors = (sqlite3.Error,)

    def __init__(self, path: str, table: str = "hermes") -> None:
        if not table.isidentifier():
            raise ValueError(f"table must be a plain identifier, got {table!r}")
        self.path, self.table = path, table
        self.priorities = {DEFAULT_PRIORITY}
        # One connection per process (fork-safe), shared by its threads under a lock
        # made with it: a lock another thread held at a fork stays in the parent.
        self._connection = PerProcess(self._connect, lambda held: held[0].close())

    def classify_error(self, exc: BaseException) -> type[DriverError] | None:
        # One exception class, OperationalError, means both "cannot ever work"
        # and "try again"; only its text tells them apart.
        if isinstance(exc, sqlite3.OperationalError):
            if "unable to open database" in str(exc):
                return BrokerRefusedError  # a missing directory or no permission
            if "locked" in str(exc) or "busy" in str(exc):
                return BrokerUnavailableError  # another process holds the lock
        return super().classify_error(exc)

    def _connect(self) -> tuple[sqlite3.Connection, threading.Lock]:
        connection = sqlite3.connect(
            self.path, timeout=30, isolation_level=None, check_same_thread=False
        )
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} (id INTEGER PRIMARY KEY, "
            "priority INTEGER, due REAL, body BLOB, lease_until REAL)"
        )
        return connection, threading.Lock()

    def execute(self, sql: str, *args: Any) -> list[Any]:
        """Run one statement on this process's connection."""
        connection, lock = self._connection.get()
        with lock:
            return connection.execute(sql, args).fetchall()

    def setup_priority_queue(self, name: str, priority: int) -> None:
        self.priorities.add(priority)  # one table holds every priority

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        if priority not in self.priorities:
            raise self.unknown_priority(priority, self.priorities)
        rows = [(priority, item.execute_at or 0.0, item.body) for item in items]
        sql = f"INSERT INTO {self.table} (priority, due, body) VALUES (?, ?, ?)"
        connection, lock = self._connection.get()
        with lock:  # one statement for the whole batch: one transaction
            connection.executemany(sql, rows)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _SqliteConsumer(self, self.check_priorities(self.priorities, priorities))

    def teardown(self) -> None:
        self.execute(f"DROP TABLE IF EXISTS {self.table}")
        self._connection.discard()

    def close(self) -> None:
        self._connection.close()


class _SqliteConsumer(Consumer):
    """Takes a row by setting its lease; core's LeaseKeeper renews the rows in handlers."""

    def __init__(self, driver: SqliteDriver, order: list[int]) -> None:
        self.driver = driver
        self.marks = ",".join("?" * len(order))
        self.order = order
        self.held: set[int] = set()
        self.leases = LeaseKeeper(
            self._renew, LEASE_S / 3, f"the leases in {driver.path}", driver=driver
        )
        self.leases.start()

    def receive(self, timeout_s: float) -> Received | None:
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.time()
            rows = self.driver.execute(
                f"UPDATE {self.driver.table} SET lease_until = ? WHERE id = ("
                f"SELECT id FROM {self.driver.table} WHERE priority IN ({self.marks}) "
                "AND due <= ? AND (lease_until IS NULL OR lease_until < ?) "
                "ORDER BY priority DESC, due, id LIMIT 1) RETURNING id, priority, body",
                now + LEASE_S,
                *self.order,
                now,
                now,
            )
            if rows:
                row_id, priority, body = rows[0]
                self.held.add(row_id)
                return Received(body, priority, row_id)
            if time.monotonic() + POLL_S > deadline:
                return None
            time.sleep(POLL_S)

    def ack(self, received: Received) -> None:
        self.held.discard(received.token)
        self.driver.execute(f"DELETE FROM {self.driver.table} WHERE id = ?", received.token)

    def release(self, received: Received) -> None:
        self.held.discard(received.token)
        sql = f"UPDATE {self.driver.table} SET lease_until = NULL WHERE id = ?"
        self.driver.execute(sql, received.token)

    def close(self) -> None:
        # Rows still held belong to handlers that outlived the grace period: they
        # keep their lease, which runs out, and then another worker takes them.
        self.leases.stop()

    def _renew(self) -> None:
        # A handler may run longer than the lease: keep its row from being taken again.
        held = list(self.held)
        if not held:
            return
        marks = ",".join("?" * len(held))
        sql = f"UPDATE {self.driver.table} SET lease_until = ? WHERE id IN ({marks})"
        # On the keeper's thread, which translates what it raises.
        self.driver.execute(sql, time.time() + LEASE_S, *held)


def _from_url(url: DriverUrl) -> SqliteDriver:
    url.reject_unknown(["table"])
    return SqliteDriver("/" + url.path, url.get_str("table", "hermes"))


def _isolate(url: DriverUrl, namespace: str) -> str:
    return url.with_options(table="t_" + namespace.replace("-", "_"))


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        DriverPlugin(
            name="sqlite",
            schemes=("sqlite",),
            factory=_from_url,
            capabilities=SqliteDriver.capabilities,
            isolate=_isolate,
            example_url="sqlite:///var/lib/jobs.db",
        )
    ]
