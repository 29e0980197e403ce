"""The Dispatcher calls every handler of a message's type and keeps going."""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import time
from collections.abc import Sequence
from typing import Any

import pytest

from hermes.core import (
    DEFAULT_PRIORITY,
    BrokerUnavailableError,
    ConfigurationError,
    DriverError,
    Emitter,
    Message,
    RetryableHandler,
    RetryMixin,
    SharedFileShutdown,
    compat,
)
from hermes.core.app._dispatcher import readable_time
from hermes.core.compat import Dispatcher
from hermes.core.driver import Delay
from hermes.core.drivertools import MemoryDriver
from hermes.core.run._worker import NOTICE
from hermes.core.testing import scheduled


class Recorder:
    """A handler that appends ``(name, message.id)`` to a shared list and returns ``result``."""

    def __init__(self, calls: list[tuple[str, str]], name: str, result: bool = True) -> None:
        self.calls, self.name, self.result = calls, name, result

    def handle(self, message: Message) -> bool:
        self.calls.append((self.name, message.id))
        return self.result


class Raises:
    def __init__(self, calls: list[tuple[str, str]], name: str, error: BaseException) -> None:
        self.calls, self.name, self.error = calls, name, error

    def handle(self, message: Message) -> bool:
        self.calls.append((self.name, message.id))
        raise self.error


def messages(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[str]:
    return [r.getMessage() for r in caplog.records if level is None or r.levelno == level]


# Registration ------------------------------------------------------------------


def test_every_registration_method_returns_the_dispatcher(driver: MemoryDriver) -> None:
    dispatcher = Dispatcher(driver)
    handler = Recorder([], "a")

    assert dispatcher.register_handler("job", handler) is dispatcher
    assert dispatcher.register_handlers("job", [handler]) is dispatcher
    assert dispatcher.unregister_handler("job", handler) is dispatcher
    assert dispatcher.unregister_all_handlers() is dispatcher


def test_unregister_handler_removes_that_object_only(driver: MemoryDriver) -> None:
    calls: list[tuple[str, str]] = []
    first, equal_twin, other = Recorder(calls, "a"), Recorder(calls, "a"), Recorder(calls, "b")
    dispatcher = Dispatcher(driver).register_handlers("job", [first, equal_twin, other])

    dispatcher.unregister_handler("job", first)

    assert dispatcher.handlers("job") == [equal_twin, other]


def test_unregistering_an_unknown_handler_is_harmless(driver: MemoryDriver) -> None:
    dispatcher = Dispatcher(driver).register_handler("job", Recorder([], "a"))

    dispatcher.unregister_handler("job", Recorder([], "a")).unregister_handler("nope", object())  # type: ignore[arg-type]

    assert len(dispatcher.handlers("job")) == 1


def test_registered_lists_every_type_with_handlers_in_registration_order(
    driver: MemoryDriver,
) -> None:
    a, b, c = Recorder([], "a"), Recorder([], "b"), Recorder([], "c")
    dispatcher = Dispatcher(driver).register_handler("second", a).register_handler("first", b)
    dispatcher.register_handler("second", c).register_handler("gone", a)

    dispatcher.unregister_handler("gone", a)

    assert dispatcher.registered() == {"second": [a, c], "first": [b]}
    assert list(dispatcher.registered()) == ["second", "first"]


def test_unregister_all_handlers_leaves_none(driver: MemoryDriver) -> None:
    dispatcher = Dispatcher(driver).register_handler("a", Recorder([], "a"))
    dispatcher.register_handler("b", Recorder([], "b"))

    dispatcher.unregister_all_handlers()

    assert dispatcher.handlers("a") == dispatcher.handlers("b") == []


def test_an_object_without_handle_cannot_be_registered(driver: MemoryDriver) -> None:
    with pytest.raises(ConfigurationError, match="handle"):
        Dispatcher(driver).register_handler("job", object())  # type: ignore[arg-type]


# Handling a message --------------------------------------------------------------


def test_every_handler_is_called_in_registration_order_even_after_one_raised(
    driver: MemoryDriver,
) -> None:
    calls: list[tuple[str, str]] = []
    message = Message("job")
    dispatcher = Dispatcher(driver).register_handlers(
        "job",
        [
            Recorder(calls, "first"),
            Raises(calls, "second", RuntimeError("boom")),
            Recorder(calls, "third", result=False),
            Recorder(calls, "fourth"),
        ],
    )

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    assert calls == [(name, message.id) for name in ("first", "second", "third", "fourth")]


@pytest.mark.parametrize(
    ("results", "expected"),
    [((True, True), True), ((True, False), False), ((False, True), False), ((), None)],
)
def test_the_result_is_the_and_of_every_handler_s_result(
    driver: MemoryDriver, results: Sequence[bool], expected: bool | None
) -> None:
    calls: list[tuple[str, str]] = []
    dispatcher = Dispatcher(driver).register_handlers(
        "job", [Recorder(calls, str(i), result) for i, result in enumerate(results)]
    )

    result = dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    assert result is (False if expected is None else expected)  # no handler: False
    assert len(calls) == len(results)


def test_a_handler_that_raises_makes_the_result_false(driver: MemoryDriver) -> None:
    dispatcher = Dispatcher(driver).register_handler("job", Raises([], "x", ValueError("bad")))

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is False


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3)])
def test_a_base_exception_from_a_handler_propagates_and_stops_the_rest(
    driver: MemoryDriver, error: BaseException
) -> None:
    calls: list[tuple[str, str]] = []
    dispatcher = Dispatcher(driver).register_handlers(
        "job", [Raises(calls, "raises", error), Recorder(calls, "after")]
    )

    with pytest.raises(type(error)):
        dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    assert [name for name, _ in calls] == ["raises"]


