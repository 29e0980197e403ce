"""The failed-message store: what a Dispatcher gave up on, kept, listed, put back, purged."""

from __future__ import annotations

import json
import logging
import re
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
from hermes.core.app._failed import (
    MAX_EXCEPTION_MESSAGE_CHARS,
    MAX_TRACEBACK_CHARS,
    NO_REASON,
    ExceptionRecord,
    FailedMessageSerializer,
)
from hermes.core.compat import Dispatcher
from hermes.core.drivertools import MemoryDriver, MessageSerializer
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


class CardDeclined(Exception):
    pass


def charge_card(message: Message) -> None:
    raise RuntimeError("card declined")


class Billing(RetryMixin, RetryableHandler):
    """Retried once, then given up on."""

    def max_retry(self) -> int:
        return 1

    def handle(self, message: Message) -> bool:
        raise CardDeclined(f"card declined for order {message.payload['order']}")


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
            NotSupportedError, match=r"cannot list or delete .* file://, redis:// or postgresql://"
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


# What the handler raised ----------------------------------------------------------------


def raise_card_declined() -> None:
    raise RuntimeError("card declined")


def test_a_handler_raising_runtime_error_then_giving_up_keeps_its_class_message_and_traceback(
    driver: MemoryDriver, store: FailedStore, peek: Any
) -> None:
    dispatcher = Dispatcher(driver, failed=store)

    @dispatcher.handler("charge", max_retry=1)
    def charge(message: Message) -> None:
        raise_card_declined()

    dispatcher.handle_message(Message("charge"), DEFAULT_PRIORITY)
    assert store.messages() == [], "the first failure is retried"
    ((_, retry),) = peek.scheduled(driver)
    dispatcher.handle_message(retry, DEFAULT_PRIORITY)

    (kept,) = store.messages()
    assert kept.failed_reason.endswith("gave up after 1 retry")
    (raised,) = kept.exceptions
    assert kept.exception is raised
    assert (raised.exception_class, raised.message) == ("builtins.RuntimeError", "card declined")
    assert "in raise_card_declined" in raised.traceback
    assert raised.traceback.rstrip().endswith("RuntimeError: card declined")
    frames = [line for line in raised.traceback.splitlines() if line.startswith("  File ")]
    assert frames[0].endswith(", in charge"), "it starts at the handler, not in the Dispatcher"
    assert raised.handler.endswith("charge")


def test_an_application_exception_is_kept_with_its_module_and_class_name(
    driver: MemoryDriver, store: FailedStore
) -> None:
    dispatcher = Dispatcher(driver, failed=store).register_handler("bill", Billing())

    dispatcher.handle_message(Message("bill", {"order": 7}, retries=1), DEFAULT_PRIORITY)

    (kept,) = store.messages()
    assert kept.failed_reason == "Billing: gave up after 1 retry"
    assert kept.exception is not None
    assert kept.exception.exception_class == f"{__name__}.CardDeclined"
    assert kept.exception.message == "card declined for order 7"
    assert kept.exception.handler == "Billing"


def test_a_message_set_aside_without_an_exception_keeps_none_and_its_reason_says_why(
    driver: MemoryDriver, store: FailedStore
) -> None:
    dispatcher = Dispatcher(driver, failed=store).register_handler("declined", Declines())

    dispatcher.handle_message(Message("declined"), DEFAULT_PRIORITY)
    dispatcher.handle_message(Message("stray"), DEFAULT_PRIORITY)

    declined, stray = store.messages()
    assert (declined.exceptions, declined.exception) == ((), None)
    assert "returned False" in declined.failed_reason
    assert (stray.exceptions, stray.exception) == ((), None)
    assert stray.failed_reason == "no handler is registered for its type"
    body = json.loads(FailedMessageSerializer().serialize(stray))["message"]
    assert "failed_exceptions" not in body


