"""Fleet-wide limits in PostgreSQL: one row per limit key in ``<table>_limits``.

A row holds a key's state as :func:`hermes.core.drivertools.limit_state.encode`
writes it (JSON text), keyed like claims and records by the driver's
``queue`` and the key. Every decision is one transaction on the key's row:

1. ``INSERT ... ON CONFLICT DO NOTHING`` makes sure the row exists (a take
   only: a release or renewal of a key without a row has nothing to change);
2. ``SELECT ... FOR UPDATE`` locks it and reads its state, together with the
   server's ``clock_timestamp()`` read once the lock is held, so every
   decision on a key sees a clock no earlier than the one before it, and all
   hosts share the server's one clock;
3. the decision runs in Python on the decoded state
   (:func:`~hermes.core.drivertools.limit_state.take`, ``release``, ``renew``),
   and an ``UPDATE`` writes the new state back, unless nothing changed.

Where libpq supports pipeline mode, the statements before the read go in one
round trip and the write and the commit in another.

``expires_at`` is when the row may go: once its state says nothing any more
(:func:`~hermes.core.drivertools.limit_state.keep_for`), plus a minute. A scan
lists only the keys whose state still says something; each driver object
deletes up to 1,000 expired rows (every queue's) at most once a minute, in
its next take or scan. The table is created on first use, apart from the
messages table, as the records table is. It has no index besides its primary
key, so rewriting a row never changes an indexed column and stays a HOT
update; the sweep reads the table, which holds one row per key in use.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from hermes.core import DriverError
from hermes.core.driver import LimitRule, Take
from hermes.core.drivertools import limit_state
from hermes.drivers.postgres._schema import Names

if TYPE_CHECKING:
    from hermes.drivers.postgres._driver import Connection, PostgresDriver

#: Seconds a row is kept after its state stopped saying anything.
KEEP_AFTER_S = 60.0
#: Seconds between two sweeps of expired rows by one driver object.
_SWEEP_S = 60.0
#: Expired rows one sweep deletes at most; a full batch makes the next call sweep again.
_SWEEP_ROWS = 1000
#: Times a take makes the row and locks it before giving up: a sweep that
#: deletes an expired row between the two statements makes it go round once.
_LOCK_ATTEMPTS = 3


def limits_table(names: Names) -> str:
    return f'"{names.schema}"."{names.table}_limits"'


def create_sql(names: Names) -> str:
    """The table's DDL; ``fillfactor`` leaves each page room for HOT rewrites of its rows."""
    return (
        f"CREATE TABLE IF NOT EXISTS {limits_table(names)} ("
        "queue text NOT NULL, key text NOT NULL, state text NOT NULL, "
        "expires_at timestamptz NOT NULL, PRIMARY KEY (queue, key)) "
        "WITH (fillfactor = 70);\n"
    )


def drop_sql(names: Names) -> str:
    return f"DROP TABLE IF EXISTS {limits_table(names)};"