def test_a_keyboard_interrupt_in_a_handler_ends_handle_and_keeps_the_message(
    driver: MemoryDriver, peek: Any
) -> None:
    message = Message("job")
    Emitter(driver).emit(message)
    compat.set_max_process_items(driver, 1)  # a backstop: a swallowed interrupt must fail, not hang
    dispatcher = Dispatcher(driver).register_handler("job", Raises([], "x", KeyboardInterrupt()))

    with pytest.raises(KeyboardInterrupt):
        dispatcher.handle()

    assert [m.id for m in peek.queued(driver)] == [message.id]


def test_a_message_without_handlers_is_dropped_with_one_error_line(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture, peek: Any
) -> None:
    message = Message("unknown-type")
    Emitter(driver).emit(message)
    compat.set_max_process_items(driver, 1)

    Dispatcher(driver).handle()

    assert messages(hermes_log, logging.ERROR) == [
        f"No handlers registered for message #{message.id} (unknown-type); dropped"
    ]
    assert messages(hermes_log, logging.WARNING) == []
    assert peek.total(driver) == 0


def test_explain_unhandled_ends_the_no_handler_line_and_a_failing_one_is_named(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    dispatcher = Dispatcher(driver)
    dispatcher.explain_unhandled = lambda message, priority: f"why {message.type}@{priority}"
    first, second = Message("stray"), Message("stray")

    dispatcher.handle_message(first, 200)

    def broken(message: Message, priority: int) -> str:
        raise RuntimeError("no idea")

    dispatcher.explain_unhandled = broken
    dispatcher.handle_message(second, 100)

    assert messages(hermes_log, logging.ERROR) == [
        f"No handlers registered for message #{first.id} (stray); dropped - why stray@200",
        f"No handlers registered for message #{second.id} (stray); dropped "
        "(explain_unhandled raised RuntimeError: no idea)",
    ]


def test_stats_count_received_handled_failed_and_retried(driver: MemoryDriver) -> None:
    dispatcher = Dispatcher(driver).register_handlers(
        "job", [Recorder([], "ok"), Recorder([], "no", result=False)]
    )
    dispatcher.register_handler("boom", Raises([], "boom", RuntimeError("x")))

    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)
    dispatcher.handle_message(Message("boom"), DEFAULT_PRIORITY)
    dispatcher.handle_message(Message("nobody"), DEFAULT_PRIORITY)

    stats = dispatcher.stats
    assert (stats.received, stats.handled, stats.failed, stats.retried) == (3, 1, 3, 0)
    assert (stats.gave_up, stats.stored) == (3, 0)


