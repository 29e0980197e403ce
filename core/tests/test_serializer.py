"""The PHP Hermes 4.x envelope, both ways, and nothing but SerializeError on bad input."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes.core import Emitter, Message, SerializeError
from hermes.core.drivertools import MemoryDriver, MessageSerializer, Serializer

serializer = MessageSerializer()

PHP_OUTPUT = (
    '{"message":{"id":"11111111-2222-4333-8444-555555555555","type":"t","created":1764480002,'
    '"payload":[],"execute_at":null,"retries":25}}'
)


def test_message_serializer_is_a_serializer() -> None:
    assert isinstance(serializer, Serializer)


def test_literal_php_output_with_integer_created_and_empty_array_payload_decodes() -> None:
    message = serializer.unserialize(PHP_OUTPUT)

    assert message == Message(
        "t",
        {},
        id="11111111-2222-4333-8444-555555555555",
        created=1764480002.0,
        execute_at=None,
        retries=25,
    )
    assert isinstance(message.created, float)
    assert isinstance(message.retries, int)


def test_php_output_decodes_from_bytes_too() -> None:
    assert serializer.unserialize(PHP_OUTPUT.encode()) == serializer.unserialize(PHP_OUTPUT)


def test_php_escaped_slashes_and_unicode_escapes_decode() -> None:
    data = (
        '{"message":{"id":"a\\/b","type":"mail\\/send","created":1764480000.123,'
        '"payload":{"name":"\\u017dilina","url":"https:\\/\\/x.sk\\/a"},'
        '"execute_at":1764480016.5,"retries":2}}'
    )

    message = serializer.unserialize(data)

    assert message.id == "a/b"
    assert message.type == "mail/send"
    assert message.payload == {"name": "Žilina", "url": "https://x.sk/a"}
    assert message.execute_at == 1764480016.5
    assert message.retries == 2


def test_php_number_spellings_and_a_nested_empty_array_decode_as_the_same_values() -> None:
    # json_encode writes 1e20 as 1.0e+20 and 2.0 as 2; a nested empty array stays a list
    # (PHP cannot tell it from an empty object: only the top-level payload becomes {}).
    data = (
        '{"message":{"id":"x","type":"t","created":1764480002,'
        '"payload":{"big":1.0e+20,"two":2,"empty":[],"path":"a\\/b"},'
        '"execute_at":1764480016,"retries":1}}'
    )

    message = serializer.unserialize(data)

    assert message.payload == {"big": 1e20, "two": 2, "empty": [], "path": "a/b"}
    assert (message.created, message.execute_at) == (1764480002.0, 1764480016.0)
    assert isinstance(message.execute_at, float)


def test_numeric_execute_at_becomes_a_float_and_missing_retries_becomes_0() -> None:
    data = '{"message":{"id":"x","type":"t","created":1,"payload":null,"execute_at":1764480016}}'

    message = serializer.unserialize(data)

    assert message.execute_at == 1764480016.0
    assert isinstance(message.execute_at, float)
    assert message.retries == 0


def test_a_float_retries_becomes_an_int() -> None:
    data = '{"message":{"id":"x","type":"t","created":1,"retries":3.0}}'

    retries = serializer.unserialize(data).retries

    assert (retries, type(retries)) == (3, int)


def test_serialize_writes_the_exact_envelope_in_php_key_order() -> None:
    message = Message(
        "mail",
        {"to": "a@example.com"},
        id="11111111-2222-4333-8444-555555555555",
        created=1764480000.123,
        execute_at=1764480016.5,
        retries=3,
    )

    assert serializer.serialize(message) == (
        '{"message":{"id":"11111111-2222-4333-8444-555555555555","type":"mail",'
        '"created":1764480000.123,"payload":{"to":"a@example.com"},'
        '"execute_at":1764480016.5,"retries":3}}'
    )


def test_serialize_writes_null_for_no_payload_and_no_execute_at() -> None:
    message = Message("t", id="i", created=1.5)

    assert serializer.serialize(message) == (
        '{"message":{"id":"i","type":"t","created":1.5,"payload":null,"execute_at":null,"retries":0}}'
    )


def test_serialize_escapes_non_ascii_like_php_json_encode() -> None:
    text = serializer.serialize(Message("t", {"name": "Žilina"}, id="i", created=1.0))

    assert '"\\u017dilina"' in text
    assert text.isascii()


def test_a_message_survives_a_round_trip() -> None:
    message = Message("t", {"a": [1, 2.5, None, True, "ž"], "b": {}}, execute_at=12.25, retries=4)

    assert serializer.unserialize(serializer.serialize(message)) == message


# Bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        "",
        b"",
        "not json",
        "{",
        '"just a string"',
        "[]",
        "42",
        "null",
        "{}",
        '{"other":{}}',
        '{"message":null}',
        '{"message":"text"}',
        '{"message":[1,2]}',
        b"\xff\xfe\xfa not utf-8",
        b'{"message":{"id":"\xc3\x28","type":"t","created":1}}',
        '{"message":{"id":"x","type":"t","created":1,"payload":NaN}}',
        '{"message":{"id":"x","type":"t","created":1,"payload":[Infinity]}}',
        '{"message":{"id":"x","type":"t","created":1,"payload":1e400}}',
        "[" * 100_000 + "]" * 100_000,
        '{"message":{"id":"x","type":"t","created":1,"payload":' + "[" * 100_000 + "]" * 100_000,
    ],
    ids=lambda data: repr(data[:24]),
)
def test_input_that_is_not_a_message_envelope_cannot_be_unserialized(data: str | bytes) -> None:
    with pytest.raises(SerializeError, match=r"^Cannot unserialize message from '") as caught:
        serializer.unserialize(data)

    assert caught.value.data == data


# What PHP Hermes 4.x's unserialize takes, read as it reads it -----------------


def test_a_body_php_takes_without_created_is_stamped_with_the_time_it_was_read() -> None:
    data = '{"message":{"id":"x","type":"t","payload":null,"execute_at":null,"retries":0}}'
    before = time.time()

    message = serializer.unserialize(data)

    assert before <= message.created <= time.time()


@pytest.mark.parametrize("created", ["null", "0", "0.0"])
def test_a_null_or_zero_created_is_the_time_it_was_read_as_in_php(created: str) -> None:
    data = '{"message":{"id":"x","type":"t","created":' + created + "}}"
    before = time.time()

    assert serializer.unserialize(data).created >= before


def test_a_body_without_an_id_gets_a_fresh_one_as_in_php() -> None:
    first = serializer.unserialize('{"message":{"type":"t","created":1}}')
    second = serializer.unserialize('{"message":{"type":"t","created":1,"id":null}}')

    assert len(first.id) == 36 and len(second.id) == 36
    assert first.id != second.id


@pytest.mark.parametrize(
    ("retries", "read"),
    [
        ('"2"', 2),
        ('" 7"', 7),
        ('"3.9"', 3),
        ('"1e2"', 100),
        ('"4 apples"', 4),
        ('"none"', 0),
        ('""', 0),
        ("true", 1),
        ("false", 0),
        ("[]", 0),
        ('["x"]', 1),
        ("-1", 0),
        ('"-5"', 0),
        ("2.7", 2),
        ("null", 0),
    ],
)
def test_retries_is_read_as_php_intval_reads_it(retries: str, read: int) -> None:
    data = '{"message":{"id":"x","type":"t","created":1,"retries":' + retries + "}}"

    message = serializer.unserialize(data)

    assert (message.retries, type(message.retries)) == (read, int)


@pytest.mark.parametrize(
    ("execute_at", "read"),
    [
        ('"1764480016.5"', 1764480016.5),
        ('"1764480016"', 1764480016.0),
        ('"  12e1"', 120.0),
        ('"soon"', 0.0),
        ("true", 1.0),
        ("{}", 0.0),
        ("null", None),
    ],
)
def test_execute_at_is_read_as_php_floatval_reads_it(execute_at: str, read: float | None) -> None:
    data = '{"message":{"id":"x","type":"t","created":1,"execute_at":' + execute_at + "}}"

    assert serializer.unserialize(data).execute_at == read


def test_a_normalised_message_writes_a_plain_envelope_again() -> None:
    message = serializer.unserialize('{"message":{"type":"t","retries":"2","execute_at":"5"}}')

    envelope = json.loads(serializer.serialize(message))["message"]

    assert (envelope["id"], envelope["created"]) == (message.id, message.created)
    assert (envelope["retries"], envelope["execute_at"]) == (2, 5.0)


# Bad input: what PHP's worker dies on ---------------------------------------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"id": "x", "created": 1}, "type must be a non-empty string, got null"),
        ({"id": "x", "type": ["t"], "created": 1}, "type must be a non-empty string, got an array"),
        ({"id": "x", "type": 5, "created": 1}, "type must be a non-empty string, got a number 5"),
        ({"id": "x", "type": "", "created": 1}, "type must be a non-empty string, got a string"),
        ({"id": 7, "type": "t", "created": 1}, "id must be a string, got a number 7"),
        ({"id": "x", "type": "t", "created": "yesterday"}, "created must be a number or absent"),
        ({"id": "x", "type": "t", "created": "1764480002"}, "created must be a number"),
        ({"id": "x", "type": "t", "created": True}, "created must be a number or absent, got a b"),
        ({"id": "x", "type": "t", "created": 10**400}, "created must be a number or absent"),
        ({"id": "x", "type": "t", "created": 1, "execute_at": "1e400"}, "execute_at is out of"),
        ({"id": "x", "type": "t", "created": 1, "payload": "just a string"}, "payload must be"),
        ({"id": "x", "type": "t", "created": 1, "payload": 42}, "payload must be an object, an"),
        ({"id": "x", "type": "t", "created": 1, "payload": False}, "payload must be"),
    ],
    ids=lambda value: repr(value)[:50],
)
def test_an_envelope_php_cannot_read_has_an_invalid_format_that_names_the_field(
    body: dict[str, Any], reason: str
) -> None:
    data = json.dumps({"message": body})

    with pytest.raises(SerializeError, match=r"^Invalid message format in '") as caught:
        serializer.unserialize(data)

    assert f"': {reason}" in str(caught.value)


def test_the_error_quotes_a_bounded_prefix_of_the_bad_input() -> None:
    data = "x" * 10_000

    with pytest.raises(SerializeError) as caught:
        serializer.unserialize(data)

    assert "xxxxxxxxxx" in str(caught.value)
    assert len(str(caught.value)) < 300


def test_the_error_quotes_undecodable_bytes_readably() -> None:
    with pytest.raises(SerializeError) as caught:
        serializer.unserialize(b"\xff{oops")

    assert "\\xff{oops" in str(caught.value)


def test_something_that_is_neither_text_nor_bytes_raises_serialize_error() -> None:
    with pytest.raises(SerializeError, match="int"):
        serializer.unserialize(42)  # type: ignore[arg-type]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
envelope_fields = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "type": json_values,
        "created": json_values,
        "payload": json_values,
        "execute_at": json_values,
        "retries": json_values,
    },
)


def _only_serialize_error(data: str | bytes) -> None:
    try:
        message = serializer.unserialize(data)
    except SerializeError:
        return
    # What decodes must encode again: a retry copy of it has to reach the broker.
    assert serializer.unserialize(serializer.serialize(message)) == message


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text_raises_nothing_but_serialize_error(data: str) -> None:
    _only_serialize_error(data)


@settings(max_examples=300, deadline=None)
@given(st.binary())
def test_arbitrary_bytes_raise_nothing_but_serialize_error(data: bytes) -> None:
    _only_serialize_error(data)


@settings(max_examples=150, deadline=None)
@given(envelope_fields)
def test_arbitrary_envelope_contents_raise_nothing_but_serialize_error(body: Any) -> None:
    _only_serialize_error(json.dumps({"message": body}))


# Unencodable payloads ------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [{"x": {1, 2}}, {"x": math.nan}, {"x": math.inf}, {"x": object()}, [b"bytes"]],
    ids=["set", "nan", "inf", "object", "bytes"],
)
def test_an_unencodable_payload_fails_at_emit_before_the_broker(
    payload: Any, driver: MemoryDriver, peek: Any
) -> None:
    message = Message("job", payload)

    with pytest.raises(SerializeError, match=f"^Cannot serialize message {message.id}"):
        Emitter(driver).emit(message)

    assert peek.total(driver) == 0


def test_a_circular_payload_fails_with_serialize_error() -> None:
    payload: dict[str, Any] = {}
    payload["self"] = payload

    with pytest.raises(SerializeError, match="Cannot serialize message"):
        serializer.serialize(Message("job", payload))


@pytest.mark.parametrize(
    ("payload", "where", "fix"),
    [
        ({"order": {"paid_at": __import__("datetime").datetime(2026, 1, 2, 3, 4)}},
         "payload['order']['paid_at'] is a datetime", "paid_at.isoformat()"),
        ({"amount": __import__("decimal").Decimal("9.99")},
         "payload['amount'] is a Decimal", "str(amount)"),
        ({"tags": {"a", "b"}}, "payload['tags'] is a set", "sorted(tags)"),
        ([1, {"ratio": math.nan}], "payload[1]['ratio'] is nan", "None"),
        ({"blob": b"\x00"}, "payload['blob'] is a bytes", "base64"),
    ],
)  # fmt: skip
def test_an_unencodable_value_is_named_by_its_path_with_the_fix(
    payload: Any, where: str, fix: str
) -> None:
    message = Message("job", payload)

    with pytest.raises(SerializeError) as caught:
        serializer.serialize(message)

    text = str(caught.value)
    assert text.startswith(f"Cannot serialize message {message.id}: {where}")
    assert fix in text
