"""The no-op job as a Celery task; broker from ``HERMES_BENCH_BROKER``."""

from __future__ import annotations

import os

from celery import Celery

from bench import jobs

app = Celery("bench", broker=os.environ.get("HERMES_BENCH_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.task_default_queue = os.environ.get("HERMES_BENCH_QUEUE", "bench")
app.conf.worker_hijack_root_logger = False
if os.environ.get("HERMES_BENCH_TUNED"):
    # Celery's optimizing guide: prefetch more per worker, ack early is the default.
    app.conf.worker_prefetch_multiplier = 128


@app.task(name="bench.noop")
def noop() -> None:
    jobs.noop()
