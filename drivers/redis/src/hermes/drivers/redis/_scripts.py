"""The Lua scripts of the Redis driver.

Each script runs atomically on the server in one round trip: no other client's
command runs between its steps, which is what makes the scheduler move safe
with many workers and keeps ``send`` and the wake-up token one operation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError

#: ``unpack()`` in Redis's Lua is limited to about 8000 values; stay well below.
MAX_SCRIPT_VALUES = 1000


#: ``execute(command, raw)``: run one command, reply undecoded when ``raw``.
Execute = Callable[[Sequence[Any], bool], Any]


def on_pool(client: redis.Redis[Any]) -> Execute:
    """Run each command on a connection borrowed from ``client``'s pool.

    Cheaper than ``client.execute_command``, whose per-command retry and
    bookkeeping cost about as much as the round trip. The pool hands out live
    connections; a command that still meets a dropped one is sent once more on
    a new connection (what the driver sends this way is harmless twice: a set
    ignores a member added twice, a wake token or a rejected body listed twice
    costs nothing), then the error is raised.
    """
    pool = client.connection_pool

    def execute(command: Sequence[Any], raw: bool) -> Any:
        connection = pool.get_connection()
        try:
            try:
                connection.send_command(*command)
                return connection.read_response(disable_decoding=raw)
            except (redis.ConnectionError, redis.TimeoutError):
                connection.disconnect()
                connection.send_command(*command)
                return connection.read_response(disable_decoding=raw)
        finally:
            pool.release(connection)

    return execute


class LuaScript:
    """A script called by its SHA1, sent again with ``EVAL`` if the server lost it.

    Its reply can be read undecoded, so message bodies come back as bytes even
    from a ``decode_responses=True`` client (a body that is not UTF-8 is then a
    poison message, not a client error).
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(
        self,
        execute: Execute,
        keys: Sequence[str],
        args: Sequence[str | bytes | float | int] = (),
        *,
        raw: bool = False,
    ) -> Any:
        try:
            return execute(("EVALSHA", self.sha, len(keys), *keys, *args), raw)
        except NoScriptError:
            # First use on this server, or the server restarted: EVAL caches it again.
            return execute(("EVAL", self.source, len(keys), *keys, *args), raw)


#: Put messages on a queue set and/or the schedule, and wake idle workers.
#:
#: KEYS: queue set, schedule sorted set, wake list of the queue, wake list of
#: the default queue (where scheduled messages will be moved).
#: ARGV: wake list cap, number N of immediate bodies, the N bodies, then
#: (score, body) pairs for the schedule.
SEND = LuaScript(
    """
local cap = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local function wake(list, count)
    local room = cap - redis.call('LLEN', list)
    if count > room then count = room end
    for _ = 1, count do redis.call('LPUSH', list, '1') end
end
if n > 0 then
    redis.call('SADD', KEYS[1], unpack(ARGV, 3, 2 + n))
    wake(KEYS[3], n)
end
if #ARGV > 2 + n then
    redis.call('ZADD', KEYS[2], unpack(ARGV, 3 + n))
    wake(KEYS[4], (#ARGV - 2 - n) / 2)
end
return n
"""
)

#: Pop one body from the first non-empty set of KEYS (highest priority first).
#: Returns ``{index, body}`` (1-based index into KEYS) or nil.
POP_FIRST = LuaScript(
    """
for i = 1, #KEYS do
    local body = redis.call('SPOP', KEYS[i])
    if body then return {i, body} end
end
return false
"""
)

#: Move due scheduled messages to the default queue, atomically.
#:
#: KEYS: schedule sorted set, default queue set, wake list of the default queue.
#: ARGV: now (UNIX time), most members to move, wake list cap.
#: Returns ``{moved, score of the earliest message still scheduled or nil}``.
#: Each moved message pushes a wake token, so idle workers help at once.
MOVE_DUE = LuaScript(
    """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then
    redis.call('ZREM', KEYS[1], unpack(due))
    redis.call('SADD', KEYS[2], unpack(due))
    local count = #due
    local room = tonumber(ARGV[3]) - redis.call('LLEN', KEYS[3])
    if count > room then count = room end
    for _ = 1, count do redis.call('LPUSH', KEYS[3], '1') end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {#due, first[2] or false}
"""
)

