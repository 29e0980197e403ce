"""An RQ worker draining the benchmark queue once (burst).

``HERMES_BENCH_RQ_WORKER``: ``fork`` for RQ's default ``Worker`` (a new
process per job), ``simple`` for ``SimpleWorker`` (jobs in the worker process).
"""

from __future__ import annotations

import os

from redis import Redis
from rq import Queue, SimpleWorker, Worker


def main() -> None:
    connection = Redis.from_url(os.environ.get("HERMES_BENCH_BROKER", "redis://127.0.0.1:6379/0"))
    queue = Queue(os.environ.get("HERMES_BENCH_QUEUE", "bench"), connection=connection)
    kind = os.environ.get("HERMES_BENCH_RQ_WORKER", "simple")
    worker_class = {"fork": Worker, "simple": SimpleWorker}[kind]
    worker_class([queue], connection=connection).work(burst=True, logging_level="WARNING")


if __name__ == "__main__":
    main()
