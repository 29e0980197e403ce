"""Hermes driver for Amazon SQS: ``connect("sqs://jobs?region=eu-west-1")``.

At-least-once: a message is deleted after its handler returns; a heartbeat
keeps it hidden while the handler runs; an optional dead-letter queue takes
what keeps failing. See :class:`AmazonSqsDriver`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes.core.drivertools import lazy_exports

if TYPE_CHECKING:
    from hermes.drivers.sqs._driver import AmazonSqsDriver, current_delivery
    from hermes.drivers.sqs._heartbeat import SqsDelivery

__all__ = ["AmazonSqsDriver", "SqsDelivery", "current_delivery"]

# Loading the plugin imports this package; boto3 is imported on first use of a
# name instead, so a process that never uses this broker does not pay for it.
if not TYPE_CHECKING:  # type checkers read the imports above, and still flag typos
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "AmazonSqsDriver": "._driver",
            "SqsDelivery": "._heartbeat",
            "current_delivery": "._driver",
        },
    )
