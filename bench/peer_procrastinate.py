"""The benchmark job as a procrastinate task; database from ``HERMES_BENCH_BROKER``.

Concurrency, LISTEN/NOTIFY and whether finished jobs are deleted come from
``procrastinate worker``'s own options.
"""

from __future__ import annotations

import os

import procrastinate

from bench import jobs

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("HERMES_BENCH_BROKER", "postgresql://postgres@127.0.0.1/test")
    )
)


@app.task(queue=os.environ.get("HERMES_BENCH_QUEUE", "bench"))
def job() -> None:
    jobs.job()
