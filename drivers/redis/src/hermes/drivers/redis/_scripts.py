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
                # connect() first: a Sentinel-managed connection asks the
                # Sentinels for the master there; send_command alone would
                # reconnect to the address it had (a master gone in a failover).
                connection.connect()
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
# A worker that takes messages at least once holds them under its lease. For a
# set ``<set>`` it takes from, the worker (its owner id, ``<host>:<pid>:<random>``)
# is a member of the sorted set ``<set>_inflight`` whose score is its lease
# deadline in milliseconds of the server's clock, and the messages it holds are
# the hash ``<set>_inflight:<owner>``, take number -> body. Taking a message is
# one script call that moves the body from the set into that hash; acknowledging
# deletes the field; releasing puts the body back in the set. The worker renews
# its lease (one write, however many messages it holds) while it lives. When
# the deadline passes (the worker died, or stalled longer than a lease), any
# worker on the set puts back every body the hash holds, deletes it and the
# owner in one script, so a body goes back once and is handed to one worker.
#
# Deliveries are counted per body in the hash ``<set>_deliveries`` (the body's
# SHA-1 -> how many takes of it ended without a settlement): a release and a
# run-out lease add one, and the next take reports one more than the hash
# holds; acknowledging or setting the body aside deletes it. A message handled
# the first time, the common case, writes nothing there: while the hash does
# not exist the take does not even hash the body. A set holds a body once, so
# the body is the message's identity here, as it is for SADD.
#
# Invariant: a body is in a lease hash only while its owner is in the sorted
# set. The take registers the owner if it is missing (first take, or after its
# lease ran out), so a worker whose lease ran out and who goes on taking never
# leaves a body nobody would put back. The scripts that put bodies back build
# the hash keys from the owners they read (so the keys of one driver must live
# on one server, as they do on a single Redis; a cluster is not supported).
# The scripts that read a deadline read the server's clock (TIME), so workers
# on hosts whose clocks disagree still agree on when a lease ends.

#: A script that reads ``TIME`` and then writes needs effects replication: the
#: default since Redis 5 and the only mode since 7. Asked for first, before any write.
_EFFECTS = """
if redis.replicate_commands then redis.replicate_commands() end
"""

#: ``now_ms``: the server's clock in milliseconds.
_NOW_MS = """
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

#: ``wake(list, count, cap)``: push up to ``count`` wake tokens, ``list`` kept at most ``cap`` long.
_WAKE = """
local function wake(list, count, cap)
    local room = cap - redis.call('LLEN', list)
    if count > room then count = room end
    for _ = 1, count do redis.call('LPUSH', list, '1') end
end
"""

#: ``leases_of(set)``: the sorted set of the leases on ``set`` (as :func:`inflight_key`);
#: ``held_by(set, owner)``: the hash of what ``owner`` holds from it (as :func:`held_key`).
_LEASE_KEYS = """
local function leases_of(set) return set .. '_inflight' end
local function held_by(set, owner) return leases_of(set) .. ':' .. owner end
"""

#: Acknowledge the takes given, then take up to M bodies from the first non-empty set.
#:
#: KEYS: the N sets (highest priority first), then their N lease sorted sets,
#: then the owner's N lease hashes on them, then their N delivery counts.
#: ARGV: lease length in ms, owner, M (the most to take: the worker's
#: prefetch; 0 takes nothing), the first take's number (the others follow it
#: one by one; empty: take nothing, and leave the sorted sets where the owner
#: holds nothing: the worker is closing), the number A of takes to
#: acknowledge, then A (1-based set index, take number, body digest) triples.
#: Returns ``{index, body, deliveries, digest}`` for each body taken, in the
#: order of their take numbers (empty: nothing was waiting); the digest is
#: empty when no body of the set had a count. One body from the first set
#: whose digest is empty (its first delivery) comes back as the body alone.
#: The acknowledgements are done either way.
CLAIM = LuaScript(
    _EFFECTS
    + """
local n = #KEYS / 4
local owner, most, first = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local function acknowledge()
    for a = 6, 5 + 3 * tonumber(ARGV[5]), 3 do
        local i = tonumber(ARGV[a])
        redis.call('HDEL', KEYS[2 * n + i], ARGV[a + 1])
        if ARGV[a + 2] ~= '' then redis.call('HDEL', KEYS[3 * n + i], ARGV[a + 2]) end
    end
end
if first == '' then
    acknowledge()
    for i = 1, n do
        if redis.call('EXISTS', KEYS[2 * n + i]) == 0 then
            redis.call('ZREM', KEYS[n + i], owner)
        end
    end
    return {}
end
local taken = {}
if most > 0 then
    for i = 1, n do
        local bodies = redis.call('SPOP', KEYS[i], most)
        if #bodies > 0 then
            if not redis.call('ZSCORE', KEYS[n + i], owner) then
