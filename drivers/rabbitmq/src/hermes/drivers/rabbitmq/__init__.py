"""Hermes driver for RabbitMQ: ``connect("amqp://guest:guest@localhost:5672/?queue=jobs")``.

Messages are acknowledged after the handler returns (at-least-once), queues
are durable and messages persistent by default, publishes are confirmed, and
a worker reconnects after a broker restart. ``delay=true`` makes
``execute_at`` hold a message back through TTL queues (no plugin needed).
"""

from hermes.drivers.rabbitmq._driver import LazyRabbitMqDriver

__all__ = ["LazyRabbitMqDriver"]
