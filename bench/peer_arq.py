"""The async I/O job as an arq function: ``arq bench.peer_arq.WorkerSettings``.

``HERMES_BENCH_BROKER`` is the Redis URL, ``HERMES_BENCH_QUEUE`` the queue,
``HERMES_BENCH_MAX_JOBS`` arq's ``max_jobs`` (its coroutines in flight).
"""

from __future__ import annotations

import os
from typing import Any

from arq.connections import RedisSettings

from bench import async_jobs


async def bench_job(ctx: dict[str, Any]) -> None:
    await async_jobs.job()


class WorkerSettings:
    functions = (bench_job,)
    redis_settings = RedisSettings.from_dsn(
        os.environ.get("HERMES_BENCH_BROKER", "redis://127.0.0.1:6379/0")
    )
    queue_name = os.environ.get("HERMES_BENCH_QUEUE", "arq:queue")
    max_jobs = int(os.environ.get("HERMES_BENCH_MAX_JOBS", "10"))
    # Nothing kept after a job: the run measures jobs, not result storage.
    keep_result = 0
    handle_signals = True
