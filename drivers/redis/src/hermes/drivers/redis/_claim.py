"""Claims on Redis: ``SET key 1 NX PX ttl``, one atomic command, expired by the server."""

from __future__ import annotations

import math
from typing import Any

import redis


def claim_key(queue_key: str, key: str) -> str:
    """Where the claim ``key`` is kept: beside the driver's queue, under its prefix."""
    return f"{queue_key}_claim:{key}"


def claim(client: redis.Redis[Any], name: str, ttl_s: float) -> bool:
    """Set ``name`` unless it exists; True when this call set it. Redis expires it after ``ttl_s``.

    Whole milliseconds, rounded up: a claim is never shorter than asked.
    """
    if not ttl_s > 0:
        raise ValueError(f"a claim's ttl_s must be > 0, got {ttl_s!r}")
    return bool(client.set(name, b"1", nx=True, px=max(1, math.ceil(ttl_s * 1000))))