#: Set a body aside: push it to a list kept to the newest few.
#:
#: KEYS: the list. ARGV: how many bodies the list keeps, the body.
SET_ASIDE = LuaScript(
    """
redis.call('LPUSH', KEYS[1], ARGV[2])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[1]) - 1)
return 1
"""
)


# At-least-once: leases ------------------------------------------------------------
#
# A message taken by an at-least-once worker is moved, in the script that takes
# it, from its set to a lease: its lease token (unique per take, naming the
# worker) is a member of the sorted set ``<set>_inflight`` whose score is the
# lease deadline in milliseconds of the server's clock, and the body is the
# token's field in the hash ``<set>_inflight_bodies``. Acknowledging deletes
# both; releasing, or the lease running out, puts the body back in the set.
# The scripts that set or compare a deadline read the server's clock (TIME), so
# workers on hosts whose clocks disagree still agree on when a lease ends.

#: The server's clock in milliseconds; ``TIME`` before a write needs effects
#: replication, the default since Redis 5 (and the only mode since 7).
_NOW_MS = """
if redis.replicate_commands then redis.replicate_commands() end
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

#: Push up to ``count`` wake tokens to ``list``, keeping it at most ``cap`` long.
_WAKE = """
local function wake(list, count, cap)
    local room = cap - redis.call('LLEN', list)
    if count > room then count = room end
    for _ = 1, count do redis.call('LPUSH', list, '1') end
end
"""

#: Acknowledge the leases given, then take one body from the first non-empty
#: set under a new lease.
#:
#: KEYS: the N sets (highest priority first), then their N lease sorted sets,
#: then their N lease body hashes.
#: ARGV: lease length in ms, the new lease's token (empty: take nothing), the
#: number A of leases to acknowledge, then A (1-based set index, token) pairs.
#: Returns ``{index, body}`` (just the body when N = 1) or nil; the
#: acknowledgements are done either way.
CLAIM = LuaScript(
    _NOW_MS
    + """
local n = #KEYS / 3
local acks = tonumber(ARGV[3])
for a = 0, acks - 1 do
    local i, token = tonumber(ARGV[4 + 2 * a]), ARGV[5 + 2 * a]
    redis.call('ZREM', KEYS[n + i], token)
    redis.call('HDEL', KEYS[2 * n + i], token)
end
if ARGV[2] == '' then return false end
for i = 1, n do
    local body = redis.call('SPOP', KEYS[i])
    if body then
        local deadline = string.format('%d', now_ms + tonumber(ARGV[1]))
        redis.call('ZADD', KEYS[n + i], deadline, ARGV[2])
        redis.call('HSET', KEYS[2 * n + i], ARGV[2], body)
        if n == 1 then return body end
        return {i, body}
    end
end
return false
"""
)

#: Acknowledge one lease: the message is done with.
#:
#: KEYS: lease sorted set, lease body hash. ARGV: token. Returns 1 if the lease
#: was still there (0: it ran out and the body went back to its set).
ACK = LuaScript(
    """
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
"""
)

#: Release one lease: its body goes back to its set at once, and wakes a worker.
#:
#: KEYS: the set, its lease sorted set, its lease body hash, its wake list.
#: ARGV: token, wake list cap. Returns 1 if the body went back, 0 if the lease
#: was gone (it ran out, and the body went back then).
RELEASE = LuaScript(
    _WAKE
    + """
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
local body = redis.call('HGET', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if not body then return 0 end
redis.call('SADD', KEYS[1], body)
wake(KEYS[4], 1, tonumber(ARGV[2]))
return 1
"""
)

#: Set the body of a lease aside: ends the lease and pushes the body to a capped list.
#:
#: KEYS: the list, the lease sorted set, the lease body hash.
#: ARGV: how many bodies the list keeps, token. Returns 1 if set aside, 0 if
#: the lease was gone (the body went back to its set when it ran out).
SET_ASIDE_LEASED = LuaScript(
    """
if redis.call('ZREM', KEYS[2], ARGV[2]) == 0 then return 0 end
local body = redis.call('HGET', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[2])
if not body then return 0 end
redis.call('LPUSH', KEYS[1], body)
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[1]) - 1)
return 1
"""
)

#: Extend the leases a worker holds to now + the lease length.
#:
#: KEYS: lease sorted sets. ARGV: lease length in ms, then for each key the
#: number of its tokens followed by them. Returns the tokens whose lease was
#: gone (it ran out before this renewal: their bodies went back to their sets).
RENEW = LuaScript(
    _NOW_MS
    + """
