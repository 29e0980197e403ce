"""Hermes on Apache Kafka: records of a topic, shared by a consumer group.

``connect("kafka://localhost:9092/jobs?group=workers")`` builds a
:class:`KafkaDriver`; the offset of a record is committed after its handler
returns (at-least-once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes.core.drivertools import lazy_exports

if TYPE_CHECKING:
    from hermes.drivers.kafka._driver import KafkaDriver

from hermes.drivers.kafka._capabilities import MAX_MESSAGE_BYTES

__all__ = ["MAX_MESSAGE_BYTES", "KafkaDriver"]

# Loading the plugin imports this package; confluent-kafka is imported on first use of a
# name instead, so a process that never uses this broker does not pay for it.
if not TYPE_CHECKING:  # type checkers read the imports above, and still flag typos
    __getattr__, __dir__ = lazy_exports(__name__, {"KafkaDriver": "._driver"})
