"""Job records on Redis: a string key per record that Redis expires, two sorted sets to list them.

``<key>_record:<record key>`` holds the record's bytes with ``PX ttl``, so
the server decides when a record is gone. Every write is one script call
(:data:`~hermes.drivers.redis._scripts.RECORD_PUT`): it compares the bytes
stored with those the writer read, writes, notes the write in the indexes
and publishes on a channel named like the record's key, atomically among
any number of clients. ``<key>_records`` (scored by the server's time of the
record's creation, in ms; a write over a live record keeps its score) lists
the records newest first without a ``SCAN`` of the database, and pages
through them from a cursor, ``<score>:<record key>`` of the last one listed
(members of one score are in byte order); ``<key>_records_expiry`` (scored
by when each one expires) lets every write drop from both a few members
whose record has expired, so neither index outgrows the live records by more
than the writes since they expired.

A waiter subscribes to the record's channel before it reads the record, so
a write after its read is always heard: it wakes within a round trip of
the write, and never polls. Pub/sub channels are shared by every database
of a server: a write to a record of the same name in another database wakes
the waiter, which reads again and goes on waiting.
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import redis

from hermes.core.driver import BrowsePage
from hermes.drivers.redis import _scripts

#: Members whose record expired that one write drops from the indexes at most.
TRIM_PER_WRITE = 100
#: Members one scan call reads at most.
SCAN_PAGE = 500
#: The longest a waiter waits for Redis to confirm its subscription, unless
#: the client has a ``socket_timeout``.
SUBSCRIBE_TIMEOUT_S = 10.0


def record_key(queue_key: str, key: str) -> str:
    """Where the record ``key`` is kept (and the channel its writes are published on)."""
    return f"{queue_key}_record:{key}"


def index_key(queue_key: str) -> str:
    """The sorted set of record keys, scored by their creation (server time, ms)."""
    return f"{queue_key}_records"


def expiry_key(queue_key: str) -> str:
    """The sorted set of record keys, scored by when they expire (server time, ms)."""
    return f"{queue_key}_records_expiry"


def once(client: redis.Redis[Any]) -> _scripts.Execute:
    """Run each command once on a connection from ``client``'s pool; never again.

    A compare-and-set sent again after its reply was lost would find its own
    write and report a conflict: better to raise, and let the caller read
    what is stored.
    """
    pool = client.connection_pool

    def execute(command: Sequence[Any], raw: bool) -> Any:
        connection = pool.get_connection()
        try:
            connection.send_command(*command)
            return connection.read_response(disable_decoding=raw)
        except redis.ResponseError:
            raise  # Redis answered: the connection is in step
        except BaseException:
            # A reply left unread would answer the next borrower.
            connection.disconnect()
            raise
        finally:
            pool.release(connection)

    return execute


def put(
    execute: _scripts.Execute,
    queue_key: str,
    key: str,
    value: bytes,
    ttl_s: float,
    expect: bytes | None,
) -> bool:
    if not ttl_s > 0:
        raise ValueError(f"a record's ttl_s must be > 0, got {ttl_s!r}")
    keys = (record_key(queue_key, key), index_key(queue_key), expiry_key(queue_key))
    # Whole milliseconds, rounded up: a record is never kept shorter than asked.
    ttl_ms = max(1, math.ceil(ttl_s * 1000))
    args = (bytes(value), ttl_ms, b"0" if expect is None else b"1", expect or b"", TRIM_PER_WRITE)
    return bool(_scripts.RECORD_PUT(execute, keys, args))


def get(execute: _scripts.Execute, queue_key: str, key: str) -> bytes | None:
    value: bytes | None = execute(("GET", record_key(queue_key, key)), True)
    return value


def wait(
    client: redis.Redis[Any],
    execute: _scripts.Execute,
    queue_key: str,
    key: str,
    seen: bytes | None,
    timeout_s: float,
) -> bytes | None:
    name = record_key(queue_key, key)
    deadline = time.monotonic() + timeout_s
    # A pub/sub connection for this call only, disconnected when it returns,
    # however it returns: no subscription outlives the wait.
    with client.pubsub() as pubsub:
        pubsub.subscribe(name)
        kwargs = client.connection_pool.connection_kwargs
        _subscribed(pubsub, kwargs.get("socket_timeout") or SUBSCRIBE_TIMEOUT_S)
        while True:
            current: bytes | None = execute(("GET", name), True)
            left = deadline - time.monotonic()
            if current != seen or left <= 0:
                return current
            # Any message on the channel means a write: read the record again.
            pubsub.get_message(timeout=left)


def wait_any(
    client: redis.Redis[Any],
    execute: _scripts.Execute,
    queue_key: str,
    seen: Mapping[str, bytes | None],
    timeout_s: float,
) -> dict[str, bytes | None]:
    """:func:`wait` on several records: one pub/sub connection subscribed to each's channel."""
    if not seen:
        return {}
    names = {record_key(queue_key, key): key for key in seen}
    deadline = time.monotonic() + timeout_s
    with client.pubsub() as pubsub:
        pubsub.subscribe(*names)
        kwargs = client.connection_pool.connection_kwargs
        _subscribed(pubsub, kwargs.get("socket_timeout") or SUBSCRIBE_TIMEOUT_S, len(names))
        while True:
            values: list[bytes | None] = execute(("MGET", *names), True)
            changed = {
                key: value
                for key, value in zip(names.values(), values, strict=True)
                if value != seen[key]
            }
            left = deadline - time.monotonic()
            if changed or left <= 0:
                return changed
            pubsub.get_message(timeout=left)