"""
    + _NOW_MS
    + """
                local deadline = string.format('%d', now_ms + tonumber(ARGV[1]))
                redis.call('ZADD', KEYS[n + i], deadline, owner)
            end
            local number = tonumber(first)
            local counted = redis.call('EXISTS', KEYS[3 * n + i]) == 1
            for _, body in ipairs(bodies) do
                -- Held first, acknowledged after: a busy worker's hash never empties, so
                -- Redis does not delete and create it again for every message.
                redis.call('HSET', KEYS[2 * n + i], string.format('%d', number), body)
                local deliveries, digest = 1, ''
                if counted then
                    digest = redis.sha1hex(body)
                    local earlier = redis.call('HGET', KEYS[3 * n + i], digest)
                    deliveries = deliveries + (tonumber(earlier) or 0)
                end
                taken[#taken + 1] = i
                taken[#taken + 1] = body
                taken[#taken + 1] = deliveries
                taken[#taken + 1] = digest
                number = number + 1
            end
            break
        end
    end
end
acknowledge()
-- The usual take, one body from the first set delivered the first time: the
-- body alone, which the client parses for a fraction of the four-part reply.
if #taken == 4 and taken[1] == 1 and taken[4] == '' then return taken[2] end
return taken
"""
)

#: Put back what a closing worker took and never handed to a handler: each
#: body returns to its set as if it had never been taken (its delivery count
#: stays as it was), and the sets are woken.
#:
#: KEYS: the N sets, then the owner's N lease hashes on them, then their N
#: wake lists. ARGV: the wake list cap, then (1-based set index, take number)
#: pairs.
#: Returns how many bodies went back.
GIVE_BACK = LuaScript(
    _WAKE
    + """
local n = #KEYS / 3
local back = 0
for a = 2, #ARGV, 2 do
    local i = tonumber(ARGV[a])
    local body = redis.call('HGET', KEYS[n + i], ARGV[a + 1])
    if body then
        redis.call('HDEL', KEYS[n + i], ARGV[a + 1])
        redis.call('SADD', KEYS[i], body)
        wake(KEYS[2 * n + i], 1, tonumber(ARGV[1]))
        back = back + 1
    end
end
return back
"""
)

#: Acknowledge one take from another thread than the one that takes: it is
#: forgotten, and so is its delivery count.
#:
#: KEYS: the owner's lease hash, the set's delivery counts. ARGV: take number, body digest.
ACK = LuaScript(
    """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[2])
return 1
"""
)

#: Release one take: its body goes back to its set at once, one more delivery
#: counted, and wakes a worker.
#:
#: KEYS: the set, the owner's lease hash on it, the set's wake list, its delivery counts.
#: ARGV: take number, wake list cap. Returns 1 if the body went back, 0 if it
#: was no longer held (the lease ran out, and the body went back then).
RELEASE = LuaScript(
    _WAKE
    + """
local body = redis.call('HGET', KEYS[2], ARGV[1])
if not body then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[1], body)
redis.call('HINCRBY', KEYS[4], redis.sha1hex(body), 1)
wake(KEYS[3], 1, tonumber(ARGV[2]))
return 1
"""
)

#: Set the body of a take aside: it leaves the lease for a capped list.
#:
#: KEYS: the list, the owner's lease hash, the set's delivery counts.
#: ARGV: how many bodies the list keeps, take number, body digest.
#: Returns 1 if set aside, 0 if it was no longer held.
SET_ASIDE_LEASED = LuaScript(
    """
local body = redis.call('HGET', KEYS[2], ARGV[2])
if not body then return 0 end
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[3])
redis.call('LPUSH', KEYS[1], body)
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[1]) - 1)
return 1
"""
)

#: Extend the owner's lease on each set given to now + the lease length.
#:
#: KEYS: lease sorted sets. ARGV: lease length in ms, owner. Returns the
#: 1-based indexes of the KEYS where the owner was gone: its lease there ran
#: out before this renewal, and what it held went back to the set. It is
#: leased again there (holding nothing yet).
RENEW = LuaScript(
    _EFFECTS
    + _NOW_MS
    + """
