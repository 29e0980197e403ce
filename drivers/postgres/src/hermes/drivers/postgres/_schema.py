"""The tables of one driver, and every statement it runs on them, as SQL text.

Importable without psycopg: ``python -m hermes.drivers.postgres schema`` and
the README print the same DDL the driver runs on first use.

One messages table holds every queue and priority of a driver (``queue``
and ``priority`` columns); a message is one row from ``put`` until its ack
deletes it. A second table keeps the bodies a worker set aside (not Hermes
messages), a third the claims of periodic ticks and unique emits.
Identifiers are checked against a strict pattern and then quoted, so they
can be written into the statements as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

try:
    # CPython's own SHA-1: hashlib would load OpenSSL's libcrypto (0.6 MB of a
    # worker's memory) for this one short digest.
    from _sha1 import sha1  # type: ignore[import-not-found]
except ImportError:  # an interpreter without it
    from hashlib import sha1

from hermes.core import ConfigurationError

#: A table or schema name the driver accepts: lower case, so that the quoted
#: name and the one a DBA types unquoted in psql are the same table.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,47}")


def check_identifier(kind: str, name: str) -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"{kind} {name!r} must be a lower-case SQL identifier of at most 48 characters "
            "(letters, digits, underscores; not starting with a digit)"
        )
    return name


@dataclass(frozen=True)
class Names:
    """The SQL names of one driver's tables, index, lock key and NOTIFY channels."""

    schema: str
    table: str

    def __post_init__(self) -> None:
        check_identifier("schema", self.schema)
        check_identifier("table", self.table)

    @property
    def messages(self) -> str:
        return f'"{self.schema}"."{self.table}"'

    @property
    def rejected(self) -> str:
        return f'"{self.schema}"."{self.table}_rejected"'

    @property
    def claims(self) -> str:
        return f'"{self.schema}"."{self.table}_claims"'

    @property
    def lock_key(self) -> str:
        """Text hashed into the advisory lock that serializes creating these tables."""
        return f"hermes-postgres:{self.schema}.{self.table}"

    def channel(self, queue: str) -> str:
        """The LISTEN/NOTIFY channel of ``queue``: short, as channels are at most 63 bytes."""
        digest = sha1(f"{self.schema}.{self.table}.{queue}".encode()).hexdigest()
        return f"hermes_{digest[:20]}"

    def records_channel(self, queue: str) -> str:
        """The channel a write of ``queue``'s job records notifies, the key as its payload."""
        digest = sha1(f"{self.schema}.{self.table}.{queue}.records".encode()).hexdigest()
        return f"hermes_r_{digest[:20]}"


def create_sql(names: Names) -> str:
    """The DDL of a driver's tables; idempotent (``IF NOT EXISTS``).

    ``fillfactor`` leaves room in each page so that claiming, renewing and
    releasing a row (which change only unindexed columns) are HOT updates:
    no new index entry, and the old version is pruned within the page.
    """
    table = names.table
    return f"""\
CREATE TABLE IF NOT EXISTS {names.messages} (
    id bigserial PRIMARY KEY,
    queue text NOT NULL,
    priority integer NOT NULL,
    body bytea NOT NULL,
    available_at timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    locked_by text,
    locked_until timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02);
CREATE INDEX IF NOT EXISTS "{table}_claim"
    ON {names.messages} (queue, priority, available_at, id);
CREATE TABLE IF NOT EXISTS {names.rejected} (
    id bigint PRIMARY KEY,
    queue text NOT NULL,
    priority integer NOT NULL,
    body bytea NOT NULL,
    attempts integer NOT NULL,
    reason text NOT NULL,
    created_at timestamptz NOT NULL,
    rejected_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {names.claims} (
    queue text NOT NULL,
    key text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue, key)
);
"""


def drop_sql(names: Names) -> str:
    return f"DROP TABLE IF EXISTS {names.messages}, {names.rejected}, {names.claims};"


#: A row no worker holds: never claimed, released, or its worker's lease ran out.
UNLOCKED = "(locked_until IS NULL OR locked_until < now())"


