"""Hermes driver for Amazon SQS: ``connect("sqs://jobs?region=eu-west-1")``.

At-least-once: a message is deleted after its handler returns; a heartbeat
keeps it hidden while the handler runs; an optional dead-letter queue takes
what keeps failing. See :class:`AmazonSqsDriver`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes.drivers.sqs._driver import AmazonSqsDriver, SqsDelivery, current_delivery

__all__ = ["AmazonSqsDriver", "SqsDelivery", "current_delivery"]

# Loading the plugin imports this package; boto3 is imported on first use of a
# name instead (PEP 562), so a process that never uses SQS skips it.
# Hidden from type checkers, which see the import above and still flag typos.
if not TYPE_CHECKING:
    _HOMES = dict.fromkeys(__all__, "hermes.drivers.sqs._driver")

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
