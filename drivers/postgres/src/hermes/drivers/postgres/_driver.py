"""PostgresDriver: messages as rows of one table, claimed with SKIP LOCKED, woken by NOTIFY."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import psycopg
import psycopg_pool

from hermes.core import BrokerRefusedError, DriverError
from hermes.core.driver import (
    DEFAULT_PRIORITY,
    BrowsePage,
    Consumer,
    Driver,
    LimitRule,
    Outgoing,
    QueueStats,
    Received,
    Take,
)
from hermes.core.drivertools import Door, LeaseKeeper, Message, PerProcess, owner_id
from hermes.drivers.postgres import _heartbeat, _limits, _records, _tally
from hermes.drivers.postgres._capabilities import CAPABILITIES, LEASE_TIMEOUT_S, POLL_INTERVAL_S
from hermes.drivers.postgres._errors import classify
from hermes.drivers.postgres._schema import Names, Statements, create_sql, drop_sql

logger = logging.getLogger("hermes")

Connection = psycopg.Connection[Any]
Pool = psycopg_pool.ConnectionPool[Connection]

#: The queue name of a driver whose URL gives none.
DEFAULT_QUEUE = "default"
#: The messages table of a driver whose URL gives none.
DEFAULT_TABLE = "hermes_messages"
#: Seconds between two deletes of the expired claims by one driver object.
_CLAIM_SWEEP_S = 60.0
#: Successful claims between two reads of the notifications that arrived meanwhile,
#: which psycopg keeps until they are read.
_DRAIN_EVERY = 64


class PostgresDriver(Driver):
    """Messages in a PostgreSQL table: one row each, deleted when its handlers are done.

    At-least-once: a worker claims a row by leasing it (``locked_by``,
    ``locked_until``) in one ``UPDATE ... FOR UPDATE SKIP LOCKED``; a
    :class:`~hermes.core.drivertools.LeaseKeeper` renews the leases of the rows
    whose handlers run; a worker that dies stops renewing, and its rows are
    claimed again once their lease ran out. Ack deletes the row, release
    clears the lease, reject moves the row to ``<table>_rejected``. Rows wait
    until ``available_at`` (native delay) and are claimed highest priority
    first, then oldest first. ``put`` notifies the queue's channel in the
    same statement, so an idle worker (``LISTEN``) starts a new message at
    once; and :meth:`send_in` inserts with the application's own connection,
    inside its transaction.

    ``conninfo`` is a libpq connection string or URL; the tables are created
    on first use unless ``create`` is False. Thread-safe: puts and settles
    borrow connections from a pool, each consumer has its own connection for
    claims and LISTEN. Fork-safe: the pool belongs to the process that made it.
    """

    capabilities = CAPABILITIES
    client_errors = (psycopg.Error,)

    def __init__(
        self,
        conninfo: str,
        *,
        table: str = DEFAULT_TABLE,
        schema: str = "public",
        queue: str = DEFAULT_QUEUE,
        lease_timeout_s: float = LEASE_TIMEOUT_S,
        poll_interval_s: float = POLL_INTERVAL_S,
        create: bool = True,
        pool_size: int = 10,
        connect_timeout_s: float = 5.0,
        synchronous_settles: bool = False,
        display_url: str = "",
    ) -> None:
        if not lease_timeout_s > 0:
            raise ValueError(f"lease_timeout_s must be > 0, got {lease_timeout_s!r}")
        if not poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size!r}")
        self.conninfo = conninfo
        #: The SQL names of the tables.
        self.names = Names(schema, table)
        self.sql = Statements(self.names)
        #: The ``queue`` column of this driver's rows: drivers with other queues
        #: may share the table.
        self.queue = queue
        #: The LISTEN/NOTIFY channel of this queue.
        self.channel = self.names.channel(queue)
        self.lease_timeout_s = lease_timeout_s
        self.poll_interval_s = poll_interval_s
        #: Whether the tables are created on first use (``create=false`` in the URL: no).
        self.create = create
        self.pool_size = pool_size
        #: Whether claims and settles wait for the WAL flush like sends (default: no).
        self.synchronous_settles = synchronous_settles
        self.connect_timeout_s = connect_timeout_s
        self.priorities: dict[int, str] = {DEFAULT_PRIORITY: "default"}
        self.capabilities = replace(
            CAPABILITIES, redelivery_timeout_s=lease_timeout_s + poll_interval_s
        )
        self._display_url = display_url or "postgresql://"
        self._pool: PerProcess[Pool] = PerProcess(self._open_pool, _close_pool)
        self._settle_pool: PerProcess[Pool] = PerProcess(
            lambda: self._open_pool(settling=True), _close_pool
        )
        self._created = False
        self._create_lock = threading.Lock()
        #: The pools (by id) a background check runs on now: one at a time each.
        self._checking: set[int] = set()
        self._checking_lock = threading.Lock()
        self._heartbeats = _heartbeat.Heartbeats(self)
        self._records = _records.Records(self)
        self._limits = _limits.Limits(self)
        self._tally = _tally.Tally(self)
        self._next_claim_sweep = 0.0

    # Connections ---------------------------------------------------------------

    def connect(self, *, settling: bool = False) -> Connection:
        """A new connection of this driver's own (autocommit), not from the pool.

        ``settling``: for claims, acks, releases and renewals, which commit
        without waiting for the WAL flush (``synchronous_commit = off``). That
        is safe for them under at-least-once: one lost in a server crash only
        means the message runs again, which a dead worker means anyway. Sends
        keep the server's setting: an emit that returned is on disk.
        """
        return psycopg.connect(self.conninfo, **self._connect_kwargs(settling))

    def _connect_kwargs(self, settling: bool) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, round(self.connect_timeout_s)),
        }
        if settling and not self.synchronous_settles:
            kwargs["options"] = "-c synchronous_commit=off"
        return kwargs

    def _open_pool(self, settling: bool = False) -> Pool:
        # One direct connection first: a refused login raises its own error here
        # (no such database, wrong password) instead of the pool retrying it in
        # the background while its callers see only PoolTimeout.
        self.connect().close()
        pool: Pool = psycopg_pool.ConnectionPool(
            self.conninfo,
            min_size=1,
            max_size=self.pool_size,
            kwargs=self._connect_kwargs(settling),
            timeout=self.connect_timeout_s,
            name=f"hermes-{self.names.table}{'-settle' if settling else ''}",
            open=False,
            # One thread to open and check connections in the background (not
            # psycopg_pool's three): a pool of a few connections keeps it idle.
            num_workers=1,
        )
        pool.open(wait=False)
        return pool

    @contextlib.contextmanager
    def connection(self, *, settling: bool = False) -> Iterator[Connection]:
        """A pooled connection (autocommit) for one statement or transaction.

        ``settling``: from the pool whose commits do not wait for the WAL
        flush (see :meth:`connect`).
        """
        pool = (self._settle_pool if settling else self._pool).get()
        try:
            with pool.connection() as conn:
                yield conn
        except psycopg_pool.PoolTimeout:
            # The pool only knows that no connection came in time; a direct
            # attempt says why (refused login, server down), else the timeout stands.
            self.connect().close()
            raise
        except psycopg.OperationalError:
            # The idle connections most likely died with this one (a restart,
            # terminated backends): replace them now, not one failed call each.
            self._check_in_background(pool)
            raise

    def _check_in_background(self, pool: Pool) -> None:
        """Check ``pool``'s idle connections on a thread, unless a check of it runs already.

        On a thread of its own: on a silent server each check waits out
        tcp_user_timeout, which the failed call has waited once already. One at
        a time: every handler thread failing at once must not start a check each.
        """
        with self._checking_lock:
            if id(pool) in self._checking:
                return
            self._checking.add(id(pool))

        def check() -> None:
            try:
                pool.check()
            except Exception as exc:
                # Closed meanwhile, or the server still away: the next call says so itself.
                logger.debug("%r: checking the idle connections failed - %s", self, exc)
            finally:
                with self._checking_lock:
                    self._checking.discard(id(pool))

        threading.Thread(target=check, name="hermes-pool-check", daemon=True).start()

    # Schema --------------------------------------------------------------------

    def schema_sql(self) -> str:
        """The DDL of this driver's tables, for deployments that run it themselves."""
        return create_sql(self.names)

    def create_tables(self, conn: Connection | None = None) -> None:
        """Create the tables if they do not exist; safe while other processes do the same.

        The advisory lock serializes concurrent creators: two ``CREATE TABLE
        IF NOT EXISTS`` racing can otherwise both pass the check and one fail.
        """
        if conn is None:
            with self.connection() as own:
                self.create_tables(own)
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [self.names.lock_key])
            conn.execute(create_sql(self.names).encode())
        self._created = True

    def ensure_tables(self, conn: Connection | None = None) -> None:
        """Create the tables once per driver object; with ``create`` off, check they exist."""
        if self._created:
            return
        if conn is None:
            with self.connection() as own:
                self.ensure_tables(own)
            return
        with self._create_lock:
            if self._created:
                return
            if self.create:
                self.create_tables(conn)
                return
            found = conn.execute("SELECT to_regclass(%s)", [self.names.messages]).fetchone()
            if found is None or found[0] is None:
                raise BrokerRefusedError(
                    f"{self!r}: table {self.names.messages} does not exist and create=false; "
                    "create it with `python -m hermes.drivers.postgres create URL` or the SQL "
                    "of `python -m hermes.drivers.postgres schema URL`"
                )
            self._created = True

    # Sending -------------------------------------------------------------------

    def setup_priority_queue(self, name: str, priority: int) -> None:
        # One table holds every priority: the name is only shown by queue_stats().
        self.priorities[priority] = name

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        if priority not in self.priorities:
            raise self.unknown_priority(priority, self.priorities)
        if not items:
            return
        with self.connection() as conn:
            self.ensure_tables(conn)
            conn.execute(self.sql.insert, self._insert_params(items, priority))

    def send_in(
        self, connection: Connection, message: Message, priority: int = DEFAULT_PRIORITY
    ) -> None:
        """Insert ``message`` with the application's ``connection``, in its transaction.

        Nothing is committed here: the message exists when the caller's
        transaction commits, and never if it rolls back. Workers are notified
        at the commit (NOTIFY is transactional). On a connection in
        autocommit mode the insert commits at once, like :meth:`send`.
        """
        self.send_batch_in(connection, [message], priority)

    def send_batch_in(
        self,
        connection: Connection,
        messages: Sequence[Message],
        priority: int = DEFAULT_PRIORITY,
    ) -> None:
        """:meth:`send_in` for many messages: one INSERT in the caller's transaction.

        Serialized, size-checked and translated as :meth:`send` is (core's :class:`Door`).
        """
        if priority not in self.priorities:
            raise self.unknown_priority(priority, self.priorities)
        Door(self).send(messages, priority, functools.partial(self._insert_in, connection))

    def _insert_in(self, connection: Connection, items: Sequence[Outgoing], priority: int) -> None:
        if not self._created:
            # DDL on a connection of our own: the caller's transaction should
            # hold its own work and the insert, not a CREATE TABLE.
            self.ensure_tables()
        connection.execute(self.sql.insert, self._insert_params(items, priority))

    def _insert_params(self, items: Sequence[Outgoing], priority: int) -> dict[str, Any]:
        now = time.time()
        later = [item.execute_at for item in items if item.execute_at and item.execute_at > now]
        return {
            "queue": self.queue,
            "priority": priority,
            "bodies": [item.body for item in items],
            "execute_at": [item.execute_at for item in items],
            "channel": self.channel,
            # Empty: something is due now. A time: the earliest held message,
            # so an idle worker knows when to look without polling for it.
            "wake": "" if len(later) < len(items) else repr(min(later)),
        }

    def claim(self, key: str, ttl_s: float) -> bool:
        """Claim ``key`` in ``<table>_claims``, under this driver's queue.

        See :class:`~hermes.core.driver.SupportsClaim`: one ``INSERT ... ON
        CONFLICT DO UPDATE ... WHERE expired``, a row back when this call won.
        """
        if not ttl_s > 0:
            raise ValueError(f"a claim's ttl_s must be > 0, got {ttl_s!r}")
        with self.connection() as conn:
            self.ensure_tables(conn)
            won = conn.execute(
                self.sql.claim_key, {"queue": self.queue, "key": key, "ttl_s": ttl_s}
            ).fetchone()
            if time.monotonic() >= self._next_claim_sweep:
                self._next_claim_sweep = time.monotonic() + _CLAIM_SWEEP_S
                conn.execute(self.sql.sweep_claims)
        return won is not None

    # Consuming -----------------------------------------------------------------

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _PostgresConsumer(self, self.check_priorities(self.priorities, priorities))

    def classify_error(self, exc: BaseException) -> type[DriverError] | None:
        return classify(exc)

    # Operating ------------------------------------------------------------------

    def queue_stats(self) -> list[QueueStats]:
        with self.connection() as conn:
            self.ensure_tables(conn)
            rows = conn.execute(self.sql.stats, {"queue": self.queue}).fetchall()
        counts: dict[int, list[int]] = {p: [0, 0, 0, 0] for p in self.priorities}
        for priority, *row in rows:
            total = counts.setdefault(priority, [0, 0, 0, 0])
            for i, value in enumerate(row):
                total[i] += value
        where = f"{self.names.schema}.{self.names.table}"
        return [
            QueueStats(
                priority,
                f"{where} queue {self.queue!r} priority {priority}",
                ready=ready,
                scheduled=scheduled,
                in_flight=in_flight,
                set_aside=set_aside,
            )
            for priority, (ready, scheduled, in_flight, set_aside) in sorted(
                counts.items(), reverse=True
            )
        ]

    def purge(self, priority: int | None = None) -> int:
        priorities = self.check_priorities(self.priorities, () if priority is None else [priority])
        with self.connection() as conn:
            self.ensure_tables(conn)
            return conn.execute(self.sql.purge, [self.queue, priorities]).rowcount

    def teardown(self) -> None:
        """Drop the messages table and its side tables, every queue in them: the kit's cleanup."""
        with self.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [self.names.lock_key])
            conn.execute(drop_sql(self.names).encode())
            conn.execute(_heartbeat.drop_sql(self.names).encode())
            conn.execute(_records.drop_sql(self.names).encode())
            conn.execute(_limits.drop_sql(self.names).encode())
            conn.execute(_tally.drop_sql(self.names).encode())
        self._created = False
        self._heartbeats.created = False
        self._records.created = False
        self._limits.created = False
        self._tally.created = False

    def beat(self, record: Mapping[str, Any], ttl_s: float) -> None:
        """Upsert a row of ``<table>_workers``; see ``SupportsHeartbeats``."""
        self._heartbeats.beat(record, ttl_s)

    def forget(self, worker_id: str) -> None:
        self._heartbeats.forget(worker_id)

    def heartbeats(self) -> list[dict[str, Any]]:
        return self._heartbeats.heartbeats()

    def record_get(self, key: str) -> bytes | None:
        """The live row of ``key`` in ``<table>_records``; see ``SupportsRecords``."""
        return self._records.get(key)

    def record_put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        """Compare-and-set in one statement, which notifies the waiters when it wrote."""
        return self._records.put(key, value, ttl_s, expect)

    def record_wait(self, key: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        """Woken by the write's NOTIFY, heard by this process's one listening connection."""
        return self._records.wait(key, seen, timeout_s)

    def record_scan(self, limit: int) -> list[bytes]:
        return self._records.scan(limit)

    def record_page(
        self, after: str | None, limit: int, max_bytes: int, *, oldest_first: bool = False
    ) -> BrowsePage:
        """Rows of ``<table>_records`` past ``after`` on the ``(queue, seq)`` index."""
        return self._records.page(after, limit, max_bytes, oldest_first)

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        """Decide on the key's row of ``<table>_limits``, locked, by the server's clock."""
        return self._limits.take(key, rule, slot, charged, lease_s)

    def limit_release(self, key: str, slot: str) -> None:
        self._limits.release(key, slot)

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        return self._limits.renew(key, slot, lease_s)

    def limit_scan(self, limit: int) -> list[tuple[str, bytes]]:
        """The keys whose state still holds a slot or promises a turn."""
        return self._limits.scan(limit)

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        """Insert the member and count it on the key's head row, locked; see ``SupportsTally``."""
        return self._tally.add(key, member, value, ttl_s)

    def tally_read(self, key: str) -> dict[str, bytes]:
        """The members of the key's live set, in one snapshot."""
        return self._tally.read(key)

    def close(self) -> None:
        self._records.close()
        self._pool.close()
        self._settle_pool.close()

    def __repr__(self) -> str:
        return f"<PostgresDriver {self._display_url}>"


def _close_pool(pool: Pool) -> None:
    pool.close(timeout=5.0)


class _PostgresConsumer(Consumer):
    """Claims on a connection of its own, which also LISTENs; settles through the pool.

    The receiving thread alone uses the claim connection, blocked in
    ``notifies()`` while idle, so handler threads settle on pooled
    connections instead of queueing behind it. The rows this consumer holds
    are renewed together by one :class:`LeaseKeeper`.
    """

    def __init__(self, driver: PostgresDriver, priorities: list[int]) -> None:
        self.driver = driver
        self.sql = driver.sql
        #: Who holds a row: written into ``locked_by``, so an operator can tell.
        self.worker = owner_id()
        self.claim_sql = self.sql.claim(priorities)
        self.claim_params = {
            "queue": driver.queue,
            "worker": self.worker,
            "lease_s": driver.lease_timeout_s,
        }
        self.conn: Connection | None = None
        #: Row ids claimed and not yet settled.
        self.held: set[int] = set()
        self.lock = threading.Lock()
        self.keeper = LeaseKeeper(
            self._renew,
            driver.lease_timeout_s / 3,
            f"the leases of {self.worker} on {driver!r}",
            driver=driver,
            name="hermes-postgres-leases",
        )
        #: When (monotonic) to look at the table next without a notification.
        self.next_claim = 0.0
        self.claims = 0

    def receive(self, timeout_s: float) -> Received | None:
        deadline = time.monotonic() + timeout_s
        try:
            conn = self.conn if self.conn is not None else self._connect()
            while True:
                if time.monotonic() >= self.next_claim:
                    row = conn.execute(self.claim_sql, self.claim_params).fetchone()
                    if row is not None:
                        return self._taken(conn, row)
                    self.next_claim = time.monotonic() + self.driver.poll_interval_s
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._wait(conn, min(left, self.next_claim - time.monotonic()))
        except psycopg.Error:
            self._disconnect()  # the next receive connects and LISTENs again
            raise

    def _connect(self) -> Connection:
        conn = self.driver.connect(settling=True)
        try:
            self.driver.ensure_tables(conn)
            conn.execute(f'LISTEN "{self.driver.channel}"'.encode())
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self.next_claim = 0.0  # what was put while nobody listened is claimed at once
        if not self.keeper.running:
            self.keeper.start()
        return conn

    def _disconnect(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def _taken(self, conn: Connection, row: tuple[Any, ...]) -> Received:
        row_id, priority, body, attempts = row
        with self.lock:
            self.held.add(row_id)
        self.claims += 1
        if self.claims % _DRAIN_EVERY == 0:
            # A busy worker never waits, so notifications pile up in psycopg:
            # read them (without blocking) so they do not grow without end.
            for _ in conn.notifies(timeout=0):
                pass
        return Received(
            bytes(body),
            priority,
            row_id,
            origin=f"{self.driver.names.table} row {row_id}",
            delivery_count=attempts,
        )

    def _wait(self, conn: Connection, timeout_s: float) -> None:
        """Block until a notification or ``timeout_s``; a due message makes the next claim now."""
        for notify in conn.notifies(timeout=max(0.0, timeout_s), stop_after=1):
            try:
                due_at = float(notify.payload) if notify.payload else None
            except ValueError:
                due_at = None  # someone else's NOTIFY on the channel: just look
            if due_at is None:
                self.next_claim = 0.0
                return
            # Only held messages were put: look again when the earliest is due.
            due_in = due_at - time.time()
            self.next_claim = min(self.next_claim, time.monotonic() + max(0.0, due_in))

    def _forget(self, received: Received) -> None:
        with self.lock:
            self.held.discard(received.token)

    def ack(self, received: Received) -> None:
        # Forgotten even when the delete fails: renewing a lease on a row whose
        # handler is done would only delay its redelivery.
        self._forget(received)
        with self.driver.connection(settling=True) as conn:
            conn.execute(self.sql.ack, [received.token])

    def release(self, received: Received) -> None:
        self._forget(received)
        with self.driver.connection(settling=True) as conn:
            conn.execute(self.sql.release, [received.token, self.worker])
        self.next_claim = 0.0

    def reject(self, received: Received, reason: str) -> None:
        self._forget(received)
        # The reason may quote the body, and a text column cannot hold NUL.
        reason = reason.replace("\x00", "\\x00")
        with self.driver.connection(settling=True) as conn:
            conn.execute(self.sql.reject, {"id": received.token, "reason": reason})

    def close(self) -> None:
        # What is still held (a handler outlived the grace period) keeps its
        # lease until it runs out: another worker takes it then, not now.
        self.keeper.stop()
        self._disconnect()

    def _renew(self) -> None:
        with self.lock:
            held = list(self.held)
        if not held:
            return
        with self.driver.connection(settling=True) as conn:
            conn.execute(self.sql.renew, [self.driver.lease_timeout_s, held, self.worker])


class TableBrowser:
    """The rows waiting in a driver's queue, every priority, without claiming them.

    What ``hermes failed list | retry | purge`` reads when the failed-message
    store is a ``postgresql://`` URL. Rows a worker holds are not listed.
    """

    def __init__(self, driver: Driver) -> None:
        if not isinstance(driver, PostgresDriver):
            raise TypeError(f"{driver!r} is not a PostgresDriver")
        self.driver = driver

    def entries(self) -> Iterator[tuple[Hashable, bytes | str]]:
        driver = self.driver
        with driver.connection() as conn:
            driver.ensure_tables(conn)
            rows = conn.execute(driver.sql.browse, [driver.queue]).fetchall()
        for row_id, body in rows:
            yield row_id, bytes(body)

    def page(self, after: str | None, limit: int, max_bytes: int) -> BrowsePage:
        """A page in the order workers take rows; ``next`` names the last row shown
        (``PRIORITY|AVAILABLE_AT|ID``), so a page reads only its own rows."""
        driver = self.driver
        params: dict[str, Any] = {
            "queue": driver.queue,
            "after": False,
            "priority": 0,
            "available_at": None,
            "id": 0,
            "limit": limit + 1,
        }
        mark = _browse_mark(after)
        if mark is not None:
            params.update(after=True, priority=mark[0], available_at=mark[1], id=mark[2])
        with driver.connection() as conn:
            driver.ensure_tables(conn)
            rows = conn.execute(driver.sql.browse_page, params).fetchall()
            shown: list[Any] = []
            size = 0
            for row in rows[:limit]:
                if shown and size >= max_bytes:
                    break
                shown.append(row)
                size += row[3] or 0
            ids = [row[0] for row in shown]
            bodies = dict(conn.execute(driver.sql.browse_bodies, [ids, driver.queue]).fetchall())
        taken: list[tuple[Hashable, bytes | str]] = [
            (row[0], bytes(bodies[row[0]])) for row in shown if row[0] in bodies
        ]
        priorities = {row[0]: row[1] for row in shown if row[0] in bodies}
        if len(shown) == len(rows):  # nothing after the last row read
            return BrowsePage(taken, None, priorities)
        last = shown[-1]
        return BrowsePage(taken, f"{last[1]}|{last[2].isoformat()}|{last[0]}", priorities)

    def remove(self, entry: Hashable) -> bool:
        driver = self.driver
        with driver.connection() as conn:
            return conn.execute(driver.sql.remove, [entry, driver.queue]).rowcount == 1


def _browse_mark(after: str | None) -> tuple[int, str, int] | None:
    """``(priority, available_at, id)`` of a page's ``next``; None for None or a token not ours."""
    if not after:
        return None
    parts = after.split("|")
    if len(parts) != 3:
        return None
    priority, available_at, row_id = parts
    try:
        return int(priority), available_at, int(row_id)
    except ValueError:
        return None