local deadline = string.format('%d', now_ms + tonumber(ARGV[1]))
local lost = {}
local at = 2
for k = 1, #KEYS do
    local count = tonumber(ARGV[at])
    for t = at + 1, at + count do
        if redis.call('ZADD', KEYS[k], 'XX', 'CH', deadline, ARGV[t]) == 0
            and not redis.call('ZSCORE', KEYS[k], ARGV[t]) then
            lost[#lost + 1] = ARGV[t]
        end
    end
    at = at + count + 1
end
return lost
"""
)

#: :data:`MOVE_DUE`, then put back the bodies of leases that ran out.
#:
#: KEYS: schedule sorted set, default queue set, wake list of the default
#: queue, then for each set whose leases to look at: the set, its lease sorted
#: set, its lease body hash, its wake list.
#: ARGV: now (UNIX time, for the schedule), most members to move (and to put
#: back per set), wake list cap.
#: Returns ``{moved, score of the earliest message still scheduled or nil, put back}``.
MOVE_DUE_AND_RECOVER = LuaScript(
    _NOW_MS
    + _WAKE
    + """
local limit, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, limit)
if #due > 0 then
    redis.call('ZREM', KEYS[1], unpack(due))
    redis.call('SADD', KEYS[2], unpack(due))
    wake(KEYS[3], #due, cap)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local recovered = 0
for k = 4, #KEYS, 4 do
    local expired = redis.call('ZRANGEBYSCORE', KEYS[k + 1], '-inf', now_ms, 'LIMIT', 0, limit)
    if #expired > 0 then
        local bodies = redis.call('HMGET', KEYS[k + 2], unpack(expired))
        redis.call('ZREM', KEYS[k + 1], unpack(expired))
        redis.call('HDEL', KEYS[k + 2], unpack(expired))
        local back = {}
        for _, body in ipairs(bodies) do
            if body then back[#back + 1] = body end
        end
        if #back > 0 then
            redis.call('SADD', KEYS[k], unpack(back))
            wake(KEYS[k + 3], #back, cap)
            recovered = recovered + #back
        end
    end
end
return {#due, first[2] or false, recovered}
"""
)

#: Delete what waits in sets and, optionally, a schedule; how many members that was.
#:
#: KEYS: the sets, then the schedule sorted set if ARGV[1] is '1'.
CLEAR = LuaScript(
    """
local removed = 0
local sets = #KEYS
if ARGV[1] == '1' then
    sets = sets - 1
    removed = redis.call('ZCARD', KEYS[#KEYS])
    redis.call('DEL', KEYS[#KEYS])
end
for i = 1, sets do
    removed = removed + redis.call('SCARD', KEYS[i])
    redis.call('DEL', KEYS[i])
end
return removed
"""
)


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class PackedCall:
    """One script's ``EVALSHA`` with its keys and leading arguments packed once.

    The hot loop of an at-least-once worker calls the same script with the
    same keys for every message; packing only the arguments that change
    (``pack(*tail)``) costs a fraction of redis-py's generic packing. On
    ``NoScriptError`` the caller sends the script itself with
    :class:`LuaScript` (which loads it) and goes on with the packed calls.
    """

    def __init__(
        self, script: LuaScript, keys: Sequence[str], head: Sequence[str | int] = ()
    ) -> None:
        self.script = script
        self.keys = list(keys)
        self.head = list(head)
        words = [b"EVALSHA", script.sha.encode(), b"%d" % len(keys)]
        words += [key.encode() for key in keys]
        words += [str(arg).encode() for arg in head]
        self._count = len(words)
        self._prefix = b"".join(_bulk(word) for word in words)

    def pack(self, *tail: bytes) -> bytes:
        """The RESP command: the packed head, then ``tail``."""
        return (
            b"*%d\r\n" % (self._count + len(tail))
            + self._prefix
            + b"".join([_bulk(arg) for arg in tail])
        )