# handle() -------------------------------------------------------------------------


def test_handle_passes_each_message_with_its_priority_to_the_handlers(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    driver.setup_priority_queue("high", 300)
    emitter = Emitter(driver)
    low, high = Message("job", {"n": 1}), Message("job", {"n": 2})
    emitter.emit(low).emit(high, 300)
    calls: list[tuple[str, str]] = []
    compat.set_max_process_items(driver, 2)

    Dispatcher(driver).register_handler("job", Recorder(calls, "h")).handle()

    assert calls == [("h", high.id), ("h", low.id)]
    starts = [m for m in messages(hermes_log) if m.startswith("Start handle")]
    assert starts == [
        f"Start handle message #{high.id} (job) priority:300",
        f"Start handle message #{low.id} (job) priority:100",
    ]


def test_handle_reads_only_the_priorities_it_is_given(driver: MemoryDriver, peek: Any) -> None:
    driver.setup_priority_queue("high", 300)
    low, high = Message("job"), Message("job")
    Emitter(driver).emit(high, 300).emit(low)
    calls: list[tuple[str, str]] = []
    compat.set_max_process_items(driver, 1)

    Dispatcher(driver).register_handler("job", Recorder(calls, "h")).handle([DEFAULT_PRIORITY])

    assert calls == [("h", low.id)]
    assert [m.id for m in peek.queued(driver, 300)] == [high.id]


def test_a_driver_error_other_than_an_outage_is_logged_and_raised_by_handle(
    broker_name: str, hermes_log: pytest.LogCaptureFixture
) -> None:
    class Corrupt(MemoryDriver):
        def consumer(self, priorities: Any, *, concurrency: int = 1) -> Any:
            raise DriverError("the queue's index is corrupt on memory://nowhere")

    with pytest.raises(DriverError, match="index is corrupt"):
        Dispatcher(Corrupt(broker_name)).handle()

    (record,) = [r for r in hermes_log.records if r.levelno == logging.ERROR]
    assert "MemoryDriver memory://" in record.getMessage()
    assert "index is corrupt on memory://nowhere" in record.getMessage()
    assert record.exc_info is not None


def test_handle_returns_at_once_when_shutdown_was_requested_after_the_start(
    driver: MemoryDriver, tmp_path: Any, hermes_log: pytest.LogCaptureFixture
) -> None:
    shutdown = SharedFileShutdown(tmp_path / "stop")
    calls: list[tuple[str, str]] = []

    class StopsTheWorker(Recorder):
        def handle(self, message: Message) -> bool:
            shutdown.shutdown()
            return super().handle(message)

    first, second = Message("job"), Message("job")
    Emitter(driver).emit(first).emit(second)
    compat.set_max_process_items(driver, 2)  # a backstop: a shutdown ignored must fail, not hang
    dispatcher = Dispatcher(driver, shutdown=shutdown)

    dispatcher.register_handler("job", StopsTheWorker(calls, "h")).handle()

    assert calls == [("h", first.id)]
    assert (NOTICE, "Exiting hermes dispatcher - shutdown") in [
        (r.levelno, r.getMessage()) for r in hermes_log.records
    ]


def test_a_shutdown_set_on_the_driver_itself_is_honoured_and_kept(
    driver: MemoryDriver, tmp_path: Any
) -> None:
    shutdown = SharedFileShutdown(tmp_path / "stop")
    compat.set_shutdown(driver, shutdown)
    calls: list[tuple[str, str]] = []

    class StopsTheWorker(Recorder):
        def handle(self, message: Message) -> bool:
            shutdown.shutdown()
            return super().handle(message)

    Emitter(driver).emit(Message("job")).emit(Message("job"))
    compat.set_max_process_items(driver, 2)  # a backstop: a shutdown ignored must fail, not hang

    Dispatcher(driver).register_handler("job", StopsTheWorker(calls, "h")).handle()

    assert len(calls) == 1
    assert driver.__dict__["_php_settings"].shutdown is shutdown  # kept for the next run


def test_handle_returns_after_max_items_without_the_shutdown_notice(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture, peek: Any
) -> None:
    for n in range(3):
        Emitter(driver).emit(Message("job", {"n": n}))
    compat.set_max_process_items(driver, 2)
    calls: list[tuple[str, str]] = []

    Dispatcher(driver).register_handler("job", Recorder(calls, "h")).handle()

    assert len(calls) == 2
    assert len(peek.queued(driver)) == 1
    assert "Exiting hermes dispatcher - shutdown" not in messages(hermes_log)


# Logging ---------------------------------------------------------------------------


def test_the_default_logger_is_named_hermes(driver: MemoryDriver) -> None:
    assert Dispatcher(driver).logger.name == "hermes"


def test_a_given_logger_is_used(driver: MemoryDriver, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="my.app")
    dispatcher = Dispatcher(driver, logging.getLogger("my.app"))
    dispatcher.register_handler("job", Recorder([], "h"))

    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    assert {r.name for r in caplog.records} == {"my.app"}


def test_a_handled_message_logs_start_and_end(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    message = Message("mail")
    dispatcher = Dispatcher(driver).register_handler("mail", Recorder([], "h"))

    dispatcher.handle_message(message, 300)

    assert [(r.levelno, r.getMessage()) for r in hermes_log.records] == [
        (logging.INFO, f"Start handle message #{message.id} (mail) priority:300"),
        (logging.INFO, f"End handle message #{message.id} (mail)"),
    ]


def test_without_log_each_message_failures_and_retries_are_still_logged(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    class Flaky(RetryMixin, RetryableHandler):
        def handle(self, message: Message) -> bool:
            raise ValueError("no SMTP")

    dispatcher = Dispatcher(driver).register_handler("mail", Recorder([], "h"))
    dispatcher.register_handler("job", Flaky())
    dispatcher.log_each_message = False

    dispatcher.handle_message(Message("mail"), 300)
    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    assert not any("handle message" in m for m in messages(hermes_log))
    [error, retry] = hermes_log.records
    assert error.levelno == logging.ERROR
    assert retry.levelno == logging.WARNING
    assert "failed in Flaky, retry 1 of 25" in retry.getMessage()
    assert (dispatcher.stats.handled, dispatcher.stats.retried) == (1, 1)


def test_a_function_that_raises_without_max_retry_is_told_to_use_max_retry(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    dispatcher = Dispatcher(driver)

    @dispatcher.handler("job")
    def send_email(message: Message) -> None:
        raise ValueError("no SMTP")

    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    outcome = [r for r in hermes_log.records if r.levelno == logging.ERROR][-1].getMessage()
    assert "RetryMixin" not in outcome
    assert outcome.endswith(
        "not retried: the function has no max_retry (give it one, "
        "@handler('job', max_retry=25), to retry it when it raises)"
    )


def test_a_handler_exception_is_logged_as_error_with_the_class_text_and_traceback(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    dispatcher = Dispatcher(driver).register_handler("job", Raises([], "x", ValueError("no SMTP")))

    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    record, outcome = [r for r in hermes_log.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "Handler Raises throws exception - no SMTP"
    assert outcome.getMessage().endswith(
        "not retried: Raises is not a RetryableHandler "
        "(subclass RetryableHandler with RetryMixin to retry it when it raises)"
    )
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)
    assert not any(m.startswith("End handle") for m in messages(hermes_log))


def test_the_finished_hook_sees_each_message_once_with_its_outcome(driver: MemoryDriver) -> None:
    from hermes.core import hookimpl
    from hermes.core.spi._registry import plugin_manager

    seen: list[tuple[str, bool]] = []

    class Observer:
        @hookimpl
        def hermes_message_finished(self, message: Message, priority: int, result: bool) -> None:
            seen.append((message.payload["n"], result))

    observer = Observer()
    plugin_manager().register(observer)
    try:
        calls: list[tuple[str, str]] = []
        for n in ("ok", "refused", "orphan"):
            driver.send(Message(n, {"n": n}))
        dispatcher = Dispatcher(driver)
        dispatcher.register_handler("ok", Recorder(calls, "a"))
        dispatcher.register_handler("refused", Recorder(calls, "b", result=False))
        for _ in range(3):
            compat.set_max_process_items(driver, 1)
            dispatcher.handle()
    finally:
        plugin_manager().unregister(observer)
    assert seen == [("ok", True), ("refused", False), ("orphan", False)]


# How each message ends: one line, at its level, naming the message ----------------


class Flaky(RetryMixin, RetryableHandler):
    def handle(self, message: Message) -> bool:
        raise RuntimeError("SMTP down")


class Picky(Flaky):
    def can_retry(self, message: Message, exception: Exception) -> bool:
        return False


class Once(Flaky):
    def max_retry(self) -> int:
        return 0


class Declines:
    def handle(self, message: Message) -> bool:
        return False


class Plain:
    def handle(self, message: Message) -> bool:
        raise RuntimeError("SMTP down")


def outcome_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """The records after ``Start handle``, without the ``throws exception`` ones."""
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if not r.getMessage().startswith(("Start handle", "Handler "))
    ]


@pytest.mark.parametrize(
    ("handler", "retries", "reason"),
    [
        (Declines(), 0, "it returned False (a handler that returns False is never retried)"),
        (
            Plain(),
            0,
            "Plain is not a RetryableHandler "
            "(subclass RetryableHandler with RetryMixin to retry it when it raises)",
        ),
        (Picky(), 0, "can_retry() said no"),
        (Flaky(), 25, "gave up after 25 retries"),
        (Flaky(), 30, "gave up after 30 retries (max_retry() is 25)"),
        (Once(), 0, "retries are off (max_retry() is 0)"),
    ],
    ids=["returned-false", "not-retryable", "can-retry-no", "used-up", "over-the-limit", "off"],
)
def test_a_failure_that_is_not_retried_is_one_error_line_with_the_reason(
    driver: MemoryDriver,
    hermes_log: pytest.LogCaptureFixture,
    handler: Any,
    retries: int,
    reason: str,
) -> None:
    message = Message("mail", retries=retries)
    dispatcher = Dispatcher(driver).register_handler("mail", handler)

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    name = type(handler).__name__
    assert outcome_lines(hermes_log) == [
        (logging.ERROR, f"Message #{message.id} (mail) failed in {name}, not retried: {reason}")
    ]
    assert (dispatcher.stats.gave_up, dispatcher.stats.retried) == (1, 0)


def test_a_retried_failure_is_one_warning_saying_which_retry_and_when_it_is_due(
    recording_driver: Any, hermes_log: pytest.LogCaptureFixture
) -> None:
    message = Message("mail", retries=2)
    dispatcher = Dispatcher(recording_driver, randomizer=random.Random(42))
    dispatcher.register_handler("mail", Flaky())

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    ((level, text),) = outcome_lines(hermes_log)
    (retry,) = recording_driver.sent
    assert level == logging.WARNING
    match = re.fullmatch(
        rf"Message #{message.id} \(mail\) failed in Flaky, retry 3 of 25 "
        r"in (\d+\.\d) s at (.+)",
        text,
    )
    assert match is not None, text
    assert abs(float(match[1]) - (retry.execute_at - time.time())) < 5
    assert match[2] == readable_time(retry.execute_at)


def test_a_handled_message_ends_in_one_info_line_and_no_other(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    message = Message("mail")
    Dispatcher(driver).register_handler("mail", Recorder([], "h")).handle_message(message, 100)

    assert outcome_lines(hermes_log) == [(logging.INFO, f"End handle message #{message.id} (mail)")]


def test_each_handler_of_a_message_says_how_it_ended(
    recording_driver: Any, hermes_log: pytest.LogCaptureFixture
) -> None:
    message = Message("mail")
    dispatcher = Dispatcher(recording_driver).register_handlers(
        "mail", [Recorder([], "ok"), Flaky(), Declines()]
    )

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    levels = [level for level, _ in outcome_lines(hermes_log)]
    assert levels == [logging.INFO, logging.WARNING, logging.ERROR]
    stats = dispatcher.stats
    assert (stats.handled, stats.failed, stats.retried, stats.gave_up) == (1, 2, 1, 1)


class Unavailable(MemoryDriver):
    """A memory driver whose broker is away for its first ``failures`` sends."""

    def __init__(self, name: str, failures: int) -> None:
        super().__init__(name)
        self.failures = failures
        self.attempts = 0

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise BrokerUnavailableError("memory://nowhere refused")
        super().send(message, priority)


def test_a_retry_that_cannot_be_sent_is_logged_with_the_message_and_raised(
    broker_name: str, hermes_log: pytest.LogCaptureFixture
) -> None:
    driver = Unavailable(broker_name, failures=1000)
    message = Message("mail")
    dispatcher = Dispatcher(driver).register_handler("mail", Flaky())
    dispatcher.retry_send_waits_s = (0.01, 0.01)

    with pytest.raises(BrokerUnavailableError):
        dispatcher.handle_message(message, DEFAULT_PRIORITY)

    assert driver.attempts == 3
    lines = outcome_lines(hermes_log)
    assert [level for level, _ in lines] == [logging.WARNING, logging.WARNING, logging.ERROR]
    assert lines[-1][1] == (
        f"Message #{message.id} (mail) failed in Flaky and its retry copy could not be "
        "sent after 3 attempts - memory://nowhere refused"
    )


def test_a_retry_copy_is_sent_once_a_briefly_unavailable_broker_is_back(
    broker_name: str, hermes_log: pytest.LogCaptureFixture
) -> None:
    driver = Unavailable(broker_name, failures=2)
    message = Message("mail")
    dispatcher = Dispatcher(driver).register_handler("mail", Flaky())
    dispatcher.retry_send_waits_s = (0.01, 0.01, 0.01)

    assert dispatcher.handle_message(message, DEFAULT_PRIORITY) is False

    assert driver.attempts == 3
    assert dispatcher.stats.retried == 1
    [copy] = scheduled(driver)
    assert (copy.id, copy.retries) == (message.id, 1)
    warnings = [text for level, text in outcome_lines(hermes_log) if level == logging.WARNING]
    assert warnings[0].startswith(
        f"Message #{message.id} (mail): its retry copy could not be sent (attempt 1), "
        "trying again in "
    )
    assert "retry 1 of 25" in warnings[-1]


def test_a_retry_copy_the_broker_refuses_is_not_sent_again(broker_name: str) -> None:
    class Refuses(MemoryDriver):
        attempts = 0

        def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
            self.attempts += 1
            raise DriverError("memory://nowhere: the queue's index is corrupt")

    driver = Refuses(broker_name)
    dispatcher = Dispatcher(driver).register_handler("mail", Flaky())
    dispatcher.retry_send_waits_s = (0.01, 0.01)

    with pytest.raises(DriverError, match="index is corrupt"):
        dispatcher.handle_message(Message("mail"), DEFAULT_PRIORITY)
    assert driver.attempts == 1


def test_a_due_time_on_another_day_shows_its_date() -> None:
    today = time.time()
    in_three_days = today + 3 * 86400

    assert re.fullmatch(r"\d\d:\d\d:\d\d", readable_time(today))
    assert readable_time(in_three_days) == time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(in_three_days)
    )


def test_at_debug_each_handler_call_says_how_it_ended_and_how_long_it_took(
    driver: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="hermes")
    message = Message("mail")
    dispatcher = Dispatcher(driver).register_handlers("mail", [Recorder([], "ok"), Plain()])

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert [re.sub(r"after \d+\.\d ms$", "after N ms", line) for line in debug] == [
        f"Handler Recorder returned True on message #{message.id} (mail) after N ms",
        f"Handler Plain raised RuntimeError on message #{message.id} (mail) after N ms",
    ]


# When a retry runs: the driver's delay, and a handler's own backoff --------------------


class _DeliversAtOnce(MemoryDriver):
    """A memory broker that declares what RabbitMQ does by default: execute_at ignored."""

    capabilities = dataclasses.replace(MemoryDriver.capabilities, delay=Delay.IGNORED)


def test_a_retry_on_a_driver_that_ignores_delay_says_it_runs_at_once(
    broker_name: str, hermes_log: pytest.LogCaptureFixture
) -> None:
    dispatcher = Dispatcher(_DeliversAtOnce(broker_name)).register_handler("job", Flaky())

    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    [retry] = [r.getMessage() for r in hermes_log.records if r.levelno == logging.WARNING]
    assert "failed in Flaky, retry 1 of 25 at once:" in retry
    assert "delivers at once (delay ignored)" in retry
    assert " in 1" not in retry and " in 2" not in retry and " in 3" not in retry


def test_a_function_handler_chooses_its_own_backoff_from_the_retry_number(
    recording_driver: Any,
) -> None:
    dispatcher = Dispatcher(recording_driver)
    numbers: list[int] = []

    def backoff(retry: int) -> float:
        numbers.append(retry)
        return 2.0**retry

    @dispatcher.handler("job", max_retry=5, backoff=backoff)
    def charge(message: Message) -> None:
        raise RuntimeError("card service down")

    before = time.time()
    dispatcher.handle_message(Message("job", retries=2), DEFAULT_PRIORITY)

    [copy] = recording_driver.sent
    assert numbers == [3]  # the copy is the third retry
    assert copy.retries == 3
    assert before + 8 <= copy.execute_at <= time.time() + 8


def test_a_class_handler_chooses_its_own_backoff_with_a_method(recording_driver: Any) -> None:
    class Quick(RetryMixin, RetryableHandler):
        def handle(self, message: Message) -> bool:
            raise RuntimeError("busy")

        def backoff(self, retry: int) -> float:
            return 0.5

    Dispatcher(recording_driver).register_handler("job", Quick()).handle_message(
        Message("job"), DEFAULT_PRIORITY
    )

    [copy] = recording_driver.sent
    assert copy.execute_at <= time.time() + 0.5


def test_without_a_backoff_the_retry_keeps_the_sidekiq_formula(recording_driver: Any) -> None:
    before = time.time()
    Dispatcher(recording_driver).register_handler("job", Flaky()).handle_message(
        Message("job"), DEFAULT_PRIORITY
    )

    [copy] = recording_driver.sent
    assert before + 16 <= copy.execute_at <= time.time() + 45


def test_a_backoff_that_raises_is_logged_and_the_formula_is_used(
    recording_driver: Any, hermes_log: pytest.LogCaptureFixture
) -> None:
    class Broken(Flaky):
        def backoff(self, retry: int) -> float:
            raise ZeroDivisionError("oops")

    before = time.time()
    Dispatcher(recording_driver).register_handler("job", Broken()).handle_message(
        Message("job"), DEFAULT_PRIORITY
    )

    [copy] = recording_driver.sent
    assert before + 16 <= copy.execute_at <= time.time() + 45
    assert any("backoff raised ZeroDivisionError: oops" in m for m in hermes_log.messages)