class Statements:
    """The driver's statements on ``names``; ``%s`` parameters, psycopg style."""

    def __init__(self, names: Names) -> None:
        m = names.messages
        # One statement, so one round trip: the CTE's INSERT runs whether or not
        # the SELECT reads it, and pg_notify joins the same transaction (it is
        # delivered at commit, and not at all on rollback).
        self.insert = (
            f"WITH put AS (INSERT INTO {m} (queue, priority, body, available_at) "
            "SELECT %(queue)s, %(priority)s, u.body, "
            "coalesce(to_timestamp(u.execute_at), now()) "
            "FROM unnest(%(bodies)s::bytea[], %(execute_at)s::float8[]) AS u(body, execute_at)) "
            "SELECT pg_notify(%(channel)s, %(wake)s)"
        )
        self.ack = f"DELETE FROM {m} WHERE id = %s"
        # Only the holder gives a row back: one whose lease ran out and that
        # another worker took since is that worker's now.
        self.release = (
            f"UPDATE {m} SET locked_by = NULL, locked_until = NULL WHERE id = %s AND locked_by = %s"
        )
        self.reject = (
            f"WITH gone AS (DELETE FROM {m} WHERE id = %(id)s RETURNING *) "
            f"INSERT INTO {names.rejected} "
            "(id, queue, priority, body, attempts, reason, created_at) "
            "SELECT id, queue, priority, body, attempts, %(reason)s, created_at FROM gone "
            "ON CONFLICT (id) DO NOTHING"
        )
        # By id through the primary key: an index on locked_by would make every
        # claim a non-HOT update.
        self.renew = (
            f"UPDATE {m} SET locked_until = now() + make_interval(secs => %s) "
            "WHERE id = ANY(%s) AND locked_by = %s"
        )
        self.stats = (
            "SELECT priority, "
            f"count(*) FILTER (WHERE available_at <= now() AND {UNLOCKED}), "
            f"count(*) FILTER (WHERE available_at > now() AND {UNLOCKED}), "
            f"count(*) FILTER (WHERE NOT {UNLOCKED}), "
            "0 "
            f"FROM {m} WHERE queue = %(queue)s GROUP BY priority "
            "UNION ALL "
            "SELECT priority, 0, 0, 0, count(*) "
            f"FROM {names.rejected} WHERE queue = %(queue)s GROUP BY priority"
        )
        self.purge = f"DELETE FROM {m} WHERE queue = %s AND priority = ANY(%s) AND {UNLOCKED}"
        self.browse = (
            f"SELECT id, body FROM {m} WHERE queue = %s AND {UNLOCKED} "
            "ORDER BY priority DESC, available_at, id"
        )
        # A page: the rows after a (priority, available_at, id) in the browse order, their
        # sizes first (a page stops at a byte budget), then the bodies of those it shows.
        self.browse_page = (
            f"SELECT id, priority, available_at, octet_length(body) FROM {m} "
            f"WHERE queue = %(queue)s AND {UNLOCKED} AND (%(after)s::boolean IS NOT TRUE OR "
            "(-priority, available_at, id) > (-%(priority)s::integer, "
            "%(available_at)s::timestamptz, %(id)s::bigint)) "
            "ORDER BY priority DESC, available_at, id LIMIT %(limit)s"
        )
        self.browse_bodies = f"SELECT id, body FROM {m} WHERE id = ANY(%s) AND queue = %s"
        self.remove = f"DELETE FROM {m} WHERE id = %s AND queue = %s AND {UNLOCKED}"
        # Won when the row is new or its claim had expired. Concurrent claimers
        # of one key queue on its row (or its speculative insert) and re-check
        # the WHERE on the version the winner wrote, which has not expired:
        # exactly one gets a row back. now() and the expiry are the server's
        # clock alone, so claimers on hosts whose clocks differ still agree.
        self.claim_key = (
            f"INSERT INTO {names.claims} AS c (queue, key, expires_at) "
            "VALUES (%(queue)s, %(key)s, now() + make_interval(secs => %(ttl_s)s)) "
            "ON CONFLICT (queue, key) DO UPDATE SET expires_at = EXCLUDED.expires_at "
            "WHERE c.expires_at <= now() "
            "RETURNING key"
        )
        # Ticks are claimed under a new key each time: expired claims would pile
        # up without this. Deleting one a claimer is racing for is safe, as
        # INSERT ... ON CONFLICT retries when the conflicting row goes away.
        self.sweep_claims = f"DELETE FROM {names.claims} WHERE expires_at <= now()"
        self._messages = m

    def claim(self, priorities: list[int]) -> str:
        """Take the next due row, highest priority first, and lease it to ``%(worker)s``.

        One branch per priority, each an ordered scan of the claim index that
        stops at its first unlocked due row; ``LIMIT 1`` over the ``UNION ALL``
        stops at the first branch that found one, so a lower priority is not
        even read while a higher one has work. ``SKIP LOCKED`` passes over
        rows another worker is claiming at that instant, and PostgreSQL
        re-checks a row that changed under the scan, so no two workers take
        one row. ``priorities`` are ints, written in as literals.
        """
        branches = " UNION ALL ".join(
            f"SELECT * FROM (SELECT id FROM {self._messages} "
            f"WHERE queue = %(queue)s AND priority = {int(priority)} "
            f"AND available_at <= now() AND {UNLOCKED} "
            "ORDER BY available_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) AS p"
            f"{index}"
            for index, priority in enumerate(priorities)
        )
        return (
            f"UPDATE {self._messages} SET locked_by = %(worker)s, "
            "locked_until = now() + make_interval(secs => %(lease_s)s), "
            "attempts = attempts + 1 "
            f"WHERE id = (SELECT id FROM ({branches}) AS next LIMIT 1) "
            "RETURNING id, priority, body, attempts"
        )
