"""The handlers bench.limits runs; each pushes what the bench reads to a Redis list."""

from __future__ import annotations

import os
import time

import redis

from hermes.core import HandlerRegistry, Message

handlers = HandlerRegistry()
_client = redis.Redis.from_url(os.environ.get("BENCH_LIMITS_REDIS", "redis://127.0.0.1:6379/0"))
_lists = os.environ.get("BENCH_LIMITS_LISTS", "bench-limits")


@handlers.handler("a")
@handlers.handler("b")
@handlers.handler("warm-up")
def started(message: Message) -> None:
    _client.rpush(f"{_lists}:{message.type}", f"{time.time()!r},{message.execute_at or 0.0!r}")


@handlers.handler("c")
def held(message: Message) -> None:
    """Counts itself running while it runs, and pushes how many were running as it started."""
    running = _client.incr(f"{_lists}:running")
    try:
        _client.rpush(f"{_lists}:c", running)
        time.sleep(0.05)
    finally:
        _client.decr(f"{_lists}:running")


@handlers.handler("t")
def tenant(message: Message) -> None:
    _client.rpush(f"{_lists}:t:{message.payload['tenant']}", repr(time.time()))
