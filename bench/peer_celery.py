"""The benchmark job as a Celery task; broker from ``HERMES_BENCH_BROKER``.

``HERMES_BENCH_CELERY_PREFETCH`` sets ``worker_prefetch_multiplier`` (Celery's
default is 4).
"""

from __future__ import annotations

import os

from celery import Celery

from bench import jobs

app = Celery("bench", broker=os.environ.get("HERMES_BENCH_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.task_default_queue = os.environ.get("HERMES_BENCH_QUEUE", "bench")
app.conf.worker_hijack_root_logger = False
if os.environ.get("HERMES_BENCH_CELERY_PREFETCH"):
    app.conf.worker_prefetch_multiplier = int(os.environ["HERMES_BENCH_CELERY_PREFETCH"])


@app.task(name="bench.job")
def job() -> None:
    jobs.job()
