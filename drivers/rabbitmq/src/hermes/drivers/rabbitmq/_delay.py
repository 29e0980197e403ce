"""Delay without a plugin: per-delay TTL queues that dead-letter back to the work queue.

A message due in *d* milliseconds is published to ``<work queue>.delay.<b>``,
a queue whose ``x-message-ttl`` is *b* and whose dead-letter target is the
work queue. *b* is *d* rounded **down** to two significant digits, so the
number of delay queues stays small (at most 90 per power of ten) and a
message never comes back early; the worker that receives it before its
``execute_at`` (by at most 10 % of the delay) sends it through a shorter
delay queue for the rest. Delay queues expire on their own once unused.
"""

from __future__ import annotations

from typing import Any

#: The longest single stay in a delay queue (about 23 days); longer delays
#: go round again. Keeps ``x-message-ttl`` and ``x-expires`` within 32 bits.
MAX_BUCKET_MS = 2_000_000_000

#: How long a delay queue outlives its TTL once nobody declares it again.
#: RabbitMQ counts only declarations, consumers and gets as use, not
#: publishes, so a publisher re-declares a delay queue it has not declared
#: for half this long before it publishes to it.
EXPIRY_MARGIN_MS = 60_000

#: A message due sooner than this is handled, not delayed again.
DUE_TOLERANCE_S = 0.001


def bucket_ms(delay_s: float) -> int:
    """The TTL of the delay queue for a message due in ``delay_s`` seconds (0: due now)."""
    ms = int(delay_s * 1000)
    if ms <= 0:
        return 0
    if ms >= MAX_BUCKET_MS:
        return MAX_BUCKET_MS
    step: int = 10 ** max(0, len(str(ms)) - 2)
    return ms // step * step


def _every_bucket_ms() -> tuple[int, ...]:
    buckets: list[int] = []
    ms = 1
    while ms < MAX_BUCKET_MS:
        buckets.append(ms)
        ms += 10 ** max(0, len(str(ms)) - 2)
    return (*buckets, MAX_BUCKET_MS)


#: Every TTL :func:`bucket_ms` can return, shortest first (740): the names of
#: a work queue's delay queues, which AMQP cannot list, derive from these.
EVERY_BUCKET_MS = _every_bucket_ms()


def delay_queue_name(work_queue: str, ttl_ms: int) -> str:
    return f"{work_queue}.delay.{ttl_ms}"


#: The longest suffix :func:`delay_queue_name` adds to a work queue's name.
DELAY_SUFFIX_LEN = len(delay_queue_name("", MAX_BUCKET_MS))


def delay_queue_arguments(work_queue: str, ttl_ms: int) -> dict[str, Any]:
    return {
        "x-message-ttl": ttl_ms,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": work_queue,
        "x-expires": ttl_ms + EXPIRY_MARGIN_MS,
    }
