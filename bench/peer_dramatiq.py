"""The benchmark job as a Dramatiq actor; broker from ``HERMES_BENCH_BROKER``.

Threads come from ``dramatiq --threads``; the prefetch from Dramatiq's own
``dramatiq_queue_prefetch`` environment variable (default: 2 per thread).
"""

from __future__ import annotations

import os

import dramatiq

from bench import jobs

_url = os.environ.get("HERMES_BENCH_BROKER", "redis://127.0.0.1:6379/0")
if _url.startswith("amqp"):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    dramatiq.set_broker(RabbitmqBroker(url=_url))
else:
    from dramatiq.brokers.redis import RedisBroker

    dramatiq.set_broker(RedisBroker(url=_url))


@dramatiq.actor(queue_name=os.environ.get("HERMES_BENCH_QUEUE", "bench"), max_retries=0)
def job() -> None:
    jobs.job()
