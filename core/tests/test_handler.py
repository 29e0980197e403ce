"""Plain functions as handlers: registered, decorated, collected in a registry, and retried."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from typing import Any

import pytest

from hermes.core import (
    DEFAULT_PRIORITY,
    ConfigurationError,
    Dispatcher,
    HandlerRegistry,
    Message,
    RetryableHandler,
)
from hermes.core.app._handler import FunctionHandler, RetryableFunctionHandler
from hermes.core.app._retry import next_retry
from hermes.core.drivertools import MemoryDriver
from hermes.core.model._errors import HandlerResultError


def retry_copies(driver: Any) -> list[Message]:
    """What the dispatcher sent: every ``send`` without a priority (the test sends none)."""
    return [message for message, args, kwargs in driver.calls if (args, kwargs) == ((), {})]


class Calls:
    """Functions to register, each recording the messages it was called with."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Message]] = []
        self.can_retry_calls: list[tuple[Message, Exception]] = []

    def ok(self, message: Message) -> None:
        self.seen.append(("ok", message))

    def true(self, message: Message) -> bool:
        self.seen.append(("true", message))
        return True

    def false(self, message: Message) -> bool:
        self.seen.append(("false", message))
        return False

    def fails(self, message: Message) -> None:
        self.seen.append(("fails", message))
        raise RuntimeError("mail server down")

    def can_retry(self, answer: bool) -> Any:
        def can_retry(message: Message, exception: Exception) -> bool:
            self.can_retry_calls.append((message, exception))
            return answer

        return can_retry


@pytest.fixture
def calls() -> Calls:
    return Calls()


# A function registered with register_handler -------------------------------------


def test_a_function_that_returns_none_is_called_with_the_message_and_succeeds(
    driver: MemoryDriver, calls: Calls
) -> None:
    dispatcher = Dispatcher(driver).register_handler("send-email", calls.ok)
    message = Message("send-email", {"to": "ana@example.com"})

    assert dispatcher.handle_message(message, DEFAULT_PRIORITY) is True

    assert calls.seen == [("ok", message)]
    assert dispatcher.stats.handled == 1


def test_a_function_s_true_and_false_are_its_result(driver: MemoryDriver, calls: Calls) -> None:
    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("yes", calls.true).register_handler("no", calls.false)

    assert dispatcher.handle_message(Message("yes"), DEFAULT_PRIORITY) is True
    assert dispatcher.handle_message(Message("no"), DEFAULT_PRIORITY) is False
    assert (dispatcher.stats.handled, dispatcher.stats.failed) == (1, 1)


def test_functions_and_handler_objects_run_together_in_registration_order(
    driver: MemoryDriver, calls: Calls
) -> None:
    class Obj:
        def handle(self, message: Message) -> bool:
            calls.seen.append(("object", message))
            return True

    dispatcher = Dispatcher(driver).register_handlers("job", [calls.fails, Obj(), calls.ok])

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is False

    assert [name for name, _ in calls.seen] == ["fails", "object", "ok"]


def test_a_registered_function_becomes_a_function_handler_that_names_it(
    driver: MemoryDriver, calls: Calls
) -> None:
    dispatcher = Dispatcher(driver).register_handler("job", calls.ok)

    (handler,) = dispatcher.handlers("job")

    assert isinstance(handler, FunctionHandler)
    assert handler.function == calls.ok
    assert handler.name == f"{__name__}.Calls.ok"
    assert not isinstance(handler, RetryableHandler)


def test_a_plain_function_that_raises_is_not_retried(recording_driver: Any, calls: Calls) -> None:
    dispatcher = Dispatcher(recording_driver).register_handler("job", calls.fails)

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is False

    assert recording_driver.calls == []
    assert dispatcher.stats.failed == 1


def test_a_function_can_be_unregistered_by_the_function_itself(
    driver: MemoryDriver, calls: Calls
) -> None:
    dispatcher = Dispatcher(driver).register_handler("job", calls.ok)
    dispatcher.register_handler("job", calls.true)

    dispatcher.unregister_handler("job", calls.ok)

    assert [h.function for h in dispatcher.handlers("job")] == [calls.true]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("result", "shown"),
    [(1, "returned int 1"), ({"sent": True}, "returned dict {'sent': True}"), ("", "str ''")],
)
def test_a_result_other_than_none_true_or_false_is_a_logged_failure(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture, result: object, shown: str
) -> None:
    def returns(message: Message) -> Any:
        return result

    dispatcher = Dispatcher(driver).register_handler("job", returns)

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is False

    (record,) = [r for r in hermes_log.records if r.levelname == "ERROR" and r.exc_info]
    assert record.exc_info is not None and isinstance(record.exc_info[1], HandlerResultError)
    text = str(record.exc_info[1])
    assert shown in text
    assert "returns None or True for success, False for failure, or Result(value)" in text


