"""Tallies on Redis: a hash per tally that Redis expires, each member added once.

``<key>_tally:<tally key>`` maps each member to the value it was first added
with, beside the driver's queue and under its prefix. An add is one script
call (:data:`~hermes.drivers.redis._scripts.TALLY_ADD`): ``HSETNX`` the
member, ``HLEN`` the hash, ``PEXPIRE`` it, atomically among any number of
clients, so of adds at once exactly one adds a member and the one that
brings the hash to its last member sees the whole count. Every add keeps the
hash ``ttl`` longer; the server decides when it is gone.
"""

from __future__ import annotations

import math
from typing import Any

import redis

from hermes.drivers.redis import _scripts


def tally_prefix(queue_key: str) -> str:
    """What every tally's key starts with."""
    return f"{queue_key}_tally:"


def tally_key(queue_key: str, key: str) -> str:
    """Where the tally ``key`` is kept: beside the driver's queue, under its prefix."""
    return tally_prefix(queue_key) + key


def add(
    execute: _scripts.Execute, queue_key: str, key: str, member: str, value: bytes, ttl_s: float
) -> tuple[bool, int]:
    """Add ``member`` unless there: (added by this call, members now)."""
    if not ttl_s > 0:
        raise ValueError(f"a tally's ttl_s must be > 0, got {ttl_s!r}")
    # Whole milliseconds, rounded up: a tally is never kept shorter than asked.
    ttl_ms = max(1, math.ceil(ttl_s * 1000))
    added, count = _scripts.TALLY_ADD(
        execute, (tally_key(queue_key, key),), (member, bytes(value), ttl_ms), raw=True
    )
    return bool(int(added)), int(count)


def read(execute: _scripts.Execute, queue_key: str, key: str) -> dict[str, bytes]:
    """Every member and its value; empty when the tally does not exist (or expired)."""
    reply = execute(("HGETALL", tally_key(queue_key, key)), True)
    if isinstance(reply, dict):  # a RESP3 client answers with a map
        return {bytes(member).decode(): bytes(value) for member, value in reply.items()}
    return {bytes(reply[at]).decode(): bytes(reply[at + 1]) for at in range(0, len(reply), 2)}


def keys(client: redis.Redis[Any], queue_key: str) -> list[str]:
    """Every tally's key (``SCAN``: tallies are not indexed)."""
    prefix = tally_prefix(queue_key)
    pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + "*"
    return [
        raw.decode() if isinstance(raw, bytes) else str(raw)
        for raw in client.scan_iter(match=pattern, count=1000)
    ]
