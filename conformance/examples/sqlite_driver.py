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

from hermes.core import DEFAULT_PRIORITY, Message, hookimpl, translate_errors
from hermes.core.driver import (
    Capabilities,
    Consumer,
    Delay,
    Delivery,
    Driver,
    DriverPlugin,
    DriverUrl,
    PerProcess,
    Received,
)

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
    )

    def __init__(self, path: str, table: str = "hermes") -> None:
        super().__init__()
        if not table.isidentifier():
            raise ValueError(f"table must be a plain identifier, got {table!r}")
        self.path, self.table = path, table
        self.priorities = {DEFAULT_PRIORITY}
        # One connection per process (fork-safe), shared by its threads under a lock.
        self._connection = PerProcess(self._connect, sqlite3.Connection.close)
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path, timeout=30, isolation_level=None, check_same_thread=False
        )
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} (id INTEGER PRIMARY KEY, "
            "priority INTEGER, due REAL, body BLOB, lease_until REAL)"
        )
        return connection

    def execute(self, sql: str, *args: Any) -> list[Any]:
        """Run one statement in this process's connection; SQLite errors become Hermes's."""
        doing = f"{sql.split()[0]} on {self.path}"
        # "database is locked" passes: core's loop backs off and tries again.
        with self._lock, translate_errors(doing, unavailable=(sqlite3.OperationalError,)):
            return self._connection.get().execute(sql, args).fetchall()

    def setup_priority_queue(self, name: str, priority: int) -> None:
        self.priorities.add(priority)  # one table holds every priority

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        body = self.serializer.serialize(message)  # before any I/O
        self._insert(body, priority, message.execute_at or 0.0)

    def send_raw(self, body: bytes, priority: int = DEFAULT_PRIORITY) -> None:
        """Store bytes as they are (the kit puts poison on the broker with it)."""
        self._insert(body, priority, 0.0)

    def _insert(self, body: str | bytes, priority: int, due: float) -> None:
        if priority not in self.priorities:
            raise self.unknown_priority(priority, self.priorities)
        sql = f"INSERT INTO {self.table} (priority, due, body) VALUES (?, ?, ?)"
        self.execute(sql, priority, due, body)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _SqliteConsumer(self, self.check_priorities(self.priorities, priorities))

    def purge(self) -> None:
        self.execute(f"DROP TABLE IF EXISTS {self.table}")
        self._connection.discard()

    def close(self) -> None:
        self._connection.close()


class _SqliteConsumer(Consumer):
    """Takes a row by setting its lease; renews the leases of rows in handlers."""

    def __init__(self, driver: SqliteDriver, order: list[int]) -> None:
        self.driver = driver
        self.marks = ",".join("?" * len(order))
        self.order = order
        self.held: set[int] = set()
        self.stop = threading.Event()
        threading.Thread(target=self._renew, daemon=True).start()

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
        self.stop.set()
        for row_id in list(self.held):  # taken, never settled: give them back
            self.release(Received(b"", DEFAULT_PRIORITY, row_id))

    def _renew(self) -> None:
        # A handler may run longer than the lease: keep its row from being taken again.
        while not self.stop.wait(LEASE_S / 3):
            for row_id in list(self.held):
                sql = f"UPDATE {self.driver.table} SET lease_until = ? WHERE id = ?"
                self.driver.execute(sql, time.time() + LEASE_S, row_id)


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