def _subscribed(pubsub: redis.client.PubSub, timeout_s: float, channels: int = 1) -> None:
    """Wait for Redis to confirm the subscriptions: from then on, every write is heard."""
    deadline = time.monotonic() + timeout_s
    confirmed = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise redis.TimeoutError(f"Redis did not confirm a subscription within {timeout_s:g} s")
        message = pubsub.get_message(timeout=left)
        if message is not None and message["type"] == "subscribe":
            confirmed += 1
            if confirmed >= channels:
                return


def scan(execute: _scripts.Execute, queue_key: str, limit: int) -> list[bytes]:
    """Up to ``limit`` live records, newest first; members whose record expired are skipped."""
    found: list[bytes] = []
    listed: set[bytes] = set()
    start = 0
    while len(found) < limit:
        page = min(SCAN_PAGE, max(limit - len(found), 10))
        reply = _scripts.RECORD_SCAN(execute, (index_key(queue_key),), (start, page), raw=True)
        read, pairs = int(reply[0]), reply[1:]
        for at in range(0, len(pairs), 2):
            member, value = pairs[at], pairs[at + 1]
            # A record that expired and was created again moves up, and may come round twice.
            if member not in listed and len(found) < limit:
                listed.add(member)
                found.append(value)
        if read < page:
            break
        start += page
    return found


#: A page of job records past a cursor, in creation order; expired ones are left out.
#:
#: KEYS: the index by creation. ARGV: '1' oldest first ('0': newest first),
#: '1' if a cursor follows ('0': from the start), its score, its member, the
#: most records listed, the bytes after which no more are listed.
#: Reads at most one member more (and those sharing the cursor's score).
#: Returns ``{'1' if more members follow else '0', score, member of the last
#: one read (or ''), member, score, bytes, member, score, bytes, ...}``.
RECORD_PAGE = _scripts.LuaScript(
    """
local index, oldest, count = KEYS[1], ARGV[1] == '1', tonumber(ARGV[5])
local budget = tonumber(ARGV[6])
local found = {}
local function take(pairs)
    for at = 1, #pairs, 2 do found[#found + 1] = {pairs[at], pairs[at + 1]} end
end
if ARGV[2] == '1' then
    local score, after = ARGV[3], ARGV[4]
    local ties = redis.call('ZRANGEBYSCORE', index, score, score, 'WITHSCORES')
    local first, last, step = 1, #ties - 1, 2
    if not oldest then first, last, step = #ties - 1, 1, -2 end
    for at = first, last, step do
        local member = ties[at]
        if #found <= count and ((oldest and member > after) or (not oldest and member < after)) then
            found[#found + 1] = {member, ties[at + 1]}
        end
    end
    if #found <= count then
        if oldest then
            take(redis.call('ZRANGEBYSCORE', index, '(' .. score, '+inf',
                'WITHSCORES', 'LIMIT', 0, count + 1 - #found))
        else
            take(redis.call('ZREVRANGEBYSCORE', index, '(' .. score, '-inf',
                'WITHSCORES', 'LIMIT', 0, count + 1 - #found))
        end
    end
elseif oldest then
    take(redis.call('ZRANGE', index, 0, count, 'WITHSCORES'))
else
    take(redis.call('ZREVRANGE', index, 0, count, 'WITHSCORES'))
end
local reply = {#found > count and '1' or '0', '', ''}
local size, listed = 0, 0
for at, pair in ipairs(found) do
    if listed >= count or (listed > 0 and size >= budget) then
        reply[1] = '1'
        break
    end
    reply[2], reply[3] = pair[2], pair[1]
    local value = redis.call('GET', pair[1])
    if value then
        reply[#reply + 1] = pair[1]
        reply[#reply + 1] = pair[2]
        reply[#reply + 1] = value
        size = size + #value
        listed = listed + 1
    end
end
return reply
"""
)


def page(
    execute: _scripts.Execute,
    queue_key: str,
    after: str | None,
    limit: int,
    max_bytes: int,
    oldest_first: bool,
) -> BrowsePage:
    """Up to ``limit`` live records past ``after`` (see ``SupportsRecordPages``)."""
    cursor: tuple[str | bytes, ...] = ("0", "", "")
    if after is not None:
        score, colon, key = after.partition(":")
        if not colon or not score.isdigit():
            raise ValueError(f"not a page of this store's job records: {after!r}")
        cursor = ("1", score, record_key(queue_key, key))
    args = ("1" if oldest_first else "0", *cursor, max(1, limit), max(1, max_bytes))
    reply = RECORD_PAGE(execute, (index_key(queue_key),), args, raw=True)
    more, score_read, member_read, rest = reply[0] == b"1", reply[1], reply[2], reply[3:]
    prefix = len(record_key(queue_key, ""))
    entries: list[tuple[Hashable, bytes | str]] = [
        (rest[at].decode()[prefix:], rest[at + 2]) for at in range(0, len(rest), 3)
    ]
    following = None
    if more and member_read:
        following = f"{int(float(score_read))}:{member_read.decode()[prefix:]}"
    return BrowsePage(entries, following)


def keys(execute: _scripts.Execute, queue_key: str) -> list[str]:
    """Every key the records use: the records listed in the index, and the indexes."""
    members = execute(("ZRANGE", index_key(queue_key), 0, -1), True)
    return [
        *(member.decode() for member in members),
        index_key(queue_key),
        expiry_key(queue_key),
    ]
