"""The handlers bench.limits runs: each job pushes when it started and was due to a list."""

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
