"""The failed-message store: what a Dispatcher gave up on, kept, listed, put back, purged."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from hermes.core import (
    DEFAULT_PRIORITY,
    ConfigurationError,
    DriverError,
    FailedMessage,
    FailedStore,
    Message,
    NotSupportedError,
    RetryableHandler,
    RetryMixin,
    compat,
)
from hermes.core.app._failed import NO_REASON, FailedMessageSerializer
from hermes.core.compat import Dispatcher
from hermes.core.driver import MemoryDriver, MessageSerializer
from hermes.core.spi._memory import _MemoryBrowser as MemoryBrowser


@pytest.fixture
def store_driver(broker_name: str) -> Iterator[MemoryDriver]:
    driver = MemoryDriver(f"{broker_name}-failed")
    yield driver
    driver.teardown()


@pytest.fixture
def store(store_driver: MemoryDriver) -> FailedStore:
    return FailedStore(store_driver, MemoryBrowser(store_driver))


class Flaky(RetryMixin, RetryableHandler):
    def handle(self, message: Message) -> bool:
        raise RuntimeError("SMTP down")


class Declines:
    def handle(self, message: Message) -> bool:
        return False


class Records:
    def __init__(self) -> None:
        self.seen: list[Message] = []

    def handle(self, message: Message) -> bool:
        self.seen.append(message)
        return True


# The envelope ------------------------------------------------------------------------


def test_a_failed_message_carries_its_reason_and_time_in_the_envelope() -> None:
    failed = FailedMessage.of(Message("mail", {"to": "ana"}, retries=25), "gave up", 1700000000.5)

    text = FailedMessageSerializer().serialize(failed)

    body = json.loads(text)["message"]
    assert (body["failed_reason"], body["failed_at"]) == ("gave up", 1700000000.5)
    assert FailedMessageSerializer().unserialize(text) == failed


def test_a_reader_that_knows_nothing_of_failures_reads_the_same_message() -> None:
    message = Message("mail", {"to": "ana"}, retries=3)
    text = FailedMessageSerializer().serialize(FailedMessage.of(message, "gave up"))

    plain = MessageSerializer().unserialize(text)

    assert type(plain) is Message
    assert (plain.id, plain.type, plain.payload, plain.retries) == (
        message.id,
        "mail",
        {"to": "ana"},
        3,
    )


def test_a_plain_message_in_the_store_reads_as_failed_with_no_reason() -> None:
    message = Message("mail", created=1700000000.0)

    read = FailedMessageSerializer().unserialize(MessageSerializer().serialize(message))

    assert isinstance(read, FailedMessage)
    assert (read.id, read.failed_reason, read.failed_at) == (message.id, NO_REASON, 1700000000.0)


def test_fresh_keeps_id_type_payload_and_created_and_resets_retries_and_delay() -> None:
    failed = FailedMessage.of(Message("mail", {"n": 1}, retries=25, execute_at=2e9), "x")

    fresh = failed.fresh()

    assert type(fresh) is Message
    assert (fresh.id, fresh.type, fresh.payload, fresh.created) == (
        failed.id,
        "mail",
        {"n": 1},
        failed.created,
    )
    assert (fresh.retries, fresh.execute_at) == (0, None)


# The Dispatcher keeps what it gave up on ----------------------------------------------


@pytest.mark.parametrize(
    ("type_", "retries", "reason"),
    [
        (
            "declined",
            0,
            "Declines: it returned False (a handler that returns False is never retried)",
        ),
        ("tired", 25, "Flaky: gave up after 25 retries"),
        ("stray", 0, "no handler is registered for its type"),
    ],
)
def test_a_message_given_up_on_is_kept_with_its_reason(
    driver: MemoryDriver, store: FailedStore, type_: str, retries: int, reason: str
) -> None:
    message = Message(type_, {"n": 1}, retries=retries)
    dispatcher = Dispatcher(driver, failed=store)
    dispatcher.register_handler("declined", Declines()).register_handler("tired", Flaky())

    assert dispatcher.handle_message(message, DEFAULT_PRIORITY) is False

    (kept,) = store.messages()
    assert (kept.id, kept.type, kept.payload) == (message.id, type_, {"n": 1})
    assert kept.retries == retries
    assert kept.failed_reason == reason
    assert dispatcher.stats.stored == 1


def test_a_driver_given_as_the_store_is_used_through_a_failed_store(
    driver: MemoryDriver, store_driver: MemoryDriver
) -> None:
    dispatcher = Dispatcher(driver, failed=store_driver)
    dispatcher.handle_message(Message("stray"), DEFAULT_PRIORITY)

    assert isinstance(dispatcher.failed, FailedStore)
    (kept,) = FailedStore(store_driver, MemoryBrowser(store_driver)).messages()
    assert kept.failed_reason == "no handler is registered for its type"


def test_the_dispatcher_s_own_driver_cannot_be_its_store(driver: MemoryDriver) -> None:
    with pytest.raises(ConfigurationError, match="would come straight back"):
        Dispatcher(driver, failed=driver)


def test_the_log_line_of_a_message_given_up_on_says_it_goes_to_the_store(
    driver: MemoryDriver, store: FailedStore, hermes_log: pytest.LogCaptureFixture
) -> None:
    message = Message("stray")
    Dispatcher(driver, failed=store).handle_message(message, DEFAULT_PRIORITY)

    assert [r.getMessage() for r in hermes_log.records if r.levelno == logging.ERROR] == [
        f"No handlers registered for message #{message.id} (stray); "
        "it goes to the failed-message store"
    ]


def test_handled_and_retried_messages_are_not_kept(
    driver: MemoryDriver, store: FailedStore
) -> None:
    dispatcher = Dispatcher(driver, failed=store).register_handler("ok", Records())
    dispatcher.register_handler("flaky", Flaky())

    dispatcher.handle_message(Message("ok"), DEFAULT_PRIORITY)
    dispatcher.handle_message(Message("flaky"), DEFAULT_PRIORITY)

    assert store.messages() == []
    assert (dispatcher.stats.retried, dispatcher.stats.stored) == (1, 0)


def test_a_message_two_handlers_gave_up_on_is_kept_once_with_both_reasons(
    driver: MemoryDriver, store: FailedStore
) -> None:
    message = Message("mail", retries=25)
    dispatcher = Dispatcher(driver, failed=store)
    dispatcher.register_handlers("mail", [Declines(), Records(), Flaky()])

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    (kept,) = store.messages()
    assert kept.failed_reason == (
        "Declines: it returned False (a handler that returns False is never retried); "
        "Flaky: gave up after 25 retries"
    )


def test_a_store_that_cannot_take_the_message_is_an_error_line_and_the_worker_goes_on(
    driver: MemoryDriver, broker_name: str, hermes_log: pytest.LogCaptureFixture
) -> None:
    class Unreachable(MemoryDriver):
        def put(self, items: Any, priority: int = DEFAULT_PRIORITY) -> None:
            raise DriverError("store unreachable")

    message = Message("stray")
    dispatcher = Dispatcher(driver, failed=Unreachable(f"{broker_name}-down"))

    assert dispatcher.handle_message(message, DEFAULT_PRIORITY) is False

    last = hermes_log.records[-1]
    assert last.levelno == logging.ERROR
    assert last.getMessage().startswith(
        f"Message #{message.id} (stray) could not be sent to the failed-message store"
    )
    assert last.getMessage().endswith("and is lost - store unreachable")
    assert dispatcher.stats.stored == 0


# Reading the store back ---------------------------------------------------------------


def test_retry_puts_the_messages_back_fresh_and_takes_them_out_of_the_store(
    driver: MemoryDriver, store: FailedStore, peek: Any
) -> None:
    first = store.keep(Message("mail", {"n": 1}, retries=25), "gave up", failed_at=1.0)
    second = store.keep(Message("mail", {"n": 2}), "returned False", failed_at=2.0)

    sent = store.retry(driver)

    assert [m.id for m in sent] == [first.id, second.id]
    queued = peek.queued(driver)
    assert [(m.id, m.retries, m.execute_at) for m in queued] == [
        (first.id, 0, None),
        (second.id, 0, None),
    ]
    assert all(type(m) is Message for m in queued)
    assert store.messages() == []


def test_retry_and_purge_by_id_touch_only_those_messages(
    driver: MemoryDriver, store: FailedStore, peek: Any
) -> None:
    a, b, c = (store.keep(Message("mail"), "x", failed_at=n) for n in (1.0, 2.0, 3.0))

    assert [m.id for m in store.retry(driver, {b.id})] == [b.id]
    assert store.purge({c.id}) == 1

    assert [m.id for m in peek.queued(driver)] == [b.id]
    assert [m.id for m in store.messages()] == [a.id]


def test_messages_lists_oldest_failure_first(store: FailedStore) -> None:
    late = store.keep(Message("a"), "x", failed_at=20.0)
    early = store.keep(Message("b"), "y", failed_at=10.0)

    assert [(m.id, m.failed_reason) for m in store.messages()] == [(early.id, "y"), (late.id, "x")]


def test_purge_without_ids_removes_everything_even_bodies_that_are_not_messages(
    store: FailedStore, store_driver: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    store.keep(Message("a"), "x")
    store_driver.send_raw(b"not json")

    assert len(store.messages()) == 1
    assert "holds a body that is not a Hermes message" in caplog.text
    assert store.purge() == 2
    assert list(MemoryBrowser(store_driver).entries()) == []


def test_a_store_without_a_browser_keeps_messages_but_says_it_cannot_list_them(
    store_driver: MemoryDriver,
) -> None:
    store = FailedStore(store_driver)
    store.keep(Message("a"), "x")

    for read in (store.messages, store.purge, lambda: store.retry(store_driver)):
        with pytest.raises(
            NotSupportedError, match=r"cannot list or delete .* file:// or redis://"
        ):
            read()


def test_a_message_given_up_on_runs_again_once_retried_from_the_store(
    driver: MemoryDriver, store: FailedStore
) -> None:
    message = Message("mail", {"to": "ana"}, retries=25)
    Dispatcher(driver, failed=store).register_handler("mail", Flaky()).handle_message(
        message, DEFAULT_PRIORITY
    )

    store.retry(driver)
    fixed = Records()
    compat.set_max_process_items(driver, 1)
    Dispatcher(driver).register_handler("mail", fixed).handle()

    assert [(m.id, m.payload, m.retries) for m in fixed.seen] == [(message.id, {"to": "ana"}, 0)]
