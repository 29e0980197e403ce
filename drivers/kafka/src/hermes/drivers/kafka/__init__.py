"""Hermes on Apache Kafka: records of a topic, shared by a consumer group.

``connect("kafka://localhost:9092/jobs?group=workers")`` builds a
:class:`KafkaDriver`; the offset of a record is committed after its handler
returns (at-least-once).
"""

from hermes.drivers.kafka._driver import MAX_MESSAGE_BYTES, KafkaDriver

__all__ = ["MAX_MESSAGE_BYTES", "KafkaDriver"]
