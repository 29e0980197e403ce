"""An RQ ``SimpleWorker`` (no fork per job) draining the benchmark queue once."""

from __future__ import annotations

import os

from redis import Redis
from rq import Queue, SimpleWorker


def main() -> None:
    connection = Redis.from_url(os.environ.get("HERMES_BENCH_BROKER", "redis://127.0.0.1:6379/0"))
    queue = Queue(os.environ.get("HERMES_BENCH_QUEUE", "bench"), connection=connection)
    SimpleWorker([queue], connection=connection).work(burst=True, logging_level="WARNING")


if __name__ == "__main__":
    main()
