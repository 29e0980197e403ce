"""The immutable Message, and what it refuses before anything reaches a broker."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest

from hermes.core import Message


def test_a_message_gets_a_fresh_uuid4_id() -> None:
    first, second = Message("job"), Message("job")

    assert uuid.UUID(first.id).version == 4
    assert first.id != second.id


def test_ids_read_like_str_uuid4_has_them() -> None:
    for _ in range(200):
        id = Message("job").id
        parsed = uuid.UUID(id)
        assert str(parsed) == id
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_an_empty_id_also_gets_a_fresh_uuid4() -> None:
    assert uuid.UUID(Message("job", id="").id).version == 4


def test_a_given_id_is_kept() -> None:
    assert Message("job", id="my-id").id == "my-id"


def test_created_defaults_to_now() -> None:
    before = time.time()
    message = Message("job")
    after = time.time()

    assert before <= message.created <= after


def test_the_defaults_are_no_payload_no_execute_at_and_no_retries() -> None:
    message = Message("job")

    assert (message.payload, message.execute_at, message.retries) == (None, None, 0)


def test_numeric_created_and_execute_at_are_stored_as_floats() -> None:
    message = Message("job", created=10, execute_at=20)

    assert (message.created, message.execute_at) == (10.0, 20.0)
    assert isinstance(message.created, float)
    assert isinstance(message.execute_at, float)


def test_payload_is_the_second_positional_argument_and_the_rest_are_keywords() -> None:
    assert Message("job", {"a": 1}).payload == {"a": 1}
    with pytest.raises(TypeError):
        Message("job", None, "id")  # type: ignore[call-arg]


def test_a_message_is_immutable() -> None:
    message = Message("job")

    with pytest.raises(dataclasses.FrozenInstanceError):
        message.retries = 1  # type: ignore[misc]


def test_priority_is_not_part_of_a_message() -> None:
    names = {field.name for field in dataclasses.fields(Message)}

    assert names == {"type", "payload", "id", "created", "execute_at", "retries", "headers"}


@pytest.mark.parametrize("type_", ["", None, 5])
def test_a_message_needs_a_non_empty_string_type(type_: object) -> None:
    with pytest.raises(ValueError, match="type"):
        Message(type_)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "payload",
    ["just a string", 42, 4.5, True, b"bytes", (1, 2), {1, 2}, object()],
    ids=["str", "int", "float", "bool", "bytes", "tuple", "set", "object"],
)
def test_a_payload_that_is_not_a_dict_a_list_or_none_is_refused(payload: object) -> None:
    with pytest.raises(ValueError, match=r"^Message payload must be a dict, a list or None"):
        Message("job", payload)


def test_the_refused_payload_is_named_with_its_type_and_a_bounded_repr() -> None:
    with pytest.raises(ValueError) as caught:
        Message("job", "x" * 1000)

    text = str(caught.value)
    assert "got str 'xxx" in text
    assert len(text) < 200


@pytest.mark.parametrize("payload", [None, {}, {"a": [1, {"b": None}]}, [], [1, "two"]])
def test_a_dict_a_list_or_none_is_a_payload(payload: object) -> None:
    assert Message("job", payload).payload == payload


@pytest.mark.parametrize("id_", [123, 1.5, b"id", uuid.uuid4()], ids=repr)
def test_an_id_that_is_not_a_string_is_refused(id_: object) -> None:
    with pytest.raises(ValueError, match=r"^Message id must be a string"):
        Message("job", id=id_)  # type: ignore[arg-type]


def test_replace_checks_the_new_payload_too() -> None:
    with pytest.raises(ValueError, match="payload"):
        Message("job", {"a": 1}).replace(payload="just a string")


@pytest.mark.parametrize("retries", [-1, 1.5, True, "2"])
def test_retries_must_be_an_int_of_at_least_0(retries: object) -> None:
    with pytest.raises(ValueError, match="retries"):
        Message("job", retries=retries)  # type: ignore[arg-type]


def test_replace_keeps_id_and_created_and_changes_what_it_is_given() -> None:
    message = Message("job", {"a": 1}, created=5.0)

    copy = message.replace(retries=1, execute_at=50.0)

    assert (copy.id, copy.created, copy.type, copy.payload) == (message.id, 5.0, "job", {"a": 1})
    assert (copy.retries, copy.execute_at) == (1, 50.0)
    assert (message.retries, message.execute_at) == (0, None)


def test_replace_rejects_a_field_a_message_does_not_have() -> None:
    with pytest.raises(TypeError, match="priority"):
        Message("job").replace(priority=300)


def test_messages_with_equal_fields_are_equal() -> None:
    assert Message("job", [1], id="i", created=1.0) == Message("job", [1], id="i", created=1.0)
    assert Message("job", [1], id="i", created=1.0) != Message("job", [2], id="i", created=1.0)


def test_execute_at_may_be_a_datetime_and_is_kept_as_its_timestamp() -> None:
    import datetime

    moment = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)

    assert Message("t", execute_at=moment).execute_at == moment.timestamp()


def test_an_execute_at_that_is_not_a_time_is_a_value_error_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^Message execute_at must be a UNIX timestamp"):
        Message("t", execute_at="tomorrow")  # type: ignore[arg-type]
