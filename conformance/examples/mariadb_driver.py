"""A Hermes driver in one file: messages in a MariaDB (or MySQL 8) InnoDB table.

``mariadb://user:password@host:3306/database?table=hermes``. At-least-once: a
worker takes a row with ``SELECT ... FOR UPDATE SKIP LOCKED`` and leases it
(``lease_until``, ``owner``), core's ``LeaseKeeper`` renews the lease while the
handler runs, the row is deleted when the handlers are done, and a row whose
lease ran out (its worker died) is taken again. Priorities, delays
(``due``) and delivery counts (``deliveries``) live in the row. Register it
with one entry point::

    [project.entry-points.hermes]
    mariadb = "mariadb_driver"

Client: PyMySQL (pure Python). One connection per process and driver object,
shared by its threads under a lock held per statement or transaction.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pymysql
import pymysql.err

from hermes.core import BrokerRefusedError, BrokerUnavailableError, DeliveryError, DriverError
from hermes.core.driver import (
    DEFAULT_PRIORITY,
    BrowsePage,
    Capabilities,
    Consumer,
    Delay,
    Delivery,
    Driver,
    DriverPlugin,
    DriverUrl,
    LimitRule,
    Outgoing,
    QueueStats,
    Received,
    Take,
    hookimpl,
)
from hermes.core.drivertools import LeaseKeeper, PerProcess, limit_state, owner_id

log = logging.getLogger("hermes.drivers.mariadb")

T = TypeVar("T")

#: A taken row is handed out again this long after its worker stopped renewing it.
LEASE_S = 4.0
#: An idle worker looks at the table this often (MariaDB cannot wake it).
POLL_S = 0.05
#: What the kit may send and the broker carries with room to spare: PyMySQL
#: escapes a body into the statement (up to twice its size), and the server's
#: ``max_allowed_packet`` is 16 MiB by default (10.2.4 on).
MAX_MESSAGE_BYTES = 1024 * 1024
#: A body a statement cannot carry under the default ``max_allowed_packet``.
HARD_LIMIT_BYTES = 7 * 1024 * 1024

#: ``record_wait`` looks again this often (the contract's floor is 50 ms).
RECORD_POLL_S = 0.1
#: The longest key a claim, heartbeat, record or tally takes (bytes of UTF-8).
MAX_KEY_BYTES = 1024

#: The side tables of the optional features, made on first use: suffix -> columns.
_SIDE_TABLES = {
    "claims": "k VARBINARY(1024) NOT NULL PRIMARY KEY, until DOUBLE NOT NULL",
    "beats": "k VARBINARY(1024) NOT NULL PRIMARY KEY, record LONGBLOB NOT NULL, "
    "until DOUBLE NOT NULL",
    # ``seq``: a record's place, set when it is created (nothing stored, or
    # expired) and kept by later writes.
    "records": "seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, "
    "k VARBINARY(1024) NOT NULL, v LONGBLOB NOT NULL, until DOUBLE NOT NULL, UNIQUE KEY (k)",
    "sets": "k VARBINARY(1024) NOT NULL PRIMARY KEY, until DOUBLE NOT NULL",
    "members": "k VARBINARY(1024) NOT NULL, member VARBINARY(1024) NOT NULL, "
    "v LONGBLOB NOT NULL, PRIMARY KEY (k, member)",
    "limits": "k VARBINARY(1024) NOT NULL PRIMARY KEY, state LONGBLOB NULL, until DOUBLE NOT NULL",
}
_NOW = "UNIX_TIMESTAMP(NOW(6))"  # the server's clock: one clock for every host

# Server error codes (https://mariadb.com/kb/en/mariadb-error-codes/).
_REFUSED_CODES = frozenset(
    {
        1044,  # access denied for user to database
        1045,  # access denied for user (password)
        1049,  # unknown database
        1142,  # command denied on table
        1143,  # column access denied
        1227,  # specific privilege needed
        1698,  # access denied (no password allowed)
        1820,  # must reset password
        1862,  # password expired
    }
)
_UNAVAILABLE_CODES = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1152,  # aborted connection
        1205,  # lock wait timeout
        1213,  # deadlock: try again
        1927,  # connection was killed
        4031,  # disconnected by the server (idle timeout)
    }
)


def _key(key: str) -> bytes:
    data = key.encode()
    if len(data) > MAX_KEY_BYTES:
        raise ValueError(
            f"a key of {len(data)} bytes is longer than {MAX_KEY_BYTES}: {key[:80]!r}..."
        )
    return data


def _code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _connection_lost(exc: BaseException) -> bool:
    """Whether the connection is unusable after ``exc`` (drop it, reconnect next time)."""
    if isinstance(exc, pymysql.err.InterfaceError):
        return True
    code = _code(exc)
    return code is not None and (2000 <= code < 3000 or code in (1053, 1152, 1927, 4031))


class _Session:
    """One process's connection and the lock its threads take per statement."""

    def __init__(self, db: pymysql.connections.Connection) -> None:
        self.db = db
        self.lock = threading.Lock()  # made in the process that uses it: fork-safe
        self.tables: set[str] = set()  # side tables this connection made sure of


