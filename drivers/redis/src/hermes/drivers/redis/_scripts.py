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
