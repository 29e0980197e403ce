"""Headers: short string pairs that travel with a message, its retry copies and the wire."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from hermes.core import (
    Dispatcher,
    Emitter,
    FailedMessage,
    Message,
    SerializeError,
    connect,
    hookimpl,
)
from hermes.core.app._failed import FailedMessageSerializer
from hermes.core.drivertools import MessageSerializer
from hermes.core.spi._registry import plugin_manager
from hermes.core.testing import drain, scheduled

#: Written by PHP Hermes 4.2's MessageSerializer (json_encode), through
#: drivers/redis/tests/php/headers_check.php: messages this serializer must
#: write byte for byte the same when they carry no headers.
PHP_WRITTEN = [
    (
        Message(
            "mail",
            {"to": "a@example.com", "n": 3},
            id="0f8fad5b-d9cb-469f-a165-70867728950e",
            created=1764480002.25,
        ),
        '{"message":{"id":"0f8fad5b-d9cb-469f-a165-70867728950e","type":"mail",'
        '"created":1764480002.25,"payload":{"to":"a@example.com","n":3},'
        '"execute_at":null,"retries":0}}',
    ),
    (
        Message(
            "later",
            {"nested": {"x": [1, 2]}},
            id="7c9e6679-7425-40de-944b-e07fc1f90ae7",
            created=1764480002.5,
            execute_at=1764480016.75,
            retries=3,
        ),
        '{"message":{"id":"7c9e6679-7425-40de-944b-e07fc1f90ae7","type":"later",'
        '"created":1764480002.5,"payload":{"nested":{"x":[1,2]}},'
        '"execute_at":1764480016.75,"retries":3}}',
    ),
    (
        Message(
            "no-payload", None, id="e4eaaaf2-d142-11e1-b3e4-080027620cdd", created=1764480003.125
        ),
        '{"message":{"id":"e4eaaaf2-d142-11e1-b3e4-080027620cdd","type":"no-payload",'
        '"created":1764480003.125,"payload":null,"execute_at":null,"retries":0}}',
    ),
]

TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

_names = itertools.count()


def envelope_without(body: str, key: str) -> str:
    data = json.loads(body)
    del data["message"][key]
    return json.dumps(data, separators=(",", ":"))


# Message ------------------------------------------------------------------


def test_a_message_has_no_headers_unless_given() -> None:
    assert dict(Message("t").headers) == {}
    assert dict(Message("t", headers=None).headers) == {}


def test_headers_are_a_read_only_copy() -> None:
    given = {"who": "signup"}
    message = Message("t", headers=given)
    given["who"] = "changed"
    assert message.headers == {"who": "signup"}
    with pytest.raises(TypeError):
        message.headers["who"] = "x"  # type: ignore[index]


def test_replace_and_so_a_retry_copy_keeps_the_headers() -> None:
    message = Message("t", headers=TRACE)
    assert message.replace(retries=1, execute_at=5.0).headers == TRACE
    assert message.replace(headers={"a": "b"}).headers == {"a": "b"}


def test_a_message_without_a_payload_stays_hashable() -> None:
    assert hash(Message("t", id="x", created=1.0)) == hash(Message("t", id="x", created=1.0))


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ([("a", "b")], "mapping"),
        ({"a": 1}, "header 'a'"),
        ({"": "x"}, "names"),
        ({1: "x"}, "names"),
        ({"a" * 129: "x"}, "longer than 128"),
        ({"a": "x" * 4097}, "header 'a' is longer than 4096"),
        ({f"h{i}": "x" for i in range(65)}, "at most 64"),
    ],
)
def test_headers_that_are_not_short_strings_are_refused_naming_the_field(
    headers: Any, named: str
) -> None:
    with pytest.raises(ValueError, match="Message header") as caught:
        Message("t", headers=headers)
    assert named in str(caught.value)


# Wire ---------------------------------------------------------------------


@pytest.mark.parametrize(("message", "php"), PHP_WRITTEN)
def test_a_message_without_headers_is_byte_for_byte_what_php_writes(
    message: Message, php: str
) -> None:
    assert MessageSerializer().serialize(message) == php


@pytest.mark.parametrize(("message", "php"), PHP_WRITTEN)
def test_headers_are_one_more_key_after_retries(message: Message, php: str) -> None:
    text = MessageSerializer().serialize(message.replace(headers={"who": "a/b", **TRACE}))
    expected = php[:-2] + ',"headers":{"who":"a/b","traceparent":"' + TRACE["traceparent"] + '"}}}'
    assert text == expected


def test_headers_survive_a_round_trip_in_order() -> None:
    serializer = MessageSerializer()
    message = Message("t", {"n": 1}, headers={"z": "1", "a": "Žofia", **TRACE})
    back = serializer.unserialize(serializer.serialize(message))
    assert back == message
    assert list(back.headers) == ["z", "a", "traceparent"]


@pytest.mark.parametrize("empty", ["null", "[]", "{}"])
def test_null_or_an_empty_headers_field_means_none(empty: str) -> None:
    php = PHP_WRITTEN[0][1]
    message = MessageSerializer().unserialize(php[:-2] + f',"headers":{empty}}}}}')
    assert dict(message.headers) == {}


@pytest.mark.parametrize(
    "headers", ['"traceparent"', '["a"]', '{"a":1}', '{"a":null}', '{"a":"' + "x" * 5000 + '"}']
)
def test_a_malformed_headers_field_is_a_serialize_error_naming_it(headers: str) -> None:
    php = PHP_WRITTEN[0][1]
    with pytest.raises(SerializeError, match="Invalid message headers"):
        MessageSerializer().unserialize(php[:-2] + f',"headers":{headers}}}}}')


def test_a_failed_message_keeps_its_headers_in_the_store_and_when_run_again() -> None:
    serializer = FailedMessageSerializer()
    failed = FailedMessage.of(Message("t", headers=TRACE), "gave up", failed_at=2.0)
    back = serializer.unserialize(serializer.serialize(failed))
    assert back.headers == TRACE
    assert back.failed_reason == "gave up"
    assert back.fresh().headers == TRACE


# Retry copies ---------------------------------------------------------------


def test_a_retry_copy_carries_the_headers_through_the_broker() -> None:
    driver = connect(f"memory://headers-{next(_names)}")
    Emitter(driver).emit(Message("fails", headers=TRACE))
    dispatcher = Dispatcher(driver)

    @dispatcher.handler("fails", max_retry=3)
    def fail(message: Message) -> None:
        raise RuntimeError("later")

    drain(dispatcher)
    [retry] = scheduled(driver)
    assert (retry.retries, retry.headers) == (1, TRACE)


# The emit hook ----------------------------------------------------------------


@contextlib.contextmanager
def registered(plugin: object) -> Iterator[str]:
    name = f"test-headers-{next(_names)}"
    plugin_manager().register(plugin, name=name)
    try:
        yield name
    finally:
        plugin_manager().unregister(plugin)


class AddsHeaders:
    def __init__(self, headers: Mapping[str, str]) -> None:
        self.headers = headers
        self.seen: list[Message] = []
        self.exits: list[BaseException | None] = []

    @hookimpl
    def hermes_emit_call(self, message: Message) -> contextlib.AbstractContextManager[Any]:
        self.seen.append(message)
        return self._around()

    @contextlib.contextmanager
    def _around(self) -> Iterator[Mapping[str, str]]:
        try:
            yield self.headers
        except BaseException as exc:
            self.exits.append(exc)
            raise
        self.exits.append(None)


class Raises:
    @hookimpl
    def hermes_emit_call(self, message: Message) -> None:
        raise RuntimeError("a broken tracer")


def sent(driver: Any) -> list[Message]:
    dispatcher = Dispatcher(driver)
    got: list[Message] = []
    dispatcher.register_handler("t", got.append)
    drain(dispatcher)
    return got


def test_an_emit_plugin_adds_headers_to_what_is_sent_and_what_emitted_observers_see() -> None:
    driver = connect(f"memory://headers-{next(_names)}")
    plugin = AddsHeaders(TRACE)
    emitted: list[Message] = []

    class Observer:
        @hookimpl
        def hermes_message_emitted(self, message: Message) -> None:
            emitted.append(message)

    given = Message("t", headers={"who": "signup"})
    with registered(plugin), registered(Observer()):
        Emitter(driver).emit(given)
    [got] = sent(driver)
    assert got.headers == {"who": "signup", **TRACE}
    assert emitted[0].headers == got.headers
    assert dict(given.headers) == {"who": "signup"}  # the caller's message is unchanged
    assert plugin.exits == [None]


def test_emit_batch_enters_one_manager_per_message_around_the_one_send() -> None:
    driver = connect(f"memory://headers-{next(_names)}")
    plugin = AddsHeaders(TRACE)
    with registered(plugin):
        Emitter(driver).emit_batch([Message("t"), Message("t")])
    assert [m.headers for m in sent(driver)] == [TRACE, TRACE]
    assert len(plugin.seen) == 2
    assert plugin.exits == [None, None]


def test_the_emit_manager_sees_a_failed_send(caplog: pytest.LogCaptureFixture) -> None:
    driver = connect(f"memory://headers-{next(_names)}")
    plugin = AddsHeaders(TRACE)
    unencodable = Message("t", {"x": object()})
    with registered(plugin), pytest.raises(SerializeError):
        Emitter(driver).emit(unencodable)
    assert isinstance(plugin.exits[0], SerializeError)


def test_an_emit_plugin_that_raises_is_logged_and_the_message_still_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = connect(f"memory://headers-{next(_names)}")
    with caplog.at_level(logging.ERROR, "hermes"), registered(Raises()) as name:
        Emitter(driver).emit(Message("t", headers={"who": "signup"}))
    [got] = sent(driver)
    assert got.headers == {"who": "signup"}
    assert f"Hermes plugin {name} raised in hermes_emit_call" in caplog.text


def test_headers_an_emit_plugin_returns_that_a_message_refuses_are_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = connect(f"memory://headers-{next(_names)}")
    with caplog.at_level(logging.ERROR, "hermes"), registered(AddsHeaders({"n": 1})):  # type: ignore[dict-item]
        Emitter(driver).emit(Message("t"))
    [got] = sent(driver)
    assert dict(got.headers) == {}
    assert "must be a string" in caplog.text
