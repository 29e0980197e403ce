"""Tallies in PostgreSQL: a head row per key, a row per member, counted under the head's lock.

The heads are ``<table>_tally_heads``, the members ``<table>_tally``, both
keyed like claims and records by the driver's ``queue`` and the key. A head
holds how many members its set has (``n``) and when the set expires; every
add is one transaction that locks the head first, so the adders of one key
take turns and each sees the count the one before it committed:

1. ``INSERT ... ON CONFLICT (queue, key) DO UPDATE SET n = 0 WHERE expired``
   makes the head (``n = 0``) or locks the one there, resetting it if its
   set expired (PostgreSQL locks the conflicting row even where the ``WHERE``
   is false);
2. a head at ``n = 0`` (new or reset) has its old members deleted, by a
   statement of its own, so its snapshot, taken once the lock is held, sees
   every member a previous holder committed;
3. the member is inserted (``ON CONFLICT DO NOTHING``: its first value
   stays), and in the same statement the head gets ``n + added`` and a new
   expiry, returning both.

Counting with ``INSERT`` then ``SELECT count(*)`` alone would not do: under
READ COMMITTED two adders can each miss the other's uncommitted member, and
neither see the full count. Where libpq supports pipeline mode, the whole
transaction is one round trip.

A read is one statement, one snapshot: the members of a live head. Expiry is
the server's clock, read after the lock is granted (``clock_timestamp()``),
so a set is kept ``ttl_s`` from its last add however long that add waited.
Each driver object deletes up to 1,000 expired heads (every queue's), with
their members, at most once a minute, in its next add. The heads table has
no index besides its primary key, so rewriting a head stays a HOT update.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from hermes.core import DriverError
from hermes.drivers.postgres._limits import _pipeline, _roll_back
from hermes.drivers.postgres._schema import Names

if TYPE_CHECKING:
    from hermes.drivers.postgres._driver import Connection, PostgresDriver

#: Seconds between two sweeps of expired sets by one driver object.
_SWEEP_S = 60.0
#: Expired heads one sweep deletes at most; a full batch makes the next add sweep again.
_SWEEP_ROWS = 1000


def members_table(names: Names) -> str:
    return f'"{names.schema}"."{names.table}_tally"'


def heads_table(names: Names) -> str:
    return f'"{names.schema}"."{names.table}_tally_heads"'


def create_sql(names: Names) -> str:
    """The tables' DDL; ``fillfactor`` leaves each page room for HOT rewrites of the heads."""
    return (
        f"CREATE TABLE IF NOT EXISTS {heads_table(names)} ("
        "queue text NOT NULL, key text NOT NULL, n integer NOT NULL, "
        "expires_at timestamptz NOT NULL, PRIMARY KEY (queue, key)) "
        "WITH (fillfactor = 70);\n"
        f"CREATE TABLE IF NOT EXISTS {members_table(names)} ("
        "queue text NOT NULL, key text NOT NULL, member text NOT NULL, "
        "value bytea NOT NULL, PRIMARY KEY (queue, key, member));\n"
    )


def drop_sql(names: Names) -> str:
    return f"DROP TABLE IF EXISTS {heads_table(names)}, {members_table(names)};"


