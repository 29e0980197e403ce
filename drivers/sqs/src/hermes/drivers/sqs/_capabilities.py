"""What :class:`AmazonSqsDriver` promises, importable without boto3.

The plugin module reads it for ``available_drivers()``, which every
``connect()`` triggers; it must not pay for importing the client library.
"""

from __future__ import annotations

from hermes.core.driver import Capabilities, Delay, Delivery

#: Largest body (and largest SendMessageBatch request) every SQS queue accepts.
MAX_MESSAGE_BYTES = 256 * 1024

#: Deleted after the handler, ``execute_at`` ignored unless the URL says
#: ``delay=true``, one queue per priority, any number of workers on one queue.
#: A driver object reports its own ``delay`` and its visibility timeout as
#: ``redelivery_timeout_s``; this is the default of 30 s.
CAPABILITIES = Capabilities(
    delivery=Delivery.AT_LEAST_ONCE,
    delay=Delay.IGNORED,
    priorities=True,
    competing_consumers=True,
    max_message_bytes=MAX_MESSAGE_BYTES,
    redelivery_timeout_s=30.0,
    # ApproximateReceiveCount: it also counts receipts no handler saw (a
    # prefetched message given back, a delayed one hidden again).
    counts_deliveries=True,
    # An idle worker long-polls: SQS answers as soon as a message arrives.
    wake_up_s=0.0,
)
