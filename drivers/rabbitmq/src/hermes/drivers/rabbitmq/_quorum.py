"""Quorum queues (``x-queue-type=quorum``): the RabbitMQ queue type that counts deliveries.

A quorum queue adds the header ``x-delivery-count`` to a message it hands out
again after it came back unacknowledged: requeued with a nack or a reject, or
held by a consumer whose channel or connection closed (a worker killed
mid-handler). The header is absent on a pushed first delivery; RabbitMQ 3.10
sets it to 0 on a first ``basic_get``. A classic queue keeps no count (its
``redelivered`` flag only says "maybe seen before"), so the driver reports
``Received.delivery_count`` and ``counts_deliveries`` for quorum queues only.

A quorum queue is always durable and takes fewer arguments than a classic
one; :func:`check_quorum` refuses what RabbitMQ would refuse at the first
declaration, before any connection, saying what to use instead. The
driver's priorities are a queue per priority (never ``x-max-priority``) and
its delay queues are classic queues of their own that dead-letter into the
work queue, so both work with quorum work queues.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hermes.core import ConfigurationError

#: The queue argument that picks a queue's type, and the type that counts.
QUEUE_TYPE = "x-queue-type"
QUORUM = "quorum"

#: The header a quorum queue puts on a message it delivers again: earlier deliveries.
DELIVERY_COUNT_HEADER = "x-delivery-count"

#: How long after this connection declared a quorum queue a publish RabbitMQ
#: nacks is sent again. When two connections declare the same new quorum
#: queue at once (a worker and a sender starting together), RabbitMQ 3.10
#: nacks publishes on one of them until the queue's Raft member runs: up to
#: 50 ms on a loaded 2-core machine, each nacked publish left unstored. A
#: nack later than this (``x-overflow=reject-publish``, a failing queue)
#: raises at once.
STARTING_S = 2.0
#: The pause between two publishes of a message a starting quorum queue nacked.
STARTING_RETRY_S = 0.01

#: Queue arguments RabbitMQ refuses on a quorum queue (406 PRECONDITION_FAILED,
#: "invalid arg ... of queue type rabbit_quorum_queue"), and what to do instead.
NOT_FOR_QUORUM = {
    "x-max-priority": (
        "quorum queues have no priority levels; Hermes priorities are a queue each "
        "(setup_priority_queue, priority_queues in the URL), which may be quorum queues"
    ),
    "x-queue-mode": (
        "it sets how a classic queue stores messages; a quorum queue keeps them on disk anyway"
    ),
    "x-queue-master-locator": (
        "it places a classic mirrored queue; a quorum queue takes x-queue-leader-locator"
    ),
    "x-max-age": "it is a stream's retention; bound a quorum queue with x-max-length",
}


def is_quorum(arguments: Mapping[str, Any]) -> bool:
    """Whether work queues declared with ``arguments`` are quorum queues."""
    return arguments.get(QUEUE_TYPE) == QUORUM


def check_quorum(arguments: Mapping[str, Any], durable: bool) -> None:
    """Raise :class:`ConfigurationError` for a setting quorum work queues cannot have."""
    if not durable:
        raise ConfigurationError(
            f"{QUEUE_TYPE}={QUORUM} cannot be combined with durable=false: RabbitMQ keeps "
            "every quorum queue on disk and refuses a non-durable one; drop durable=false, "
            f"or drop {QUEUE_TYPE}={QUORUM} to keep transient classic queues"
        )
    for name in sorted(NOT_FOR_QUORUM.keys() & arguments.keys()):
        raise ConfigurationError(
            f"{QUEUE_TYPE}={QUORUM} cannot be combined with {name}: RabbitMQ refuses it on "
            f"a quorum queue ({NOT_FOR_QUORUM[name]})"
        )


def delivery_count(headers: Mapping[str, Any] | None) -> int:
    """This delivery's number, 1 for the first: one more than the broker's count of earlier ones."""
    earlier = (headers or {}).get(DELIVERY_COUNT_HEADER)
    # pika gives AMQP integers as ints; anything else is no count the broker made.
    if isinstance(earlier, int) and not isinstance(earlier, bool) and earlier >= 0:
        return int(earlier) + 1
    return 1
