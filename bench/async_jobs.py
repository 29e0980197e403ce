"""The async I/O job of bench.async_io, the same for Hermes and arq.

``await asyncio.sleep(HERMES_BENCH_SLEEP_S)`` (0.5 s by default), then one
``INCR`` of ``HERMES_BENCH_INCR_KEY`` with ``redis.asyncio`` on a client of the
worker's own to ``HERMES_BENCH_REDIS``: a job that waits on the network, as an
HTTP, webhook or LLM call does. Each worker process counts the jobs it ran;
at ``HERMES_BENCH_N`` it writes the time of the first and the last as JSON to
``HERMES_BENCH_OUT`` (as bench.jobs does for the sync jobs).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

SLEEP_S = float(os.environ.get("HERMES_BENCH_SLEEP_S", "0.5"))
_N = int(os.environ.get("HERMES_BENCH_N", "0"))
_OUT = os.environ.get("HERMES_BENCH_OUT", "")
_count = 0
_first = 0.0
_clients: dict[int, Any] = {}


def _client() -> Any:
    """One ``redis.asyncio`` client per event loop (a worker has one)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None:
        import redis.asyncio

        pool = redis.asyncio.BlockingConnectionPool.from_url(
            os.environ["HERMES_BENCH_REDIS"], max_connections=64, timeout=None
        )
        client = _clients[id(loop)] = redis.asyncio.Redis(connection_pool=pool)
    return client


async def job() -> None:
    """The job, counted; runs on the worker's event loop (one thread: no lock)."""
    global _count, _first
    started = time.time()
    await asyncio.sleep(SLEEP_S)
    await _client().incr(os.environ["HERMES_BENCH_INCR_KEY"])
    _count += 1
    if _count == 1:
        _first = started
    if _count == _N and _OUT:
        tmp = _OUT + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"first": _first, "last": time.time(), "count": _count}, fh)
        os.replace(tmp, _OUT)


class AsyncBenchHandler:
    """The Hermes handler: an ``async def handle``."""

    async def handle(self, message: Any) -> bool:
        await job()
        return True


def register(dispatcher: Any) -> None:
    """``hermes worker --handlers bench.async_jobs:register``."""
    dispatcher.register_handler("bench-async", AsyncBenchHandler())