def test_a_coroutine_returned_by_a_function_is_closed_and_counted_as_a_failure(
    driver: MemoryDriver,
) -> None:
    async def later(message: Message) -> None:
        raise AssertionError("never awaited, so never run")

    # A sync function in front of an async def gets past registration; its
    # coroutine must not pass as a success, nor warn "never awaited" later.
    coroutines: list[Any] = []

    def wraps_async(message: Message) -> Any:
        coroutines.append(later(message))
        return coroutines[-1]

    dispatcher = Dispatcher(driver).register_handler("job", wraps_async)

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is False
    assert coroutines[0].cr_frame is None  # closed


# What cannot be registered -----------------------------------------------------------


def test_a_handler_class_instead_of_an_instance_is_refused_with_the_fix(
    driver: MemoryDriver,
) -> None:
    class SendEmail:
        def handle(self, message: Message) -> bool:
            return True

    with pytest.raises(
        ConfigurationError, match=r"is a class: register an instance, .*SendEmail\(\)"
    ):
        Dispatcher(driver).register_handler("job", SendEmail)  # type: ignore[arg-type]


def test_an_async_def_function_is_awaited_on_the_workers_event_loop(
    driver: MemoryDriver,
) -> None:
    sent: list[str] = []

    async def send_email(message: Message) -> None:
        await asyncio.sleep(0)
        sent.append(message.payload["to"])

    async def refuses(message: Message) -> bool:
        return False

    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("job", send_email)
    dispatcher.register_handler("nope", refuses)

    assert dispatcher.handle_message(Message("job", {"to": "ana"}), DEFAULT_PRIORITY) is True
    assert dispatcher.handle_message(Message("nope"), DEFAULT_PRIORITY) is False
    assert sent == ["ana"]


def test_an_async_generator_is_refused_at_registration(driver: MemoryDriver) -> None:
    async def send_email(message: Message):  # type: ignore[no-untyped-def]
        yield True

    with pytest.raises(ConfigurationError, match="is an async generator"):
        Dispatcher(driver).register_handler("job", send_email)


@pytest.mark.parametrize(
    "function",
    [lambda: None, lambda message, extra: None, lambda *, message: None],
    ids=["no argument", "two arguments", "keyword only"],
)
def test_a_function_that_cannot_take_the_message_is_refused_naming_its_signature(
    driver: MemoryDriver, function: Any
) -> None:
    with pytest.raises(ConfigurationError, match=r"must take the message .* signature is \("):
        Dispatcher(driver).register_handler("job", function)


def test_a_function_with_defaults_after_the_message_is_accepted(driver: MemoryDriver) -> None:
    seen: list[str] = []

    def handle(message: Message, mailer: str = "smtp") -> None:
        seen.append(mailer)

    Dispatcher(driver).register_handler("job", handle).handle_message(Message("job"), 100)

    assert seen == ["smtp"]


def test_a_partial_is_a_function_too(driver: MemoryDriver) -> None:
    seen: list[tuple[str, str]] = []

    def notify(channel: str, message: Message) -> None:
        seen.append((channel, message.type))

    dispatcher = Dispatcher(driver).register_handler("job", functools.partial(notify, "sms"))
    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    assert seen == [("sms", "job")]


# The decorator ------------------------------------------------------------------------


def test_the_decorator_registers_the_function_and_returns_it_unchanged(
    driver: MemoryDriver,
) -> None:
    dispatcher = Dispatcher(driver)
    seen: list[Message] = []

    @dispatcher.handler("send-email")
    def send_email(message: Message) -> None:
        seen.append(message)

    message = Message("send-email")
    assert dispatcher.handle_message(message, DEFAULT_PRIORITY) is True
    send_email(message)  # still an ordinary function: callable in a unit test

    assert seen == [message, message]
    (handler,) = dispatcher.handlers("send-email")
    assert type(handler) is FunctionHandler


def test_the_decorator_refuses_a_handler_object_and_a_class(driver: MemoryDriver) -> None:
    class Obj:
        def handle(self, message: Message) -> bool:
            return True

    with pytest.raises(ConfigurationError, match="has a handle\\(\\) method: the decorator takes"):
        Dispatcher(driver).handler("job")(Obj())  # type: ignore[type-var]
    with pytest.raises(ConfigurationError, match="is a class: the decorator takes a function"):
        Dispatcher(driver).handler("job")(Obj)  # type: ignore[type-var]


