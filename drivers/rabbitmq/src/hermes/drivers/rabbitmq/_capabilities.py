"""What :class:`LazyRabbitMqDriver` promises, importable without pika.

The plugin module reads it for ``available_drivers()``, which every
``connect()`` triggers; it must not pay for importing the client library.
"""

from __future__ import annotations

from hermes.core.driver import Capabilities, Delay, Delivery

#: Acknowledged after the handler, ``execute_at`` ignored unless the URL says
#: ``delay=true`` (the driver then reports :attr:`Delay.NATIVE`), one queue
#: per priority, any number of consumers on one queue. Deliveries are not
#: counted: a driver on quorum queues (``x-queue-type=quorum``) reports
#: ``counts_deliveries=True``, classic queues keep no count.
CAPABILITIES = Capabilities(
    delivery=Delivery.AT_LEAST_ONCE,
    delay=Delay.IGNORED,
    priorities=True,
    competing_consumers=True,
    max_message_bytes=16 * 1024 * 1024,
    # The broker requeues a dead consumer's unacknowledged messages as
    # soon as its connection closes.
    redelivery_timeout_s=0.0,
    # The broker pushes messages to the consumer.
    wake_up_s=0.0,
)
