"""Hermes driver for Amazon SQS: ``connect("sqs://jobs?region=eu-west-1")``.

At-least-once: a message is deleted after its handler returns; a heartbeat
keeps it hidden while the handler runs; an optional dead-letter queue takes
what keeps failing. See :class:`AmazonSqsDriver`.
"""

from hermes.drivers.sqs._driver import AmazonSqsDriver, SqsDelivery, current_delivery

__all__ = ["AmazonSqsDriver", "SqsDelivery", "current_delivery"]
