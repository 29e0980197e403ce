"""Which librdkafka settings go to the producer, which to the consumer.

librdkafka warns on stderr when a client is given a setting of the other side
(``CONFWARN ... is a consumer property and will be ignored``), so the one
config a user passes is split here. The scopes are librdkafka's own (the
C/P column of its CONFIGURATION.md); anything not listed is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Settings only a consumer understands.
CONSUMER_ONLY = frozenset(
    {
        "group.id",
        "group.instance.id",
        "partition.assignment.strategy",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "group.protocol.type",
        "group.protocol",
        "group.remote.assignor",
        "coordinator.query.interval.ms",
        "max.poll.interval.ms",
        "enable.auto.commit",
        "auto.commit.enable",
        "auto.commit.interval.ms",
        "enable.auto.offset.store",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "fetch.wait.max.ms",
        "fetch.queue.backoff.ms",
        "fetch.message.max.bytes",
        "max.partition.fetch.bytes",
        "fetch.max.bytes",
        "fetch.min.bytes",
        "fetch.error.backoff.ms",
        "offset.store.method",
        "offset.store.path",
        "offset.store.sync.interval.ms",
        "isolation.level",
        "enable.partition.eof",
        "check.crcs",
        "auto.offset.reset",
        "consume.callback.max.messages",
        "on_commit",
    }
)

#: Settings only a producer understands.
PRODUCER_ONLY = frozenset(
    {
        "transactional.id",
        "transaction.timeout.ms",
        "enable.idempotence",
        "enable.gapless.guarantee",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "queue.buffering.max.ms",
        "linger.ms",
        "message.send.max.retries",
        "retries",
        "queue.buffering.backpressure.threshold",
        "compression.codec",
        "compression.type",
        "compression.level",
        "batch.num.messages",
        "batch.size",
        "delivery.report.only.error",
        "sticky.partitioning.linger.ms",
        "request.required.acks",
        "acks",
        "request.timeout.ms",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "queuing.strategy",
        "partitioner",
        "on_delivery",
    }
)

#: librdkafka settings whose names have no dot, so a URL option of that name is
#: passed to librdkafka rather than read as a Hermes option.
UNDOTTED = frozenset({"acks", "retries", "partitioner", "debug"})

#: Settings Hermes sets itself; a user value would break its guarantees.
RESERVED = {
    "enable.auto.commit": "Hermes commits each offset after the handler returns",
    "auto.commit.enable": "Hermes commits each offset after the handler returns",
    "group.id": "pass the group as group_id (group=NAME in a URL)",
}


def split(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``config`` as (producer settings, consumer settings); shared keys go to both."""
    producer = {k: v for k, v in config.items() if k not in CONSUMER_ONLY}
    consumer = {k: v for k, v in config.items() if k not in PRODUCER_ONLY}
    return producer, consumer


def admin(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings an AdminClient understands: those neither side owns alone."""
    return {k: v for k, v in config.items() if k not in CONSUMER_ONLY and k not in PRODUCER_ONLY}