class Tally:
    """The statements of one driver's tallies, and whether its tables exist yet."""

    def __init__(self, driver: PostgresDriver) -> None:
        self.driver = driver
        heads = heads_table(driver.names)
        members = members_table(driver.names)
        expiry = "clock_timestamp() + make_interval(secs => %(ttl_s)s)"
        # Every adder of the key waits here until the one before it committed.
        # The WHERE is checked on the version that one wrote, after the wait.
        self.lock_head = (
            f"INSERT INTO {heads} AS h (queue, key, n, expires_at) "
            f"VALUES (%(queue)s, %(key)s, 0, {expiry}) "
            "ON CONFLICT (queue, key) DO UPDATE SET n = 0 "
            "WHERE h.expires_at <= clock_timestamp()"
        )
        # A committed head always has n >= 1: n = 0 is a head this transaction
        # made or reset, whose members (if any) are an expired set's.
        self.clear = (
            f"DELETE FROM {members} AS t USING {heads} AS h "
            "WHERE h.queue = %(queue)s AND h.key = %(key)s AND h.n = 0 "
            "AND t.queue = h.queue AND t.key = h.key"
        )
        # The count subquery makes the insert run before the update reads it.
        self.insert_member = (
            f"WITH added AS (INSERT INTO {members} (queue, key, member, value) "
            "VALUES (%(queue)s, %(key)s, %(member)s, %(value)s) "
            "ON CONFLICT (queue, key, member) DO NOTHING RETURNING 1) "
            f"UPDATE {heads} SET n = n + (SELECT count(*) FROM added), expires_at = {expiry} "
            "WHERE queue = %(queue)s AND key = %(key)s "
            "RETURNING (SELECT count(*) FROM added) > 0, n"
        )
        self.select = (
            f"SELECT t.member, t.value FROM {heads} AS h JOIN {members} AS t "
            "ON t.queue = h.queue AND t.key = h.key "
            "WHERE h.queue = %(queue)s AND h.key = %(key)s AND h.expires_at > now()"
        )
        # Every queue's: expired is expired. SKIP LOCKED leaves a head an adder
        # holds to that adder; one renewed meanwhile is re-checked and kept.
        self.sweep = (
            f"WITH gone AS (DELETE FROM {heads} WHERE (queue, key) IN "
            f"(SELECT queue, key FROM {heads} WHERE expires_at <= now() "
            f"LIMIT {_SWEEP_ROWS} FOR UPDATE SKIP LOCKED) RETURNING queue, key), "
            f"members AS (DELETE FROM {members} AS t USING gone "
            "WHERE t.queue = gone.queue AND t.key = gone.key) "
            "SELECT count(*) FROM gone"
        )
        self.created = False
        self._next_sweep = 0.0

    def _ensure(self, conn: Connection) -> None:
        if self.created:
            return
        with conn.transaction():
            # The driver's own lock: two first adds must not race on CREATE TABLE.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [self.driver.names.lock_key])
            conn.execute(create_sql(self.driver.names).encode())
        self.created = True

    def add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        if not ttl_s > 0:
            raise ValueError(f"a tally's ttl_s must be > 0, got {ttl_s!r}")
        params: dict[str, Any] = {
            "queue": self.driver.queue,
            "key": key,
            "member": member,
            "value": bytes(value),
            "ttl_s": ttl_s,
        }
        with self.driver.connection() as conn:
            self._ensure(conn)
            try:
                # Begun and ended by hand so that, in pipeline mode, the
                # statements and the commit go in one round trip.
                with _pipeline(conn):
                    conn.execute(b"BEGIN")
                    conn.execute(self.lock_head, params)
                    conn.execute(self.clear, params)
                    counted = conn.execute(self.insert_member, params)
                    conn.execute(b"COMMIT")
                # Read once the pipeline ended: a read inside it would wait
                # for the results before the closing sync, a second round trip.
                row = counted.fetchone()
            except BaseException:
                _roll_back(conn)
                raise
            if row is None:  # the head was made or locked by this very transaction
                raise DriverError(f"{self.driver!r}: the tally head of {key!r} vanished")
            self._maybe_sweep(conn)
        return bool(row[0]), int(row[1])

    def read(self, key: str) -> dict[str, bytes]:
        with self.driver.connection() as conn:
            self._ensure(conn)
            rows = conn.execute(self.select, {"queue": self.driver.queue, "key": key}).fetchall()
        return {member: bytes(value) for member, value in rows}

    def _maybe_sweep(self, conn: Connection) -> None:
        if time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + _SWEEP_S
        row = conn.execute(self.sweep).fetchone()
        if row is not None and row[0] >= _SWEEP_ROWS:
            self._next_sweep = 0.0  # more to delete: again on the next add
