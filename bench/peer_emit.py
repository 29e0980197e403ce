"""Enqueue ``HERMES_BENCH_N`` benchmark jobs with a peer's own client; print jobs/s.

python -m bench.peer_emit celery|dramatiq|rq|procrastinate
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    system, n = sys.argv[1], int(os.environ["HERMES_BENCH_N"])
    started = time.perf_counter()
    if system == "celery":
        from bench.peer_celery import job as task

        for _ in range(n):
            task.delay()
    elif system == "dramatiq":
        from bench.peer_dramatiq import job as actor

        for _ in range(n):
            actor.send()
    elif system == "rq":
        from redis import Redis
        from rq import Queue

        from bench.jobs import job

        connection = Redis.from_url(os.environ["HERMES_BENCH_BROKER"])
        queue = Queue(os.environ["HERMES_BENCH_QUEUE"], connection=connection)
        for _ in range(n):
            queue.enqueue(job)
    elif system == "procrastinate":
        from bench.peer_procrastinate import app
        from bench.peer_procrastinate import job as task

        with app.open():
            for _ in range(n):
                task.defer()
    else:
        raise SystemExit(f"unknown system {system!r}")
    print(n / (time.perf_counter() - started))


if __name__ == "__main__":
    main()