local deadline = string.format('%d', now_ms + tonumber(ARGV[1]))
local lost = {}
for k = 1, #KEYS do
    if redis.call('ZADD', KEYS[k], deadline, ARGV[2]) == 1 then lost[#lost + 1] = k end
end
return lost
"""
)

#: :data:`MOVE_DUE`, then put back what the owners of run-out leases held,
#: one more delivery counted for each body.
#:
#: KEYS: schedule sorted set, default queue set, wake list of the default
#: queue, then for each set whose leases to look at: the set, its lease sorted
#: set, its wake list, its delivery counts.
#: ARGV: now (UNIX time, for the schedule), most members to move (and owners
#: to look at per set), wake list cap.
#: Returns ``{moved, score of the earliest message still scheduled or nil, put back}``.
MOVE_DUE_AND_RECOVER = LuaScript(
    _EFFECTS
    + _NOW_MS
    + _WAKE
    + _LEASE_KEYS
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
    for _, owner in ipairs(expired) do
        local held = held_by(KEYS[k], owner)
        local bodies = redis.call('HVALS', held)
        for at = 1, #bodies, 1000 do
            redis.call('SADD', KEYS[k], unpack(bodies, at, math.min(at + 999, #bodies)))
        end
        for _, body in ipairs(bodies) do
            redis.call('HINCRBY', KEYS[k + 3], redis.sha1hex(body), 1)
        end
        redis.call('DEL', held)
        redis.call('ZREM', KEYS[k + 1], owner)
        if #bodies > 0 then
            wake(KEYS[k + 2], #bodies, cap)
            recovered = recovered + #bodies
        end
    end
end
return {#due, first[2] or false, recovered}
"""
)

#: How many messages are held under leases on each set.
#:
#: KEYS: the sets. Returns the counts, in order.
IN_FLIGHT = LuaScript(
    _LEASE_KEYS
    + """
local counts = {}
for i = 1, #KEYS do
    local held = 0
    for _, owner in ipairs(redis.call('ZRANGE', leases_of(KEYS[i]), 0, -1)) do
        held = held + redis.call('HLEN', held_by(KEYS[i], owner))
    end
    counts[i] = held
end
return counts
"""
)

#: Delete every lease on the sets given: the sorted sets and the hashes of their owners.
#:
#: KEYS: the sets.
DROP_LEASES = LuaScript(
    _LEASE_KEYS
    + """
for i = 1, #KEYS do
    local leases = leases_of(KEYS[i])
    for _, owner in ipairs(redis.call('ZRANGE', leases, 0, -1)) do
        redis.call('DEL', held_by(KEYS[i], owner))
    end
    redis.call('DEL', leases)
end
return 1
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


#: Compare-and-set a job record: write it only if the bytes stored are those
#: expected (or, with no expectation, if none are), note the write in the
#: indexes, drop from them a few records that expired, and publish the write.
#:
#: KEYS: the record, the index by creation, the index by expiry (both
#: sorted sets of record keys, scored in ms of the server's clock).
#: ARGV: the new bytes, ttl in ms, '1' if bytes are expected ('0': none may be
#: stored), the expected bytes, the most expired members to drop.
#: Returns 1 if it wrote, 0 if the bytes stored were not those expected.
#: The notification goes to the channel named like the record's key.
RECORD_PUT = LuaScript(
    _EFFECTS
    + """
local stored = redis.call('GET', KEYS[1])
if ARGV[3] == '1' then
    if stored ~= ARGV[4] then return 0 end
elseif stored then
    return 0
end
"""
    + _NOW_MS
    + """
local ttl = tonumber(ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
-- The index orders records by creation: a write over a live record keeps its place.
if stored then
    redis.call('ZADD', KEYS[2], 'NX', string.format('%d', now_ms), KEYS[1])
else
    redis.call('ZADD', KEYS[2], string.format('%d', now_ms), KEYS[1])
end
redis.call('ZADD', KEYS[3], string.format('%d', now_ms + ttl), KEYS[1])
local gone = redis.call(
    'ZRANGEBYSCORE', KEYS[3], '-inf', string.format('(%d', now_ms), 'LIMIT', 0, tonumber(ARGV[5])
)
if #gone > 0 then
    redis.call('ZREM', KEYS[2], unpack(gone))
    redis.call('ZREM', KEYS[3], unpack(gone))
end
redis.call('PUBLISH', KEYS[1], '1')
return 1
"""
)

#: A page of job records, newest first: those whose key has expired are left out.
#:
#: KEYS: the index by creation. ARGV: the first rank (0: the newest), how many.
#: Returns ``{members read, member, bytes, member, bytes, ...}`` for the live ones.
RECORD_SCAN = LuaScript(
    """
local members = redis.call(
    'ZREVRANGE', KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[1]) + tonumber(ARGV[2]) - 1
)
local reply = {#members}
for _, member in ipairs(members) do
    local value = redis.call('GET', member)
    if value then
        reply[#reply + 1] = member
        reply[#reply + 1] = value
    end
end
return reply
"""
)


#: Add a member to a tally unless it is there, and say how many it holds.
#:
#: KEYS: the tally (a hash of member -> value). ARGV: the member, its value,
#: how long the tally is kept after this add, in ms.
#: Returns ``{1 if this call added the member else 0, members now}``.
TALLY_ADD = LuaScript(
    """
local added = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
local count = redis.call('HLEN', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {added, count}
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
