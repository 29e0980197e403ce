"""Hermes driver for RabbitMQ: ``connect("amqp://guest:guest@localhost:5672/?queue=jobs")``.

Messages are acknowledged after the handler returns (at-least-once), queues
are durable and messages persistent by default, publishes are confirmed, and
a worker reconnects after a broker restart. ``delay=true`` makes
``execute_at`` hold a message back through TTL queues (no plugin needed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes.core.drivertools import lazy_exports

if TYPE_CHECKING:
    from hermes.drivers.rabbitmq._driver import LazyRabbitMqDriver

__all__ = ["LazyRabbitMqDriver"]

# Loading the plugin imports this package; pika is imported on first use of a
# name instead, so a process that never uses this broker does not pay for it.
if not TYPE_CHECKING:  # type checkers read the imports above, and still flag typos
    __getattr__, __dir__ = lazy_exports(__name__, {"LazyRabbitMqDriver": "._driver"})
