"""What :class:`KafkaDriver` promises, importable without confluent-kafka.

The plugin module reads it for ``available_drivers()``, which every
``connect()`` triggers; it must not pay for importing the client library.
"""

from __future__ import annotations

from hermes.core.driver import Capabilities, Delay, Delivery

#: The largest serialized message the driver promises to carry: below both
#: librdkafka's default ``message.max.bytes`` (1,000,000, batch framing included)
#: and Apache Kafka's default broker limit (1,048,588).
MAX_MESSAGE_BYTES = 900 * 1024

#: librdkafka's default ``session.timeout.ms``.
DEFAULT_SESSION_TIMEOUT_MS = 45_000
#: librdkafka's default ``fetch.wait.max.ms``: a broker that answers a fetch only at
#: its timeout (Tansu does) keeps an idle worker that long.
DEFAULT_FETCH_WAIT_MS = 500

#: Commit after the callback (at least once); ``execute_at`` and priorities are
#: opt-in (``delay=true``, ``priority_topics=true``); one partition per worker.
CAPABILITIES = Capabilities(
    delivery=Delivery.AT_LEAST_ONCE,
    delay=Delay.IGNORED,
    priorities=False,
    competing_consumers=True,
    max_message_bytes=MAX_MESSAGE_BYTES,
    # A dead consumer's partitions move after its session times out; measured
    # at about twice the session timeout on a real broker.
    redelivery_timeout_s=2 * DEFAULT_SESSION_TIMEOUT_MS / 1000 + 2,
    wake_up_s=DEFAULT_FETCH_WAIT_MS / 1000,
)
