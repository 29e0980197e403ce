"""Heartbeats in PostgreSQL: one row per worker in ``<table>_workers``, upserted each beat.

``expires_at`` is computed by the server (``now() + ttl``) and compared with
the server's ``now()`` when listing, so the hosts' clocks do not matter. The
table is created on first use, apart from the messages table: a deployment
that runs the driver's DDL itself (``create=false``) and never looks at
workers needs no new table. Expired rows are deleted by the next beat.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from hermes.drivers.postgres._schema import Names

if TYPE_CHECKING:
    from hermes.drivers.postgres._driver import PostgresDriver


def workers_table(names: Names) -> str:
    return f'"{names.schema}"."{names.table}_workers"'


def create_sql(names: Names) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {workers_table(names)} ("
        "queue text NOT NULL, id text NOT NULL, record jsonb NOT NULL, "
        "expires_at timestamptz NOT NULL, PRIMARY KEY (queue, id))"
    )


def drop_sql(names: Names) -> str:
    return f"DROP TABLE IF EXISTS {workers_table(names)};"


class Heartbeats:
    """The statements of one driver's heartbeats, and whether its table exists yet."""

    def __init__(self, driver: PostgresDriver) -> None:
        self.driver = driver
        table = workers_table(driver.names)
        self.upsert = (
            f"INSERT INTO {table} (queue, id, record, expires_at) "
            "VALUES (%s, %s, %s, now() + make_interval(secs => %s)) "
            "ON CONFLICT (queue, id) DO UPDATE "
            "SET record = excluded.record, expires_at = excluded.expires_at"
        )
        self.sweep = f"DELETE FROM {table} WHERE queue = %s AND expires_at <= now()"
        self.delete = f"DELETE FROM {table} WHERE queue = %s AND id = %s"
        self.select = f"SELECT record FROM {table} WHERE queue = %s AND expires_at > now()"
        self.created = False

    def _ensure(self, conn: Any) -> None:
        if self.created:
            return
        with conn.transaction():
            # The driver's own lock: two first beats must not race on CREATE TABLE.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [self.driver.names.lock_key])
            conn.execute(create_sql(self.driver.names).encode())
        self.created = True

    def beat(self, record: Mapping[str, Any], ttl_s: float) -> None:
        if not ttl_s > 0:
            raise ValueError(f"a heartbeat's ttl_s must be > 0, got {ttl_s!r}")
        queue = self.driver.queue
        with self.driver.connection(settling=True) as conn:
            self._ensure(conn)
            with conn.transaction():
                conn.execute(self.upsert, [queue, str(record["id"]), Jsonb(dict(record)), ttl_s])
                conn.execute(self.sweep, [queue])

    def forget(self, worker_id: str) -> None:
        with self.driver.connection(settling=True) as conn:
            self._ensure(conn)
            conn.execute(self.delete, [self.driver.queue, worker_id])

    def heartbeats(self) -> list[dict[str, Any]]:
        with self.driver.connection() as conn:
            self._ensure(conn)
            rows = conn.execute(self.select, [self.driver.queue]).fetchall()
        return [dict(row[0]) for row in rows]