def test_each_handler_that_raised_keeps_its_own_exception_in_the_order_they_ran(
    driver: MemoryDriver, store: FailedStore
) -> None:
    dispatcher = Dispatcher(driver, failed=store)
    dispatcher.register_handlers("bill", [Billing(), Declines(), Records()])
    dispatcher.register_handler("bill", charge_card)

    dispatcher.handle_message(Message("bill", {"order": 3}, retries=1), DEFAULT_PRIORITY)

    (kept,) = store.messages()
    assert [(e.exception_class, e.message) for e in kept.exceptions] == [
        (f"{__name__}.CardDeclined", "card declined for order 3"),
        ("builtins.RuntimeError", "card declined"),
    ]
    assert kept.exceptions[0].handler == "Billing"
    assert kept.exceptions[1].handler.endswith("charge_card")
    assert kept.failed_reason.count(";") == 2, "the reason still names all three failures"


def test_a_password_in_the_exception_message_is_redacted_in_the_message_and_the_traceback(
    driver: MemoryDriver, store: FailedStore, store_driver: MemoryDriver
) -> None:
    def connect_to_billing(message: Message) -> None:
        raise ConnectionError("cannot reach postgresql://billing:hunter2@db:5432/app?sslmode=off")

    dispatcher = Dispatcher(driver, failed=store).register_handler("bill", connect_to_billing)

    dispatcher.handle_message(Message("bill"), DEFAULT_PRIORITY)

    (kept,) = store.messages()
    assert kept.exception is not None
    assert kept.exception.message == "cannot reach postgresql://billing:***@db:5432/app?sslmode=off"
    assert "postgresql://billing:***@db" in kept.exception.traceback
    bodies = [str(body) for _, body in MemoryBrowser(store_driver).entries()]
    assert bodies and not any("hunter2" in body for body in bodies)


# Two functions calling each other: Python folds a run of identical frames into one line.
def ping(depth: int) -> None:
    if depth == 0:
        raise RecursionError("too deep")
    pong(depth - 1)


def pong(depth: int) -> None:
    ping(depth - 1)


def test_an_over_long_traceback_keeps_its_innermost_frames_and_says_how_much_was_cut() -> None:
    try:
        ping(400)
    except RecursionError as exc:
        record = ExceptionRecord.of(exc)

    assert len(record.traceback) <= MAX_TRACEBACK_CHARS
    first, *rest = record.traceback.splitlines()
    assert re.fullmatch(r"\[\.\.\. [\d,]+ characters of the outermost frames cut\]", first)
    assert int(re.sub(r"\D", "", first)) > 0
    assert rest[0].startswith("  File "), "the cut starts at a whole line"
    assert rest[-1] == "RecursionError: too deep"
    assert "in ping" in rest[-3] or "in ping" in rest[-4]


def test_an_over_long_exception_message_keeps_its_start_and_says_how_much_was_cut() -> None:
    record = ExceptionRecord.of(ValueError("x" * 10_000))

    assert len(record.message) <= MAX_EXCEPTION_MESSAGE_CHARS
    assert record.message.startswith("x" * 1000)
    assert re.search(r" \[\.\.\. [\d,]+ characters cut\]$", record.message)


def test_an_exception_whose_str_raises_is_still_kept() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no")

    try:
        raise Unprintable()
    except Unprintable as exc:
        record = ExceptionRecord.of(exc)

    assert record.exception_class.endswith(".Unprintable")
    assert record.message == "<str() of the exception raised ValueError>"
    assert "Traceback (most recent call last)" in record.traceback


def test_the_exceptions_go_through_the_envelope_and_back() -> None:
    try:
        raise_card_declined()
    except RuntimeError as exc:
        record = ExceptionRecord.of(exc, "Billing")
    failed = FailedMessage.of(Message("bill"), "Billing: gave up", 1.0, [record])

    text = FailedMessageSerializer().serialize(failed)

    [stored] = json.loads(text)["message"]["failed_exceptions"]
    assert stored["class"] == "builtins.RuntimeError"
    assert stored["message"] == "card declined"
    assert stored["handler"] == "Billing"
    assert FailedMessageSerializer().unserialize(text) == failed