def test_the_decorator_refuses_a_bad_max_retry(driver: MemoryDriver) -> None:
    dispatcher = Dispatcher(driver)
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ConfigurationError, match=r"max_retry .* must be a whole number >= 0"):
            dispatcher.handler("job", max_retry=bad)(lambda message: None)  # type: ignore[arg-type]
    assert dispatcher.registered() == {}


def test_the_decorator_refuses_a_can_retry_without_message_and_exception(
    driver: MemoryDriver,
) -> None:
    with pytest.raises(ConfigurationError, match=r"can_retry .* must take \(message, exception\)"):
        Dispatcher(driver).handler("job", can_retry=lambda exception: True)(lambda message: None)


# Retried functions: the rules of RetryableHandler, exactly ----------------------------


def test_max_retry_makes_a_retryable_handler_with_that_limit(
    driver: MemoryDriver, calls: Calls
) -> None:
    dispatcher = Dispatcher(driver)
    dispatcher.handler("a", max_retry=7)(calls.fails)
    dispatcher.handler("b", can_retry=calls.can_retry(True))(calls.fails)

    (a,) = dispatcher.handlers("a")
    (b,) = dispatcher.handlers("b")

    assert isinstance(a, RetryableFunctionHandler) and isinstance(a, RetryableHandler)
    assert a.max_retry() == 7
    assert isinstance(b, RetryableFunctionHandler)
    assert b.max_retry() == 25  # as RetryMixin, when only can_retry is given


def test_a_retried_function_with_5_retries_and_max_retry_25_is_published_again_with_6(
    recording_driver: Any, calls: Calls
) -> None:
    dispatcher = Dispatcher(recording_driver)
    dispatcher.handler("job", max_retry=25)(calls.fails)
    original = Message("job", {"to": "ana"}, created=1764480000.5, retries=5)

    assert dispatcher.handle_message(original, DEFAULT_PRIORITY) is False

    (copy,) = retry_copies(recording_driver)
    assert (copy.id, copy.type, copy.payload, copy.created, copy.retries) == (
        original.id,
        "job",
        {"to": "ana"},
        1764480000.5,
        6,
    )
    assert recording_driver.calls[0][1:] == ((), {})  # no priority: the default queue


def test_a_retried_function_s_copy_runs_at_next_retry(recording_driver: Any, calls: Calls) -> None:
    dispatcher = Dispatcher(recording_driver, None, None, random.Random(42))
    dispatcher.handler("job", max_retry=25)(calls.fails)
    message = Message("job", retries=2)

    t0 = time.time()
    dispatcher.handle_message(message, DEFAULT_PRIORITY)
    t1 = time.time()

    (copy,) = retry_copies(recording_driver)
    assert copy.execute_at is not None
    # The Dispatcher's own formula and random source: the first value of Random(42).
    assert next_retry(message, random.Random(42), now=t0) <= copy.execute_at
    assert copy.execute_at <= next_retry(message, random.Random(42), now=t1)


def test_a_retried_function_with_5_retries_and_max_retry_5_is_not_published_again(
    recording_driver: Any, calls: Calls
) -> None:
    can_retry = calls.can_retry(True)
    dispatcher = Dispatcher(recording_driver)
    dispatcher.handler("job", max_retry=5, can_retry=can_retry)(calls.fails)

    dispatcher.handle_message(Message("job", retries=5), DEFAULT_PRIORITY)
    dispatcher.handle_message(Message("job", retries=9), DEFAULT_PRIORITY)

    assert recording_driver.calls == []
    assert calls.can_retry_calls == []  # at the limit can_retry is not asked


def test_max_retry_0_disables_retrying_a_function(recording_driver: Any, calls: Calls) -> None:
    dispatcher = Dispatcher(recording_driver)
    dispatcher.handler("job", max_retry=0, can_retry=calls.can_retry(True))(calls.fails)

    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    assert recording_driver.calls == []
    assert calls.can_retry_calls == []


def test_can_retry_is_asked_below_the_limit_with_the_message_and_the_exception(
    recording_driver: Any, calls: Calls
) -> None:
    dispatcher = Dispatcher(recording_driver)
    dispatcher.handler("job", max_retry=3, can_retry=calls.can_retry(False))(calls.fails)
    message = Message("job", retries=2)

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    assert recording_driver.calls == []  # can_retry said no
    ((seen, exception),) = calls.can_retry_calls
    assert seen == message
    assert isinstance(exception, RuntimeError) and str(exception) == "mail server down"


def test_can_retry_true_below_the_limit_publishes_the_copy(
    recording_driver: Any, calls: Calls
) -> None:
    dispatcher = Dispatcher(recording_driver)
    dispatcher.handler("job", max_retry=3, can_retry=calls.can_retry(True))(calls.fails)

    dispatcher.handle_message(Message("job", retries=2), DEFAULT_PRIORITY)

    assert [copy.retries for copy in retry_copies(recording_driver)] == [3]
    assert len(calls.can_retry_calls) == 1