class Limits:
    """The statements of one driver's limits, and whether its table exists yet."""

    def __init__(self, driver: PostgresDriver) -> None:
        self.driver = driver
        table = limits_table(driver.names)
        self.insert = (
            f"INSERT INTO {table} (queue, key, state, expires_at) "
            "VALUES (%(queue)s, %(key)s, %(state)s, "
            f"now() + make_interval(secs => {KEEP_AFTER_S})) "
            "ON CONFLICT (queue, key) DO NOTHING"
        )
        # The clock is read above the locking subquery: after the lock was
        # granted, not when the row was first found (which may be long before,
        # while another decision held it).
        self.lock = (
            "SELECT held.state, extract(epoch FROM clock_timestamp())::float8 "
            f"FROM (SELECT state FROM {table} "
            "WHERE queue = %(queue)s AND key = %(key)s FOR UPDATE) AS held"
        )
        self.update = (
            f"UPDATE {table} SET state = %(state)s, expires_at = to_timestamp(%(expires_at)s) "
            "WHERE queue = %(queue)s AND key = %(key)s"
        )
        # Rows whose state still says something: expires_at is at least that
        # moment plus KEEP_AFTER_S (keep_for rounds up). The read checks each
        # state again with the clock the statement returns.
        self.live = (
            "SELECT key, state, extract(epoch FROM clock_timestamp())::float8 "
            f"FROM {table} WHERE queue = %s "
            f"AND expires_at > clock_timestamp() + make_interval(secs => {KEEP_AFTER_S}) "
            "LIMIT %s"
        )
        # Every queue's: expired is expired. SKIP LOCKED leaves a row that a
        # decision holds to that decision; a row rewritten meanwhile is
        # re-checked and, no longer expired, kept.
        self.sweep = (
            f"DELETE FROM {table} WHERE (queue, key) IN (SELECT queue, key FROM {table} "
            f"WHERE expires_at <= now() LIMIT {_SWEEP_ROWS} FOR UPDATE SKIP LOCKED)"
        )
        self.created = False
        self._next_sweep = 0.0
        self._fresh = limit_state.encode(limit_state.fresh()).decode()

    def _ensure(self, conn: Connection) -> None:
        if self.created:
            return
        with conn.transaction():
            # The driver's own lock: two first takes must not race on CREATE TABLE.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [self.driver.names.lock_key])
            conn.execute(create_sql(self.driver.names).encode())
        self.created = True

    def take(self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float) -> Take:
        answers: list[Take] = []

        def decide(state: limit_state.State, now: float) -> bool:
            answers.append(limit_state.take(state, rule, slot, charged, lease_s, now))
            return True

        self._decide(key, decide, create=True)
        return answers[0]

    def release(self, key: str, slot: str) -> None:
        def decide(state: limit_state.State, now: float) -> bool:
            if slot not in state["slots"]:
                return False  # not held: nothing to write
            limit_state.release(state, slot, now)
            return True

        self._decide(key, decide, create=False)

    def renew(self, key: str, slot: str, lease_s: float) -> bool:
        renewed: list[bool] = []

        def decide(state: limit_state.State, now: float) -> bool:
            renewed.append(limit_state.renew(state, slot, lease_s, now))
            return renewed[0]

        self._decide(key, decide, create=False)
        return bool(renewed and renewed[0])

    def _decide(
        self, key: str, decide: Callable[[limit_state.State, float], bool], *, create: bool
    ) -> None:
        """Lock the row of ``key``, run ``decide`` on its state, and write it if that says so.

        ``create``: make the row first if there is none; without it, a key
        without a row is left alone and ``decide`` is not called. The
        transaction is begun and ended by hand so that, in pipeline mode, the
        statements up to the read go in one round trip and the write and the
        commit in one more (``Connection.transaction()`` waits at each end).
        """
        params: dict[str, Any] = {"queue": self.driver.queue, "key": key, "state": self._fresh}
        with self.driver.connection() as conn:
            self._ensure(conn)
            try:
                with _pipeline(conn):
                    conn.execute(b"BEGIN")
                    row = self._lock(conn, params, create)
                    if row is not None:
                        state = limit_state.decode(row[0])
                        now: float = row[1]
                        if decide(state, now):
                            params["state"] = limit_state.encode(state).decode()
                            params["expires_at"] = (
                                now + limit_state.keep_for(state, now) + KEEP_AFTER_S
                            )
                            conn.execute(self.update, params)
                    conn.execute(b"COMMIT")
            except BaseException:
                _roll_back(conn)
                raise
            if create:
                self._maybe_sweep(conn)

    def _lock(
        self, conn: Connection, params: dict[str, Any], create: bool
    ) -> tuple[str, float] | None:
        """The state and the server's clock of the locked row; None if there is none."""
        for _ in range(_LOCK_ATTEMPTS):
            if create:
                conn.execute(self.insert, params)
            row = conn.execute(self.lock, params).fetchone()
            if row is not None or not create:
                return None if row is None else (row[0], row[1])
        raise DriverError(
            f"{self.driver!r}: the row of limit {params['key']!r} was deleted each time it was made"
        )

    def scan(self, limit: int) -> list[tuple[str, bytes]]:
        if limit <= 0:
            return []
        with self.driver.connection() as conn:
            self._ensure(conn)
            rows = conn.execute(self.live, [self.driver.queue, limit]).fetchall()
            self._maybe_sweep(conn)
        found: list[tuple[str, bytes]] = []
        for key, text, now in rows:
            if limit_state.keep_for(limit_state.decode(text), now) > 0:
                found.append((key, text.encode()))
        return found

    def _maybe_sweep(self, conn: Connection) -> None:
        if time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + _SWEEP_S
        if conn.execute(self.sweep).rowcount >= _SWEEP_ROWS:
            self._next_sweep = 0.0  # more to delete: again on the next call


def _roll_back(conn: Connection) -> None:
    """End the transaction a failed decision left open, if the connection still can."""
    if conn.closed or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    with contextlib.suppress(psycopg.Error):
        conn.execute(b"ROLLBACK")


def _pipeline(conn: Connection) -> contextlib.AbstractContextManager[Any]:
    """Pipeline mode where libpq has it: statements sent together, fewer round trips."""
    if psycopg.Pipeline.is_supported():
        return conn.pipeline()
    return contextlib.nullcontext()
