"""Heartbeats on Redis: a string key per worker that Redis expires, and a sorted set to list them.

``<key>_worker:<id>`` holds the record as JSON with ``PX ttl``, so the
server decides when a record is gone, whatever the clocks of the hosts say.
``<key>_workers`` (a sorted set, scored by the publisher's idea of the
expiry) only finds the keys without a ``SCAN`` of the whole database; an
id whose key has expired is dropped from it by the next listing, and one
that lingers (its publisher's clock was far off) by :data:`INDEX_SLACK_S`.
Both live beside the driver's queue, under its prefix.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any

import redis

#: An index entry this far past its expiry is removed even if its key still exists.
INDEX_SLACK_S = 3600.0


def index_key(queue_key: str) -> str:
    return f"{queue_key}_workers"


def record_key(queue_key: str, worker_id: str) -> str:
    return f"{queue_key}_worker:{worker_id}"


def beat(client: redis.Redis[Any], queue_key: str, record: Mapping[str, Any], ttl_s: float) -> None:
    if not ttl_s > 0:
        raise ValueError(f"a heartbeat's ttl_s must be > 0, got {ttl_s!r}")
    worker_id = str(record["id"])
    now = time.time()
    pipe = client.pipeline(transaction=True)
    pipe.set(record_key(queue_key, worker_id), json.dumps(record), px=math.ceil(ttl_s * 1000))
    pipe.zadd(index_key(queue_key), {worker_id: now + ttl_s})
    pipe.zremrangebyscore(index_key(queue_key), "-inf", now - INDEX_SLACK_S)
    pipe.execute()


def forget(client: redis.Redis[Any], queue_key: str, worker_id: str) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.delete(record_key(queue_key, worker_id))
    pipe.zrem(index_key(queue_key), worker_id)
    pipe.execute()


def heartbeats(client: redis.Redis[Any], queue_key: str) -> list[dict[str, Any]]:
    ids = [
        i.decode() if isinstance(i, bytes) else str(i)
        for i in client.zrange(index_key(queue_key), 0, -1)
    ]
    if not ids:
        return []
    texts = client.mget([record_key(queue_key, worker_id) for worker_id in ids])
    gone = [worker_id for worker_id, text in zip(ids, texts, strict=True) if text is None]
    if gone:
        client.zrem(index_key(queue_key), *gone)
    return [json.loads(text) for text in texts if text is not None]