def test_a_retried_function_that_returns_false_is_not_retried(
    recording_driver: Any, calls: Calls
) -> None:
    dispatcher = Dispatcher(recording_driver)
    dispatcher.handler("job", max_retry=25)(calls.false)

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is False
    assert recording_driver.calls == []


def test_a_retried_function_with_a_wrong_result_is_not_retried(recording_driver: Any) -> None:
    can_retry_calls: list[Exception] = []
    dispatcher = Dispatcher(recording_driver)

    @dispatcher.handler(
        "job", max_retry=25, can_retry=lambda m, e: can_retry_calls.append(e) or True
    )
    def returns_a_number(message: Message) -> Any:
        return 42

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is False
    assert recording_driver.calls == []
    assert can_retry_calls == []  # a mistake in the function, not the user's retry decision


def test_two_failing_functions_publish_two_copies_and_the_one_between_runs(
    recording_driver: Any, calls: Calls
) -> None:
    dispatcher = Dispatcher(recording_driver)
    dispatcher.handler("job", max_retry=25)(calls.fails)
    dispatcher.register_handler("job", calls.ok)
    dispatcher.register_handler("job", RetryableFunctionHandler(calls.fails, max_retry=25))
    message = Message("job", retries=1)

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    assert [name for name, _ in calls.seen] == ["fails", "ok", "fails"]
    copies = retry_copies(recording_driver)
    assert [(copy.id, copy.retries) for copy in copies] == [(message.id, 2), (message.id, 2)]


def test_a_retried_function_is_retried_until_max_retry_through_the_broker(
    recording_driver: Any, calls: Calls
) -> None:
    dispatcher = Dispatcher(recording_driver)
    dispatcher.handler("job", max_retry=3)(calls.fails)
    message: Message | None = Message("job")

    while message is not None:
        before = len(recording_driver.calls)
        dispatcher.handle_message(message, DEFAULT_PRIORITY)
        message = recording_driver.sent[-1] if len(recording_driver.calls) > before else None

    assert [copy.retries for copy in recording_driver.sent] == [1, 2, 3]
    assert [m.retries for _, m in calls.seen] == [0, 1, 2, 3]


def test_the_wrapper_class_takes_the_same_arguments(recording_driver: Any, calls: Calls) -> None:
    handler = RetryableFunctionHandler(calls.fails, max_retry=1, can_retry=calls.can_retry(True))
    dispatcher = Dispatcher(recording_driver).register_handler("job", handler)

    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)
    dispatcher.handle_message(Message("job", retries=1), DEFAULT_PRIORITY)

    assert [copy.retries for copy in retry_copies(recording_driver)] == [1]
    assert handler.max_retry() == 1


# The registry ------------------------------------------------------------------------


def test_a_registry_collects_decorated_functions_and_registers_them_in_order(
    recording_driver: Any,
) -> None:
    handlers = HandlerRegistry()
    order: list[str] = []

    @handlers.handler("send-email")
    def send_email(message: Message) -> None:
        order.append("send_email")

    @handlers.handler("send-email", max_retry=2)
    def audit(message: Message) -> None:
        order.append("audit")
        raise RuntimeError("audit log down")

    handlers.register_handler("report", lambda message: None)

    dispatcher = handlers.register(Dispatcher(recording_driver))

    assert list(dispatcher.registered()) == ["send-email", "report"]
    assert dispatcher.handle_message(Message("send-email"), DEFAULT_PRIORITY) is False
    assert order == ["send_email", "audit"]
    assert [copy.retries for copy in retry_copies(recording_driver)] == [1]
    assert [type(h) for h in handlers.registered()["send-email"]] == [
        FunctionHandler,
        RetryableFunctionHandler,
    ]


def test_a_registry_refuses_a_mistake_when_the_module_is_imported() -> None:
    handlers = HandlerRegistry()

    with pytest.raises(ConfigurationError, match="async generator"):

        @handlers.handler("job")  # type: ignore[type-var]
        async def send_email(message: Message):  # type: ignore[no-untyped-def]
            yield True

    assert handlers.registered() == {}


def test_a_registry_can_register_on_several_dispatchers(broker_name: str) -> None:
    handlers = HandlerRegistry()
    handlers.register_handler("job", lambda message: None)

    first = handlers.register(Dispatcher(MemoryDriver(f"{broker_name}-1")))
    second = handlers.register(Dispatcher(MemoryDriver(f"{broker_name}-2")))

    assert first.handlers("job") == second.handlers("job") != []
    assert "job" in repr(handlers)
