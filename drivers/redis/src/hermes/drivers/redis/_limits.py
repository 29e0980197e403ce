"""Fleet-wide limits on Redis: one JSON state per limit key, changed by one script call.

``<key>_limit:<limit key>`` holds the key's state as
:func:`hermes.core.drivertools.limit_state.encode` writes it. Taking a slot,
releasing it and renewing it are each one script call that reads the state,
reads the server's clock (``TIME``: one clock for every worker of the fleet),
runs the same steps as :func:`~hermes.core.drivertools.limit_state.take`,
:func:`~hermes.core.drivertools.limit_state.release` or
:func:`~hermes.core.drivertools.limit_state.renew`, and writes the state back,
atomically among any number of clients.

A state is kept :func:`~hermes.core.drivertools.limit_state.keep_for` seconds
(until no slot is held and no turn is promised) plus :data:`GRACE_S`, so a
key used again soon still knows how long its slots were held. The sorted set
``<key>_limits`` lists the limit keys, each scored by the server time until
which its state says something; a scan lists only those whose time has not
run out, and every write drops a few members whose time has.

Numbers cross the script boundary as text, and the script writes the JSON
itself with the shortest text that reads back as the same double (Redis's
``cjson`` keeps 14 digits, less than a UNIX time in microseconds needs), so
the state is the one the Python steps compute, to the last bit.
"""

from __future__ import annotations

import math
from typing import Any

import redis

from hermes.core.driver import LimitRule, Take
from hermes.core.drivertools import limit_state
from hermes.drivers.redis import _scripts

#: Seconds a state is kept after it stops saying anything.
GRACE_S = 60
#: Index members whose time ran out that one write drops at most.
TRIM_PER_WRITE = 100

#: What the three writing scripts share: the server's clock as ``now`` (UNIX
#: seconds, microsecond precision); ``number(x)``, the shortest text of ``x``
#: that reads back as ``x``; ``encode(value)``, JSON with every number so
#: written, where a table without ``[1]`` (an empty slot map too) is an
#: object; ``store(state, grace, member, trim)``, which writes the state to
#: KEYS[1] for as long as it says something plus ``grace`` seconds, scores
#: ``member`` in the index KEYS[2] by when that is (or drops it when that has
#: passed), and drops up to ``trim`` index members whose time ran out.
_COMMON = """
if redis.replicate_commands then redis.replicate_commands() end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local function number(x)
    for digits = 15, 16 do
        local text = string.format('%.' .. digits .. 'g', x)
        if tonumber(text) == x then return text end
    end
    return string.format('%.17g', x)
end
local function encode(value)
    if type(value) == 'number' then return number(value) end
    if type(value) ~= 'table' then return cjson.encode(value) end
    local parts = {}
    if value[1] == nil then
        for name, item in pairs(value) do
            parts[#parts + 1] = cjson.encode(tostring(name)) .. ':' .. encode(item)
        end
        return '{' .. table.concat(parts, ',') .. '}'
    end
    for i = 1, #value do parts[i] = encode(value[i]) end
    return '[' .. table.concat(parts, ',') .. ']'
end
local function store(state, grace, member, trim)
    local last = math.max(state.tat, state.ctat)
    for _, held in pairs(state.slots) do
        if held[1] > last then last = held[1] end
    end
    local keep = math.max(math.ceil(last - now), 0) + grace
    redis.call('SET', KEYS[1], encode(state), 'EX', string.format('%d', keep))
    if last > now then
        redis.call('ZADD', KEYS[2], number(last), member)
    else
        redis.call('ZREM', KEYS[2], member)
    end
    local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', number(now), 'LIMIT', 0, trim)
    if #gone > 0 then redis.call('ZREM', KEYS[2], unpack(gone)) end
end
"""

