"""Send/wait round trips: every field of a message survives the real broker.

Generated messages have arbitrary types, payloads (objects and lists holding
unicode, nesting, empty containers, large numbers), ``created``, ``execute_at``
(in the past or None, so every delay capability delivers them at once) and
``retries``. Three limits, all from the wire format: a top-level ``[]``
payload is excluded (it decodes as ``{}`` for PHP compatibility), ids use
``[A-Za-z0-9_.:-]``, and ``created`` is above 0 (PHP Hermes, and so Hermes,
reads a ``created`` of 0 as absent and puts the time it was read).
"""

from __future__ import annotations

import string
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hermes.conformance._harness import DELIVERY_S, QUIET_S, Kit, fields, stays_false, wait_until
from hermes.conformance._worker import JOB
from hermes.core import Emitter, Message, SerializeError
from hermes.core.drivertools import MessageSerializer

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_PAST = time.time() - 60
messages = st.builds(
    Message,
    type=st.text(min_size=1, max_size=30),
    payload=st.none()
    | st.dictionaries(st.text(max_size=8), json_values, max_size=4)
    | st.lists(json_values, min_size=1, max_size=4),
    id=st.uuids().map(str) | st.from_regex(r"\A[A-Za-z0-9_.:-]{1,64}\Z"),
    created=st.floats(min_value=0, max_value=4e9, exclude_min=True),
    execute_at=st.none() | st.floats(min_value=0, max_value=_PAST),
    retries=st.integers(min_value=0, max_value=10_000),
)


@pytest.mark.hermes_check("round trip", "every Message field survives (Hypothesis)")
@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=messages)
@example(message=Message(JOB, None))
@example(message=Message(JOB, {}))
@example(message=Message("unicode ✓ 𝄞", {"k€y": 'naïve 😀 \u202e\x00 \\ " /', "": [[], {}]}))
@example(message=Message(JOB, {"deep": [[[[[[[[[[{"x": [1.5e300, -0.0, 2**53]}]]]]]]]]]]}))
@example(message=Message(JOB, ["plain string"], retries=25, execute_at=1.5))
def test_every_message_field_survives_the_broker(hermes_kit: Kit, message: Message) -> None:
    hermes_kit.default_worker()  # started by the first example, reused by the others
    before = len(hermes_kit.ledger)
    hermes_kit.emit(message)

    assert wait_until(lambda: hermes_kit.ledger.has(message.id, after=before), DELIVERY_S), (
        f"message {message.id} was not delivered within {DELIVERY_S} s"
    )
    received = hermes_kit.ledger.of(message.id, after=before)[0].message
    assert fields(received) == fields(message), f"message {message.id} changed on the broker"


@pytest.mark.hermes_check("round trip", "a message of max_message_bytes survives")
def test_a_message_as_large_as_the_declared_maximum_survives(hermes_kit: Kit) -> None:
    limit = hermes_kit.capabilities.max_message_bytes
    serializer = MessageSerializer()
    empty = Message(JOB, {"blob": ""})
    overhead = len(serializer.serialize(empty).encode())
    assert overhead < limit, f"max_message_bytes={limit} cannot even carry an empty message"
    blob = (string.ascii_lowercase * (limit // 26 + 1))[: limit - overhead]
    message = empty.replace(payload={"blob": blob})
    size = len(serializer.serialize(message).encode())
    assert size == limit, f"the kit built a message of {size} bytes, not {limit} (a kit bug)"
    hermes_kit.worker()

    hermes_kit.emit(message)

    assert wait_until(lambda: hermes_kit.ledger.has(message.id), DELIVERY_S), (
        f"a message of exactly max_message_bytes={limit} was not delivered within {DELIVERY_S} s"
    )
    received = hermes_kit.ledger.of(message.id)[0].message
    got: Any = received.payload
    assert isinstance(got, dict) and isinstance(got.get("blob"), str), (
        f"the payload came back as {type(got).__name__}, not a dict holding the string 'blob'"
    )
    assert len(got["blob"]) == len(blob), (
        f"the payload came back with a blob of {len(got['blob'])} characters, not {len(blob)}"
    )
    assert fields(received) == fields(message), f"message {message.id} changed on the broker"


@pytest.mark.hermes_check(
    "round trip", "an unencodable payload raises SerializeError, sends nothing"
)
def test_an_unencodable_payload_raises_serialize_error_and_reaches_no_broker(
    hermes_kit: Kit,
) -> None:
    emitter = Emitter(hermes_kit.sender)
    for payload in ({"x": object()}, {"x": float("nan")}, {"x": {1, 2}}, [b"bytes"]):
        with pytest.raises(SerializeError, match="Cannot serialize message"):
            emitter.emit(Message(JOB, payload))
    sentinel = hermes_kit.emit(hermes_kit.message(1))
    hermes_kit.worker()

    assert wait_until(lambda: hermes_kit.ledger.has(sentinel.id), DELIVERY_S), (
        f"a message sent after the refused ones was not delivered within {DELIVERY_S} s"
    )

    def others() -> list[Message]:
        return [e.message for e in hermes_kit.ledger.entries() if e.message.id != sentinel.id]

    assert stays_false(others, QUIET_S), f"these reached the broker: {others()}"
