"""Job records in PostgreSQL: one row per key in ``<table>_records``, woken by NOTIFY.

Like claims and heartbeats, a row belongs to the driver's queue (``queue``
column), so drivers of other queues sharing the tables keep records of their
own. ``expires_at`` and ``written_at`` are the server's clock (``now()``), so
the hosts' clocks do not matter; an expired row reads as absent, and at
most once a minute a put deletes a batch of them. The table is created on first
use, apart from the messages table, as the workers table is.

``seq`` (a sequence) is a record's place in creation order: the insert of a
new row, or of a record over an expired one, takes the next value; a write
over a live record keeps it. Pages walk the ``(queue, seq)`` index from the
cursor (the ``seq`` of the last row read), so a page reads its rows and no
more, and a table made before ``seq`` existed gains it on first use.

A write notifies one channel per queue, with the key as the payload, in the
same statement (so only when it wrote, and at its commit). Waiters do not
each hold a connection: one listener per process, on a connection and a
thread of its own, wakes the waiters of the key it hears.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

import psycopg

from hermes.core.driver import BrowsePage
from hermes.core.drivertools import PerProcess
from hermes.drivers.postgres._schema import Names

if TYPE_CHECKING:
    from hermes.drivers.postgres._driver import Connection, PostgresDriver

logger = logging.getLogger("hermes")

#: Seconds between two sweeps of expired records by one driver object.
_SWEEP_S = 60.0
#: Expired rows one sweep deletes at most; a sweep that deletes this many is
#: followed by another on the next put, until the backlog is gone.
_SWEEP_ROWS = 1000
#: Longest :meth:`_Listener.stop` waits for the listener's thread to end.
_STOP_WAIT_S = 2.0
#: Longest a waiter sleeps while the listener reconnects (it hears nothing then).
_UNHEARD_WAIT_S = 1.0


def records_table(names: Names) -> str:
    return f'"{names.schema}"."{names.table}_records"'


def create_sql(names: Names) -> str:
    table = names.table
    return (
        f"CREATE TABLE IF NOT EXISTS {records_table(names)} ("
        "queue text NOT NULL, key text NOT NULL, value bytea NOT NULL, "
        "expires_at timestamptz NOT NULL, written_at timestamptz NOT NULL, "
        "PRIMARY KEY (queue, key));\n"
        f'CREATE INDEX IF NOT EXISTS "{table}_records_written" '
        f"ON {records_table(names)} (queue, written_at);\n"
        f'CREATE INDEX IF NOT EXISTS "{table}_records_expires" '
        f"ON {records_table(names)} (expires_at);\n"
        # Guarded: ALTER TABLE would lock the table at every start, even with IF NOT EXISTS.
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_attribute "
        f"WHERE attrelid = '{records_table(names)}'::regclass AND attname = 'seq' "
        "AND NOT attisdropped) THEN "
        f"ALTER TABLE {records_table(names)} ADD COLUMN seq bigserial; END IF; END $$;\n"
        f'CREATE INDEX IF NOT EXISTS "{table}_records_seq" '
        f"ON {records_table(names)} (queue, seq);\n"
    )


def drop_sql(names: Names) -> str:
    return f"DROP TABLE IF EXISTS {records_table(names)};"


class Records:
    """The statements of one driver's job records, and whether its table exists yet."""

    def __init__(self, driver: PostgresDriver) -> None:
        self.driver = driver
        self.channel = driver.names.records_channel(driver.queue)
        table = records_table(driver.names)
        live = "queue = %(queue)s AND key = %(key)s AND expires_at > now()"
        written = (
            "value = %(value)s, expires_at = now() + make_interval(secs => %(ttl_s)s), "
            "written_at = now()"
        )
        self.select = f"SELECT value FROM {table} WHERE {live}"
        # Expect nothing: a new row, or one whose record expired (absent as far
        # as anyone reads). Concurrent writers of one key queue on its row (or
        # its speculative insert) and re-check the WHERE on the version the
        # winner wrote: exactly one gets a row back, and only it notifies.
        self.put_new = (
            f"WITH w AS (INSERT INTO {table} AS r (queue, key, value, expires_at, written_at) "
            "VALUES (%(queue)s, %(key)s, %(value)s, "
            "now() + make_interval(secs => %(ttl_s)s), now()) "
            "ON CONFLICT (queue, key) DO UPDATE SET value = EXCLUDED.value, "
            "expires_at = EXCLUDED.expires_at, written_at = EXCLUDED.written_at, "
            "seq = EXCLUDED.seq "
            "WHERE r.expires_at <= now() RETURNING 1) "
            "SELECT pg_notify(%(channel)s, %(key)s) FROM w"
        )
        # Expect these bytes: an UPDATE blocked behind a concurrent one re-reads
        # the row it committed, whose value is no longer ``expect``.
        self.put_over = (
            f"WITH w AS (UPDATE {table} SET {written} "
            f"WHERE {live} AND value = %(expect)s RETURNING 1) "
            "SELECT pg_notify(%(channel)s, %(key)s) FROM w"
        )
        self.newest = (
            f"SELECT value FROM {table} WHERE queue = %s AND expires_at > now() "
            "ORDER BY seq DESC LIMIT %s"
        )
        self.pages = {
            (oldest, cursor): _page_sql(table, oldest, cursor)
            for oldest in (False, True)
            for cursor in (False, True)
        }
        # Every queue's: expired is expired. SKIP LOCKED leaves a row a writer
        # is replacing to that writer.
        self.sweep = (
            f"DELETE FROM {table} WHERE (queue, key) IN (SELECT queue, key FROM {table} "
            f"WHERE expires_at <= now() LIMIT {_SWEEP_ROWS} FOR UPDATE SKIP LOCKED)"
        )
        self.created = False
        self._next_sweep = 0.0
        self._listener: PerProcess[_Listener] = PerProcess(lambda: _Listener(self), _Listener.stop)

    def _ensure(self, conn: Connection) -> None:
        if self.created:
            return
        with conn.transaction():
            # The driver's own lock: two first writes must not race on CREATE TABLE.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [self.driver.names.lock_key])
            conn.execute(create_sql(self.driver.names).encode())
        self.created = True

    def get(self, key: str) -> bytes | None:
        with self.driver.connection() as conn:
            self._ensure(conn)
            row = conn.execute(self.select, {"queue": self.driver.queue, "key": key}).fetchone()
        return None if row is None else bytes(row[0])

    def put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        if not ttl_s > 0:
            raise ValueError(f"a record's ttl_s must be > 0, got {ttl_s!r}")
        params = {
            "queue": self.driver.queue,
            "key": key,
            "value": bytes(value),
            "ttl_s": ttl_s,
            "expect": expect,
            "channel": self.channel,
        }
        with self.driver.connection() as conn:
            self._ensure(conn)
            sql = self.put_new if expect is None else self.put_over
            wrote = conn.execute(sql, params).fetchone() is not None
            if time.monotonic() >= self._next_sweep:
                self._next_sweep = time.monotonic() + _SWEEP_S
                if conn.execute(self.sweep).rowcount >= _SWEEP_ROWS:
                    self._next_sweep = 0.0  # more to delete: again on the next put
        return wrote

    def wait(self, key: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        listener = self._listener.get()
        woken = threading.Event()
        # Listening before reading: a write that commits after the read is heard.
        listener.add(key, woken)
        try:
            while True:
                current = self.get(key)
                left = deadline - time.monotonic()
                if current != seen or left <= 0:
                    return current
                if not listener.listening:
                    left = min(left, _UNHEARD_WAIT_S)
                woken.wait(left)
                woken.clear()
        finally:
            listener.remove(key, woken)

    def scan(self, limit: int) -> list[bytes]:
        with self.driver.connection() as conn:
            self._ensure(conn)
            rows = conn.execute(self.newest, [self.driver.queue, max(0, limit)]).fetchall()
        return [bytes(row[0]) for row in rows]

    def page(self, after: str | None, limit: int, max_bytes: int, oldest_first: bool) -> BrowsePage:
        if after is not None and not after.isdigit():
            raise ValueError(f"not a page of this store's job records: {after!r}")
        limit = max(1, limit)
        params = {
            "queue": self.driver.queue,
            "after": None if after is None else int(after),
            "rows": limit + 1,
            "max_bytes": max(1, max_bytes),
        }
        with self.driver.connection() as conn:
            self._ensure(conn)
            sql = self.pages[oldest_first, after is not None]
            rows = conn.execute(sql, params).fetchall()
        entries: list[tuple[Hashable, bytes | str]] = []
        last: int | None = None
        for key, seq, value, fits in rows:
            if len(entries) >= limit or not fits:
                break
            last = seq
            if value is not None:
                entries.append((key, bytes(value)))
        else:
            if len(rows) <= limit:
                last = None  # the index ends here
        return BrowsePage(entries, None if last is None else str(last))

    def close(self) -> None:
        self._listener.close()


def _page_sql(table: str, oldest: bool, cursor: bool) -> str:
    """Rows in ``seq`` order past ``%(after)s`` (with ``cursor``): ``(key, seq, value, fits)``,
    ``value`` None where the record expired, ``fits`` while the live bytes before it are
    under ``%(max_bytes)s``; at most ``%(rows)s`` rows, read from the ``(queue, seq)`` index."""
    order, past = ("ASC", ">") if oldest else ("DESC", "<")
    where = "queue = %(queue)s" + (f" AND seq {past} %(after)s" if cursor else "")
    return (
        "SELECT key, seq, CASE WHEN live THEN value END, before < %(max_bytes)s FROM ("
        "SELECT key, seq, value, expires_at > now() AS live, "
        "coalesce(sum(CASE WHEN expires_at > now() THEN octet_length(value) END) OVER ("
        f"ORDER BY seq {order} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before "
        f"FROM (SELECT * FROM {table} WHERE {where} ORDER BY seq {order} LIMIT %(rows)s) r"
        f") page ORDER BY seq {order}"
    )


class _Listener:
    """One connection LISTENing on a driver's records channel, on a thread of its own.

    Made in the process that waits (a forked child makes its own), connected
    and listening before the first waiter reads, so that waiter's failure to
    connect is its own error. When the connection drops the thread connects
    again; meanwhile waiters look every second, and once it listens again
    every waiter looks at once, as a write in between was not heard.
    """

    def __init__(self, records: Records) -> None:
        self.records = records
        self.lock = threading.Lock()
        #: Key -> the events of the waiters on it.
        self.waiters: dict[str, set[threading.Event]] = {}
        self.stopping = threading.Event()
        self.conn: Connection | None = self._connect()
        #: Written to by :meth:`stop`: the thread blocks in ``select`` on the
        #: connection and this, so it neither wakes while idle nor lags a stop.
        self.wakeup_r, self.wakeup_w = socket.socketpair()
        #: False while the connection is lost and not yet replaced.
        self.listening = True
        self.thread = threading.Thread(
            target=self._run, name="hermes-postgres-records", daemon=True
        )
        self.thread.start()

    def _connect(self) -> Connection:
        conn = self.records.driver.connect()
        try:
            conn.execute(f'LISTEN "{self.records.channel}"'.encode())
        except BaseException:
            conn.close()
            raise
        return conn

    def add(self, key: str, event: threading.Event) -> None:
        with self.lock:
            self.waiters.setdefault(key, set()).add(event)

    def remove(self, key: str, event: threading.Event) -> None:
        with self.lock:
            events = self.waiters.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self.waiters[key]

    def _wake(self, key: str | None) -> None:
        """Wake the waiters of ``key``; None: every waiter."""
        with self.lock:
            if key is None:
                events = [event for group in self.waiters.values() for event in group]
            else:
                events = list(self.waiters.get(key, ()))
        for event in events:
            event.set()

    def _run(self) -> None:
        conn = self.conn
        pause_s = 0.5
        while not self.stopping.is_set():
            try:
                if conn is None:
                    conn = self.conn = self._connect()
                    self.listening = True
                    pause_s = 0.5
                    logger.info("Listening for job records on %r again", self.records.driver)
                    self._wake(None)
                fileno = conn.fileno()
                readable, _, _ = select.select([fileno, self.wakeup_r.fileno()], [], [])
                if fileno in readable:
                    # Reads what arrived without blocking; a dropped connection raises.
                    for notify in conn.notifies(timeout=0):
                        self._wake(notify.payload)
            except (psycopg.Error, OSError) as exc:
                if self.listening:
                    logger.warning(
                        "Lost the connection that listens for job records on %r - %s; "
                        "connecting again",
                        self.records.driver,
                        exc,
                    )
                self.listening = False
                self._wake(None)  # to look every second until it listens again
                if conn is not None:
                    conn.close()
                conn = self.conn = None
                self.stopping.wait(pause_s)
                pause_s = min(pause_s * 2, 5.0)
        if conn is not None:
            conn.close()
        self.wakeup_r.close()

    def stop(self) -> None:
        self.stopping.set()
        self.wakeup_w.send(b"x")
        if self.thread is not threading.current_thread():
            self.thread.join(_STOP_WAIT_S)
        self.wakeup_w.close()
        self._wake(None)