def test_an_entry_stored_before_exceptions_were_recorded_still_reads() -> None:
    old = (
        '{"message":{"id":"a1b2","type":"bill","payload":{"order":7},"created":1700000000.0,'
        '"execute_at":null,"retries":25,"failed_reason":"Billing: gave up after 25 retries",'
        '"failed_at":1700000100.5}}'
    )

    read = FailedMessageSerializer().unserialize(old)

    assert (read.id, read.type, read.payload, read.retries) == ("a1b2", "bill", {"order": 7}, 25)
    assert read.failed_reason == "Billing: gave up after 25 retries"
    assert read.failed_at == 1700000100.5
    assert (read.exceptions, read.exception) == ((), None)


def test_exceptions_that_are_not_records_are_skipped_when_reading() -> None:
    body = {
        "id": "c3",
        "type": "bill",
        "payload": None,
        "created": 1.0,
        "retries": 0,
        "failed_reason": "x",
        "failed_at": 2.0,
        "failed_exceptions": [
            "not an object",
            {"message": "no class"},
            {"class": "builtins.KeyError", "message": 7},
        ],
    }

    read = FailedMessageSerializer().unserialize(json.dumps({"message": body}))

    assert read.exceptions == (ExceptionRecord("builtins.KeyError", "", "", ""),)


def test_a_time_limit_hermes_raised_keeps_its_whole_traceback(
    driver: MemoryDriver, store: FailedStore
) -> None:
    import time

    def slow(message: Message) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # short sleeps: the time limit interrupts between
            time.sleep(0.01)

    dispatcher = Dispatcher(driver, failed=store, time_limit_s=0.05)
    dispatcher.register_handler("slow", slow)

    dispatcher.handle_message(Message("slow"), DEFAULT_PRIORITY)

    (kept,) = store.messages()
    assert kept.exception is not None
    assert kept.exception.exception_class.endswith(".TimeLimitExceeded")
    assert "timed out after 0.05 s" in kept.exception.message
    assert "Traceback (most recent call last):" in kept.exception.traceback
    # Raised by Hermes, not in the handler: the Dispatcher's own frames are kept.
    assert "_dispatcher.py" in kept.exception.traceback, "no frame of its own: kept whole"


# Where a retry goes ---------------------------------------------------------------------


def test_a_message_given_up_on_priority_300_is_kept_with_it_and_retried_there(
    driver: MemoryDriver, store: FailedStore
) -> None:
    driver.setup_priority_queue("urgent", 300)
    message = Message("mail", {"to": "ana"}, retries=25)
    Dispatcher(driver, failed=store).register_handler("mail", Flaky()).handle_message(message, 300)
    (kept,) = store.messages()
    assert (kept.priority, kept.retry_priority) == (300, 300)

    store.retry(driver)

    (row,) = [r for r in driver.queue_stats() if r.ready]
    assert row.priority == 300  # not the default queue, where no urgent worker reads


def test_the_priority_goes_through_the_envelope_and_an_older_entry_retries_to_the_default() -> None:
    serializer = FailedMessageSerializer()
    kept = FailedMessage.of(Message("mail"), "gave up", priority=300)
    assert serializer.unserialize(serializer.serialize(kept)).priority == 300
    older = json.loads(serializer.serialize(kept))
    del older["message"]["failed_priority"]
    read = serializer.unserialize(json.dumps(older))
    assert (read.priority, read.retry_priority) == (None, DEFAULT_PRIORITY)
    odd = json.loads(serializer.serialize(kept))
    odd["message"]["failed_priority"] = "300"  # not ours: read as unknown
    assert serializer.unserialize(json.dumps(odd)).priority is None