def _close_session(session: _Session) -> None:
    try:
        session.db.close()  # sends COM_QUIT
    except Exception:
        session.db._force_close()


class MariaDbDriver(Driver):
    capabilities = Capabilities(
        delivery=Delivery.AT_LEAST_ONCE,
        delay=Delay.NATIVE,
        priorities=True,
        competing_consumers=True,
        cross_process=True,
        max_message_bytes=MAX_MESSAGE_BYTES,
        # Expired leases are found by the next poll of any worker.
        redelivery_timeout_s=LEASE_S + POLL_S,
        counts_deliveries=True,
        wake_up_s=POLL_S,
    )
    # Core turns these into Hermes errors around every call it makes;
    # classify_error below sorts them by the server's error code.
    client_errors = (pymysql.err.MySQLError,)

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 3306,
        user: str = "root",
        password: str = "",
        database: str = "test",
        table: str = "hermes",
        connect_timeout_s: float = 5.0,
    ) -> None:
        if not table.isidentifier() or len(table) > 56:
            raise ValueError(
                f"table must be a plain identifier of at most 56 characters, got {table!r}"
            )
        self.table = table
        self.where = f"{database}.{table}"
        self._params = dict(
            host=host,
            port=port,
            user=user,
            password=password,
            database=database,
            autocommit=True,
            connect_timeout=connect_timeout_s,
            read_timeout=60,
            write_timeout=60,
            charset="utf8mb4",
        )
        self.priorities = {DEFAULT_PRIORITY}
        self._sessions: PerProcess[_Session] = PerProcess(self._connect, _close_session)

    # -- errors -----------------------------------------------------------

    def classify_error(self, exc: BaseException) -> type[DriverError] | None:
        # PyMySQL raises OperationalError for a refused login, a lost
        # connection and a deadlock alike: the server's code tells them apart.
        if isinstance(exc, pymysql.err.MySQLError):
            code = _code(exc)
            if code in _REFUSED_CODES:
                return BrokerRefusedError
            if code in _UNAVAILABLE_CODES or _connection_lost(exc):
                return BrokerUnavailableError
        return super().classify_error(exc)

    # -- connection -------------------------------------------------------

    def _connect(self) -> _Session:
        db = pymysql.connect(**self._params)
        with db.cursor() as cursor:
            # No gap locks: a taker's locking read must not block inserts.
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 10")
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} ("
                "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, "
                "priority INT NOT NULL, "
                "due DOUBLE NOT NULL, "
                "body LONGBLOB NOT NULL, "
                "lease_until DOUBLE NULL, "
                "owner VARCHAR(255) NULL, "
                "deliveries INT NOT NULL DEFAULT 0, "
                "KEY ready (priority, due, id)"
                ") ENGINE=InnoDB"
            )
        return _Session(db)

    def side(self, suffix: str) -> str:
        """The name of an optional feature's table."""
        return f"{self.table}_{suffix}"

    def run(
        self, work: Callable[[Any], T], *, transaction: bool = False, needs: Sequence[str] = ()
    ) -> T:
        """``work(cursor)`` on this process's connection, alone on it, in a transaction if asked.

        ``needs`` names the side tables ``work`` uses: made here on first use.
        """
        for attempt in range(5):
            try:
                return self._run_once(work, transaction, needs)
            except pymysql.err.OperationalError as exc:
                # A deadlock rolled the whole transaction back: run it again.
                if not transaction or _code(exc) != 1213 or attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def _run_once(self, work: Callable[[Any], T], transaction: bool, needs: Sequence[str]) -> T:
        session = self._sessions.get()
        with session.lock:
            try:
                for suffix in needs:
                    if suffix not in session.tables:
                        with session.db.cursor() as cursor:
                            cursor.execute(
                                f"CREATE TABLE IF NOT EXISTS {self.side(suffix)} "
                                f"({_SIDE_TABLES[suffix]}) ENGINE=InnoDB"
                            )
                        session.tables.add(suffix)
                if transaction:
                    session.db.begin()
                with session.db.cursor() as cursor:
                    result = work(cursor)
                if transaction:
                    session.db.commit()
                return result
            except pymysql.err.MySQLError as exc:
                if _connection_lost(exc):
                    # The server rolls back what the connection had open.
                    if self._sessions.peek() is session:
                        self._sessions.discard()
                elif transaction:
                    try:
                        session.db.rollback()
                    except pymysql.err.MySQLError:
                        if self._sessions.peek() is session:
                            self._sessions.discard()
                raise

    def execute(self, sql: str, *args: Any, needs: Sequence[str] = ()) -> int:
        """One statement; how many rows it changed."""
        return self.run(lambda cursor: cursor.execute(sql, args), needs=needs)

    def query(self, sql: str, *args: Any, needs: Sequence[str] = ()) -> list[tuple[Any, ...]]:
        """One statement's rows."""

        def work(cursor: Any) -> list[tuple[Any, ...]]:
            cursor.execute(sql, args)
            return list(cursor.fetchall())

        return self.run(work, needs=needs)

    def drop_connection(self) -> None:
        """Test hook (the kit's ``SupportsDropConnection``): cut the socket under PyMySQL."""
        session = self._sessions.peek()
        if session is not None and session.db._sock is not None:
            try:
                session.db._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- the contract -----------------------------------------------------

    def setup_priority_queue(self, name: str, priority: int) -> None:
        self.priorities.add(priority)  # one table holds every priority

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        if priority not in self.priorities:
            raise self.unknown_priority(priority, self.priorities)
        for item in items:
            if len(item.body) > HARD_LIMIT_BYTES:
                raise DeliveryError(
                    f"a body of {len(item.body)} bytes does not fit in one statement to "
                    f"{self.where} (at most {HARD_LIMIT_BYTES} bytes)"
                )
        if not items:
            return
        rows = [(priority, item.execute_at or 0.0, bytes(item.body)) for item in items]
        sql = f"INSERT INTO {self.table} (priority, due, body) VALUES (%s, %s, %s)"
        # PyMySQL may split a long batch into several INSERTs: one transaction
        # makes the batch all or nothing.
        self.run(lambda cursor: cursor.executemany(sql, rows), transaction=len(rows) > 1)

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _MariaDbConsumer(self, self.check_priorities(self.priorities, priorities))

    # -- optional features ------------------------------------------------

    def queue_stats(self) -> list[QueueStats]:
        now = time.time()
        rows = self.query(
            "SELECT priority, "
            "SUM(lease_until >= UNIX_TIMESTAMP(NOW(6))), "
            "SUM((lease_until IS NULL OR lease_until < UNIX_TIMESTAMP(NOW(6))) AND due <= %s), "
            "SUM((lease_until IS NULL OR lease_until < UNIX_TIMESTAMP(NOW(6))) AND due > %s) "
            f"FROM {self.table} GROUP BY priority",
            now,
            now,
        )
        counts = {row[0]: row[1:] for row in rows}
        stats = []
        for priority in sorted(self.priorities, reverse=True):
            in_flight, ready, scheduled = counts.get(priority, (0, 0, 0))
            stats.append(
                QueueStats(
                    priority=priority,
                    name=f"{self.where} priority {priority}",
                    ready=int(ready or 0),
                    scheduled=int(scheduled or 0),
                    in_flight=int(in_flight or 0),
                )
            )
        return stats

    def purge(self, priority: int | None = None) -> int:
        if priority is not None and priority not in self.priorities:
            raise self.unknown_priority(priority, self.priorities)
        chosen = sorted(self.priorities) if priority is None else [priority]
        marks = ",".join(["%s"] * len(chosen))
        # What waits: never leased, released, or leased by a worker that died.
        return self.execute(
            f"DELETE FROM {self.table} WHERE priority IN ({marks}) "
            "AND (lease_until IS NULL OR lease_until < UNIX_TIMESTAMP(NOW(6)))",
            *chosen,
        )

    # -- claims (SupportsClaim) --------------------------------------------

    def claim(self, key: str, ttl_s: float) -> bool:
        # One statement, atomic under the row lock: 1 row changed is an insert,
        # 2 an expired claim taken over, 0 a claim still held.
        changed = self.execute(
            f"INSERT INTO {self.side('claims')} (k, until) VALUES (%s, {_NOW} + %s) "
            f"ON DUPLICATE KEY UPDATE until = IF(until < {_NOW}, VALUES(until), until)",
            _key(key),
            float(ttl_s),
            needs=["claims"],
        )
        return changed in (1, 2)

    # -- heartbeats (SupportsHeartbeats) -----------------------------------

    def beat(self, record: Mapping[str, Any], ttl_s: float) -> None:
        self.execute(
            f"INSERT INTO {self.side('beats')} (k, record, until) VALUES (%s, %s, {_NOW} + %s) "
            "ON DUPLICATE KEY UPDATE record = VALUES(record), until = VALUES(until)",
            _key(record["id"]),
            json.dumps(record).encode(),
            float(ttl_s),
            needs=["beats"],
        )

    def forget(self, worker_id: str) -> None:
        self.execute(
            f"DELETE FROM {self.side('beats')} WHERE k = %s", _key(worker_id), needs=["beats"]
        )

    def heartbeats(self) -> list[dict[str, Any]]:
        rows = self.query(
            f"SELECT record FROM {self.side('beats')} WHERE until >= {_NOW}", needs=["beats"]
        )
        return [json.loads(bytes(row[0])) for row in rows]

    # -- job records (SupportsRecords, SupportsRecordWatch) ----------------

    def record_get(self, key: str) -> bytes | None:
        rows = self.query(
            f"SELECT v FROM {self.side('records')} WHERE k = %s AND until >= {_NOW}",
            _key(key),
            needs=["records"],
        )
        return bytes(rows[0][0]) if rows else None

    def record_put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        table = self.side("records")
        if expect is None:

            def create(cursor: Any) -> bool:
                # An expired record is gone: a new one takes a new place. The
                # insert is the compare-and-set: of puts at once one inserts,
                # the others find the key and write nothing.
                cursor.execute(f"DELETE FROM {table} WHERE k = %s AND until < {_NOW}", (_key(key),))
                return (
                    cursor.execute(
                        f"INSERT IGNORE INTO {table} (k, v, until) VALUES (%s, %s, {_NOW} + %s)",
                        (_key(key), bytes(value), float(ttl_s)),
                    )
                    == 1
                )

            return self.run(create, needs=["records"])
        changed = self.execute(
            f"UPDATE {table} SET v = %s, until = {_NOW} + %s "
            f"WHERE k = %s AND v = %s AND until >= {_NOW}",
            bytes(value),
            float(ttl_s),
            _key(key),
            bytes(expect),
            needs=["records"],
        )
        return changed == 1

    def record_wait(self, key: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        while True:
            now = self.record_get(key)
            left = deadline - time.monotonic()
            if now != seen or left <= 0:
                return now
            time.sleep(min(RECORD_POLL_S, left))  # MariaDB cannot notify: poll

    def record_wait_any(
        self, seen: Mapping[str, bytes | None], timeout_s: float
    ) -> dict[str, bytes | None]:
        keys = list(seen)
        if not keys:
            time.sleep(max(0.0, timeout_s))
            return {}
        marks = ",".join(["%s"] * len(keys))
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.query(
                f"SELECT k, v FROM {self.side('records')} WHERE k IN ({marks}) AND until >= {_NOW}",
                *[_key(key) for key in keys],
                needs=["records"],
            )
            stored = {bytes(k).decode(): bytes(v) for k, v in rows}
            changed = {key: stored.get(key) for key in keys if stored.get(key) != seen[key]}
            left = deadline - time.monotonic()
            if changed or left <= 0:
                return changed
            time.sleep(min(RECORD_POLL_S, left))

    def record_scan(self, limit: int) -> list[bytes]:
        rows = self.query(
            f"SELECT v FROM {self.side('records')} WHERE until >= {_NOW} "
            "ORDER BY seq DESC LIMIT %s",
            int(limit),
            needs=["records"],
        )
        return [bytes(row[0]) for row in rows]

    def record_page(
        self, after: str | None, limit: int, max_bytes: int, *, oldest_first: bool = False
    ) -> BrowsePage:
        # The cursor is the place (seq) of the last record listed: records
        # created meanwhile come after every place an oldest-first walk has
        # passed, and before every place a newest-first one has.
        past = None
        if after is not None:
            if not after.isdigit():
                raise ValueError(f"not a record_page cursor of {self.where}: {after!r}")
            past = int(after)
        where = f"until >= {_NOW}"
        args: list[Any] = []
        if past is not None:
            where += " AND seq > %s" if oldest_first else " AND seq < %s"
            args.append(past)
        order = "ASC" if oldest_first else "DESC"
        rows = self.query(
            f"SELECT seq, k, v FROM {self.side('records')} WHERE {where} "
            f"ORDER BY seq {order} LIMIT %s",
            *args,
            max(1, int(limit)) + 1,
            needs=["records"],
        )
        entries: list[tuple[str, bytes]] = []
        size = 0
        last = None
        for seq, k, v in rows[: max(1, int(limit))]:
            if entries and size >= max_bytes:
                break
            entries.append((bytes(k).decode(), bytes(v)))
            size += len(v)
            last = seq
            if size >= max_bytes:
                break
        more = len(entries) < len(rows)
        return BrowsePage(entries, str(last) if more and last is not None else None)

    # -- tally (SupportsTally) ---------------------------------------------

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        sets, members = self.side("sets"), self.side("members")

        def work(cursor: Any) -> tuple[bool, int]:
            # The set's row, locked: adds to one set run one at a time.
            cursor.execute(
                f"INSERT INTO {sets} (k, until) VALUES (%s, {_NOW} + %s) "
                "ON DUPLICATE KEY UPDATE k = k",
                (_key(key), float(ttl_s)),
            )
            cursor.execute(
                f"SELECT until < {_NOW} FROM {sets} WHERE k = %s FOR UPDATE", (_key(key),)
            )
            (expired,) = cursor.fetchone()
            if expired:  # a set past its ttl is gone: this add starts a new one
                cursor.execute(f"DELETE FROM {members} WHERE k = %s", (_key(key),))
            added = cursor.execute(
                f"INSERT IGNORE INTO {members} (k, member, v) VALUES (%s, %s, %s)",
                (_key(key), _key(member), bytes(value)),
            )
            cursor.execute(
                f"UPDATE {sets} SET until = {_NOW} + %s WHERE k = %s", (float(ttl_s), _key(key))
            )
            cursor.execute(f"SELECT COUNT(*) FROM {members} WHERE k = %s", (_key(key),))
            (count,) = cursor.fetchone()
            return added == 1, int(count)

        return self.run(work, transaction=True, needs=["sets", "members"])

    def tally_read(self, key: str) -> dict[str, bytes]:
        rows = self.query(
            f"SELECT m.member, m.v FROM {self.side('members')} m "
            f"JOIN {self.side('sets')} s ON s.k = m.k WHERE m.k = %s AND s.until >= {_NOW}",
            _key(key),
            needs=["sets", "members"],
        )
        return {bytes(member).decode(): bytes(v) for member, v in rows}

    # -- fleet-wide limits (SupportsLimits) --------------------------------

    def _on_limit(self, key: str, step: Callable[[Any, float], T], create: bool) -> T | None:
        """``step(state, now)`` on ``key``'s state, locked, at the server's time; stored after.

        None (without calling ``step``) when ``create`` is False and the key
        has no live state.
        """
        table = self.side("limits")

        def work(cursor: Any) -> T | None:
            if create:  # the key's row exists and is locked from here on
                cursor.execute(
                    f"INSERT INTO {table} (k, state, until) VALUES (%s, NULL, 0) "
                    "ON DUPLICATE KEY UPDATE k = k",
                    (_key(key),),
                )
            cursor.execute(
                f"SELECT state, until, {_NOW} FROM {table} WHERE k = %s FOR UPDATE", (_key(key),)
            )
            row = cursor.fetchone()
            if row is None:
                return None
            raw, until, now = row
            now = float(now)
            if until < now:  # forgotten: its state said nothing any more
                if not create:
                    return None
                raw = None
            state = limit_state.decode(bytes(raw) if raw is not None else None)
            answer = step(state, now)
            keep = limit_state.keep_for(state, now)
            if keep > 0:
                cursor.execute(
                    f"UPDATE {table} SET state = %s, until = %s WHERE k = %s",
                    (limit_state.encode(state), now + keep, _key(key)),
                )
            else:
                cursor.execute(f"DELETE FROM {table} WHERE k = %s", (_key(key),))
            return answer

        return self.run(work, transaction=True, needs=["limits"])

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        answer = self._on_limit(
            key,
            lambda state, now: limit_state.take(state, rule, slot, charged, lease_s, now),
            create=True,
        )
        assert answer is not None
        return answer

    def limit_release(self, key: str, slot: str) -> None:
        self._on_limit(key, lambda state, now: limit_state.release(state, slot, now), create=False)

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        held = self._on_limit(
            key, lambda state, now: limit_state.renew(state, slot, lease_s, now), create=False
        )
        return bool(held)

    def limit_scan(self, limit: int) -> list[tuple[str, bytes]]:
        rows = self.query(
            f"SELECT k, state FROM {self.side('limits')} "
            f"WHERE until >= {_NOW} AND state IS NOT NULL LIMIT %s",
            int(limit),
            needs=["limits"],
        )
        return [(bytes(k).decode(), bytes(state)) for k, state in rows]

    def teardown(self) -> None:
        names = ", ".join([self.table, *(self.side(suffix) for suffix in _SIDE_TABLES)])
        self.execute(f"DROP TABLE IF EXISTS {names}")
        self._sessions.discard()

    def close(self) -> None:
        self._sessions.close()


class _MariaDbConsumer(Consumer):
    """Takes a row by leasing it; core's LeaseKeeper renews the rows in handlers."""

    def __init__(self, driver: MariaDbDriver, order: list[int]) -> None:
        self.driver = driver
        self.order = order
        self.owner = owner_id()
        self._held: set[int] = set()
        self._held_lock = threading.Lock()
        self.leases = LeaseKeeper(
            self._renew, LEASE_S / 3, f"the leases of {self.owner} in {driver.where}", driver=driver
        )
        self.leases.start()

    def _take(self, cursor: Any) -> tuple[int, int, bytes, int] | None:
        table = self.driver.table
        now = time.time()
        for priority in self.order:  # highest first; the index gives (due, id) order
            cursor.execute(
                f"SELECT id, body, deliveries FROM {table} "
                "WHERE priority = %s AND due <= %s "
                "AND (lease_until IS NULL OR lease_until < UNIX_TIMESTAMP(NOW(6))) "
                "ORDER BY due, id LIMIT 1 FOR UPDATE SKIP LOCKED",
                (priority, now),
            )
            row = cursor.fetchone()
            if row is not None:
                row_id, body, deliveries = row
                cursor.execute(
                    f"UPDATE {table} SET lease_until = UNIX_TIMESTAMP(NOW(6)) + %s, "
                    "owner = %s, deliveries = deliveries + 1 WHERE id = %s",
                    (LEASE_S, self.owner, row_id),
                )
                return row_id, priority, body, deliveries + 1
        return None

    def receive(self, timeout_s: float) -> Received | None:
        deadline = time.monotonic() + timeout_s
        while True:
            taken = self.driver.run(self._take, transaction=True)
            if taken is not None:
                row_id, priority, body, count = taken
                with self._held_lock:
                    self._held.add(row_id)
                return Received(bytes(body), priority, row_id, delivery_count=count)
            if time.monotonic() + POLL_S > deadline:
                return None
            time.sleep(POLL_S)  # outside the connection's lock: settles go on meanwhile

    def _settle(self, received: Received, sql: str) -> None:
        with self._held_lock:
            self._held.discard(received.token)
        # Only while this consumer holds the lease: a row another worker took
        # after our lease ran out is that worker's now.
        self.driver.execute(sql, received.token, self.owner)

    def ack(self, received: Received) -> None:
        self._settle(received, f"DELETE FROM {self.driver.table} WHERE id = %s AND owner = %s")

    def release(self, received: Received) -> None:
        self._settle(
            received,
            f"UPDATE {self.driver.table} SET lease_until = NULL, owner = NULL "
            "WHERE id = %s AND owner = %s",
        )

    def close(self) -> None:
        # Nothing is taken ahead of the handlers. Rows still held belong to
        # handlers that outlived the grace period: they keep their lease, which
        # runs out once renewals stop, and then another worker takes them.
        self.leases.stop()

    def _renew(self) -> None:
        # On the keeper's thread, which translates what it raises.
        with self._held_lock:
            held = sorted(self._held)
        if not held:
            return
        marks = ",".join(["%s"] * len(held))
        changed = self.driver.execute(
            f"UPDATE {self.driver.table} SET lease_until = UNIX_TIMESTAMP(NOW(6)) + %s "
            f"WHERE owner = %s AND id IN ({marks})",
            LEASE_S,
            self.owner,
            *held,
        )
        if changed < len(held):
            with self._held_lock:
                still = len(self._held.intersection(held))
            if changed < still:
                log.warning(
                    "%d of the leases of %s in %s were lost: another worker may run them too",
                    still - changed,
                    self.owner,
                    self.driver.where,
                )


def _from_url(url: DriverUrl, **options: Any) -> MariaDbDriver:
    url.reject_unknown(["table", "connect_timeout"])
    url.reject_unknown_keywords(options, [])
    database = url.path.strip("/")
    if not database:
        database = "test"
    return MariaDbDriver(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        database=database,
        table=url.get_str("table", "hermes"),
        connect_timeout_s=url.get_float("connect_timeout", 5.0, minimum=0.1),
    )


def _isolate(url: DriverUrl, namespace: str) -> str:
    return url.with_options(table="t_" + namespace.replace("-", "_"))


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        DriverPlugin(
            name="mariadb",
            schemes=("mariadb",),
            factory=_from_url,
            capabilities=MariaDbDriver.capabilities,
            isolate=_isolate,
            example_url="mariadb://hermes:secret@localhost:3306/jobs?table=hermes",
        )
    ]