#: Decide one start (the steps of ``limit_state.take``).
#:
#: KEYS: the state, the index. ARGV: slot, '1' if charged already, lease
#: seconds, interval seconds ('' for no rate), burst, concurrency ('' for no
#: slots), the shortest wait, a fresh state (JSON), grace seconds, the
#: index member, index members to trim, turns to reserve when refused for the rate.
#: Returns ``{wait seconds, 1 if charged, now, further turns' waits...}`` (the
#: numbers as text).
TAKE = _scripts.LuaScript(
    _COMMON
    + """
local slot, charged, lease = ARGV[1], ARGV[2] == '1', tonumber(ARGV[3])
local interval, burst, concurrency = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local min_wait = tonumber(ARGV[7])
local reserve = tonumber(ARGV[12])
local more = {}
local raw = redis.call('GET', KEYS[1])
local state
if raw then
    state = cjson.decode(raw)
else
    state = cjson.decode(ARGV[8])
end
local slots, held = {}, 0
for name, lease_of in pairs(state.slots) do
    if lease_of[1] > now then
        slots[name] = lease_of
        held = held + 1
    end
end
state.slots = slots
state.rule = {interval or 0, burst, concurrency or 0}
local function decide()
    if concurrency and held >= concurrency then
        local step = state.avg / concurrency
        local due = math.max(state.ctat, now) + step
        state.ctat = due
        state.cstep = step
        return math.max(due - now, min_wait)
    end
    if interval and not charged then
        local tat = math.max(state.tat, now) + interval
        local turn = tat - burst * interval
        state.tat = tat
        charged = true
        if turn > now then
            for _ = 2, reserve do
                tat = tat + interval
                more[#more + 1] = number(tat - burst * interval - now)
            end
            state.tat = tat
            return math.max(turn - now, min_wait)
        end
    end
    if concurrency then slots[slot] = {now + lease, now} end
    return 0
end
local wait = decide()
store(state, tonumber(ARGV[9]), ARGV[10], tonumber(ARGV[11]))
local answer = {number(wait), charged and 1 or 0, number(now)}
for i = 1, #more do answer[#answer + 1] = more[i] end
return answer
"""
)

#: Free a slot and fold how long it was held into the mean (``limit_state.release``):
#: the plain mean of the hold times seen while fewer than ``1 / weight`` were,
#: then a moving mean giving the newest ``weight``.
#:
#: KEYS: the state, the index. ARGV: slot, the newest hold time's weight, the
#: count of hold times after which it applies, grace seconds, the index
#: member, index members to trim.
#: Returns ``{1 if the slot was held, now}``; nothing is written when it was not.
RELEASE = _scripts.LuaScript(
    _COMMON
    + """
local raw = redis.call('GET', KEYS[1])
if not raw then return {0, number(now)} end
local state = cjson.decode(raw)
local held = state.slots[ARGV[1]]
if not held then return {0, number(now)} end
state.slots[ARGV[1]] = nil
local last_weight, full = tonumber(ARGV[2]), tonumber(ARGV[3])
local seen = math.min((state.n or 0) + 1, full)
local weight = last_weight
if seen < 1 / last_weight then weight = 1 / seen end
state.avg = (1 - weight) * state.avg + weight * math.max(now - held[2], 0)
state.n = seen
store(state, tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]))
return {1, number(now)}
"""
)

#: Extend a slot's lease to now + lease seconds (``limit_state.renew``).
#:
#: KEYS: the state, the index. ARGV: slot, lease seconds, grace seconds, the
#: index member, index members to trim.
#: Returns ``{1 if the slot was held and its lease had not run out, now}``;
#: nothing is written otherwise.
RENEW = _scripts.LuaScript(
    _COMMON
    + """
local raw = redis.call('GET', KEYS[1])
if not raw then return {0, number(now)} end
local state = cjson.decode(raw)
local held = state.slots[ARGV[1]]
if not held or held[1] <= now then return {0, number(now)} end
held[1] = now + tonumber(ARGV[2])
store(state, tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]))
return {1, number(now)}
"""
)

#: Up to ARGV[2] limit keys whose state still says something, with their states.
#:
#: KEYS: the index. ARGV: what precedes a limit key in its state's key, how many.
#: Returns ``{key, state, key, state, ...}``.
SCAN = _scripts.LuaScript(
    """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local members = redis.call(
    'ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%.17g', now), '+inf',
    'LIMIT', 0, tonumber(ARGV[2])
)
local reply = {}
for _, member in ipairs(members) do
    local raw = redis.call('GET', ARGV[1] .. member)
    if raw then
        reply[#reply + 1] = member
        reply[#reply + 1] = raw
    end
end
return reply
"""
)


