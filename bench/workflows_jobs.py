"""The handlers bench.workflows runs; each pushes when it started to a Redis list of its type."""

from __future__ import annotations

import os
import time

import redis

from hermes.core import HandlerRegistry, Message

handlers = HandlerRegistry()
_client = redis.Redis.from_url(os.environ.get("BENCH_WF_REDIS", "redis://127.0.0.1:6379/0"))
_lists = os.environ.get("BENCH_WF_LISTS", "bench-wf")


@handlers.handler("plain")
@handlers.handler("member")
@handlers.handler("done")
def started(message: Message) -> None:
    _client.rpush(f"{_lists}:{message.type}", repr(time.time()))


@handlers.handler("step")
def step(message: Message) -> None:
    _client.rpush(f"{_lists}:step", f"{message.payload['i']},{time.time()!r}")