def state_prefix(queue_key: str) -> str:
    """What precedes a limit key in the Redis key of its state."""
    return f"{queue_key}_limit:"


def state_key(queue_key: str, key: str) -> str:
    """Where the state of the limit ``key`` is kept: beside the driver's queue, under its prefix."""
    return state_prefix(queue_key) + key


def index_key(queue_key: str) -> str:
    """The sorted set of limit keys, scored by the server time until which their state matters."""
    return f"{queue_key}_limits"


def _seconds(value: float | None, what: str, *, none: bool = False) -> str:
    """``value`` as text that reads back as the same double; '' for None where allowed."""
    if value is None and none:
        return ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"a limit's {what} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"a limit's {what} must be a finite number > 0, got {value!r}")
    return repr(number)


def _count(value: int | None, what: str, *, none: bool = False) -> str:
    """``value`` as text; '' for None where allowed."""
    if value is None and none:
        return ""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"a limit's {what} must be an int >= 1, got {value!r}")
    return str(value)


def _keys(queue_key: str, key: str) -> tuple[str, str]:
    return state_key(queue_key, key), index_key(queue_key)


def take(
    execute: _scripts.Execute,
    queue_key: str,
    key: str,
    rule: LimitRule,
    slot: str,
    charged: bool,
    lease_s: float,
) -> tuple[Take, float]:
    """One decision by :data:`TAKE`, and the server time it was made at."""
    args = (
        slot,
        "1" if charged else "0",
        _seconds(lease_s, "lease_s"),
        _seconds(rule.interval_s, "interval_s", none=True),
        _count(rule.burst, "burst"),
        _count(rule.concurrency, "concurrency", none=True),
        repr(limit_state.MIN_WAIT_S),
        limit_state.encode(limit_state.fresh()),
        GRACE_S,
        key,
        TRIM_PER_WRITE,
        _count(rule.reserve, "reserve"),
    )
    wait, took_charge, now, *more = TAKE(execute, _keys(queue_key, key), args, raw=True)
    turns = tuple(float(w) for w in more)
    return Take(float(wait), bool(int(took_charge)), turns), float(now)


def release(execute: _scripts.Execute, queue_key: str, key: str, slot: str) -> float:
    """Free ``slot`` by :data:`RELEASE`; the server time it was done at."""
    weight = limit_state.AVG_WEIGHT
    args = (slot, repr(weight), round(1 / weight), GRACE_S, key, TRIM_PER_WRITE)
    _, now = RELEASE(execute, _keys(queue_key, key), args, raw=True)
    return float(now)


def renew(
    execute: _scripts.Execute, queue_key: str, key: str, slot: str, lease_s: float
) -> tuple[bool, float]:
    """Extend ``slot``'s lease by :data:`RENEW`: whether it was held, and the server time."""
    args = (slot, _seconds(lease_s, "lease_s"), GRACE_S, key, TRIM_PER_WRITE)
    held, now = RENEW(execute, _keys(queue_key, key), args, raw=True)
    return bool(int(held)), float(now)


def scan(execute: _scripts.Execute, queue_key: str, limit: int) -> list[tuple[str, bytes]]:
    """Up to ``limit`` limit keys whose state still says something, with their state bytes."""
    if limit <= 0:
        return []
    reply = SCAN(execute, (index_key(queue_key),), (state_prefix(queue_key), limit), raw=True)
    return [(reply[at].decode(), bytes(reply[at + 1])) for at in range(0, len(reply), 2)]


def keys(client: redis.Redis[Any], queue_key: str) -> list[str]:
    """Every key the limits use: each state (``SCAN``, those no longer indexed too), the index."""
    prefix = state_prefix(queue_key)
    pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + "*"
    found = [
        raw.decode() if isinstance(raw, bytes) else str(raw)
        for raw in client.scan_iter(match=pattern, count=1000)
    ]
    return [*found, index_key(queue_key)]
