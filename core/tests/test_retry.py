"""A failed handler's message is published again as a new message."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import pytest

from hermes.core import DEFAULT_PRIORITY, Emitter, Message, RetryableHandler, RetryMixin, compat
from hermes.core.app._retry import next_retry
from hermes.core.compat import Dispatcher
from hermes.core.drivertools import MemoryDriver


class Flaky(RetryMixin, RetryableHandler):
    """Always raises; ``max_retry`` and ``can_retry`` as configured; records its calls."""

    def __init__(self, max_retry: int = 25, can_retry: bool = True) -> None:
        self._max_retry = max_retry
        self._can_retry = can_retry
        self.handled: list[Message] = []
        self.can_retry_calls: list[tuple[Message, Exception]] = []

    def handle(self, message: Message) -> bool:
        self.handled.append(message)
        raise RuntimeError("temporary failure")

    def can_retry(self, message: Message, exception: Exception) -> bool:
        self.can_retry_calls.append((message, exception))
        return self._can_retry

    def max_retry(self) -> int:
        return self._max_retry


class Succeeds(RetryMixin, RetryableHandler):
    def __init__(self) -> None:
        self.handled: list[Message] = []

    def handle(self, message: Message) -> bool:
        self.handled.append(message)
        return True


def retry_copies(driver: Any) -> list[Message]:
    """What the dispatcher sent: every ``send`` after the test's own."""
    return [message for message, args, kwargs in driver.calls if (args, kwargs) == ((), {})]


def at_bounds(t0: float, t1: float, retries: int, jitter: int) -> tuple[float, float]:
    """The ``execute_at`` range of ``next_retry`` called between ``t0`` and ``t1``."""
    r = retries
    return t0 + r**4 + 15 + jitter * (r + 1), t1 + r**4 + 15 + jitter * (r + 1)


def jitter_of(copy: Message, t0: float, retries: int) -> int:
    """The random part of a copy's delay, read back through the formula."""
    r = retries
    return round((copy.execute_at - t0 - r**4 - 15) / (r + 1))  # type: ignore[operator]


# The boundaries of the retry rule ------------------------------------------------


def test_a_message_with_5_retries_and_max_retry_25_is_published_again_once_with_6_retries(
    recording_driver: Any,
) -> None:
    dispatcher = Dispatcher(recording_driver).register_handler("job", Flaky(max_retry=25))

    dispatcher.handle_message(Message("job", {"n": 1}, retries=5), DEFAULT_PRIORITY)

    copies = retry_copies(recording_driver)
    assert [copy.retries for copy in copies] == [6]


def test_the_retry_copy_keeps_id_type_payload_and_created(recording_driver: Any) -> None:
    original = Message("job", {"to": "a@example.com", "n": [1, 2]}, created=1764480000.5, retries=5)
    dispatcher = Dispatcher(recording_driver).register_handler("job", Flaky())

    dispatcher.handle_message(original, DEFAULT_PRIORITY)

    (copy,) = retry_copies(recording_driver)
    assert (copy.id, copy.type, copy.payload, copy.created) == (
        original.id,
        "job",
        {"to": "a@example.com", "n": [1, 2]},
        1764480000.5,
    )


def test_the_retry_copy_runs_at_next_retry_of_the_original(recording_driver: Any) -> None:
    expected_jitter = random.Random(42).randint(1, 30)
    dispatcher = Dispatcher(recording_driver, None, None, random.Random(42))
    dispatcher.register_handler("job", Flaky())

    t0 = time.time()
    dispatcher.handle_message(Message("job", retries=5), DEFAULT_PRIORITY)
    t1 = time.time()

    (copy,) = retry_copies(recording_driver)
    low, high = at_bounds(t0, t1, 5, expected_jitter)
    assert copy.execute_at is not None
    assert low <= copy.execute_at <= high


def test_the_retry_copy_is_sent_without_a_priority_even_when_the_original_had_300(
    recording_driver: Any, peek: Any
) -> None:
    recording_driver.setup_priority_queue("high", 300)
    Emitter(recording_driver).emit(Message("job"), 300)
    compat.set_max_process_items(recording_driver, 1)
    dispatcher = Dispatcher(recording_driver).register_handler("job", Flaky())

    dispatcher.handle()

    original, copy = recording_driver.calls
    assert original[1:] == ((300,), {})
    assert copy[1:] == ((), {})
    assert [(priority, m.retries) for priority, m in peek.scheduled(recording_driver)] == [
        (DEFAULT_PRIORITY, 1)
    ]


def test_a_message_with_5_retries_and_max_retry_5_is_not_published_again(
    recording_driver: Any,
) -> None:
    dispatcher = Dispatcher(recording_driver).register_handler("job", Flaky(max_retry=5))

    dispatcher.handle_message(Message("job", retries=5), DEFAULT_PRIORITY)

    assert recording_driver.calls == []


def test_max_retry_0_disables_retrying(recording_driver: Any) -> None:
    dispatcher = Dispatcher(recording_driver).register_handler("job", Flaky(max_retry=0))

    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    assert recording_driver.calls == []


def test_can_retry_false_skips_the_retry_and_receives_the_message_and_the_exception(
    recording_driver: Any,
) -> None:
    handler = Flaky(can_retry=False)
    message = Message("job", retries=2)
    dispatcher = Dispatcher(recording_driver).register_handler("job", handler)

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    assert recording_driver.calls == []
    ((seen, exception),) = handler.can_retry_calls
    assert seen == message
    assert isinstance(exception, RuntimeError)
    assert str(exception) == "temporary failure"


def test_can_retry_is_never_called_once_max_retry_is_reached(recording_driver: Any) -> None:
    handler = Flaky(max_retry=3)
    dispatcher = Dispatcher(recording_driver).register_handler("job", handler)

    dispatcher.handle_message(Message("job", retries=3), DEFAULT_PRIORITY)
    dispatcher.handle_message(Message("job", retries=7), DEFAULT_PRIORITY)

    assert len(handler.handled) == 2
    assert handler.can_retry_calls == []
    assert recording_driver.calls == []


def test_can_retry_is_called_below_max_retry(recording_driver: Any) -> None:
    handler = Flaky(max_retry=3)
    dispatcher = Dispatcher(recording_driver).register_handler("job", handler)

    dispatcher.handle_message(Message("job", retries=2), DEFAULT_PRIORITY)

    assert len(handler.can_retry_calls) == 1
    assert [copy.retries for copy in retry_copies(recording_driver)] == [3]


def test_returning_false_never_retries(recording_driver: Any) -> None:
    class Refuses(RetryMixin, RetryableHandler):
        def handle(self, message: Message) -> bool:
            return False

    dispatcher = Dispatcher(recording_driver).register_handler("job", Refuses())

    result = dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    assert result is False
    assert recording_driver.calls == []


def test_a_plain_handler_that_raises_is_not_retried(recording_driver: Any) -> None:
    class Plain:
        def handle(self, message: Message) -> bool:
            raise RuntimeError("boom")

    dispatcher = Dispatcher(recording_driver).register_handler("job", Plain())

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is False
    assert recording_driver.calls == []


def test_two_failing_handlers_publish_two_copies_and_the_handler_between_them_runs(
    recording_driver: Any,
) -> None:
    first, between, second = Flaky(), Succeeds(), Flaky()
    dispatcher = Dispatcher(recording_driver).register_handlers("job", [first, between, second])
    message = Message("job", retries=1)

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    assert [m.id for m in between.handled] == [message.id]
    copies = retry_copies(recording_driver)
    assert [(copy.id, copy.retries) for copy in copies] == [(message.id, 2), (message.id, 2)]
    assert dispatcher.stats.retried == 2


def test_each_retry_carries_one_more_retry_until_max_retry_is_reached(
    recording_driver: Any,
) -> None:
    dispatcher = Dispatcher(recording_driver).register_handler("job", Flaky(max_retry=3))
    message: Message | None = Message("job")

    while message is not None:
        before = len(recording_driver.calls)
        dispatcher.handle_message(message, DEFAULT_PRIORITY)
        message = recording_driver.sent[-1] if len(recording_driver.calls) > before else None

    assert [copy.retries for copy in recording_driver.sent] == [1, 2, 3]


# The delay ---------------------------------------------------------------------


def test_random_42_as_the_fourth_argument_gives_the_same_delays_on_every_run(
    broker_name: str,
) -> None:
    def one_run(run: int) -> list[int]:
        driver = _Recording(f"{broker_name}-{run}")
        try:
            dispatcher = Dispatcher(driver, None, None, random.Random(42))
            dispatcher.register_handler("job", Flaky())
            jitters = []
            for retries in (0, 1, 2, 0, 3):
                t0 = time.time()
                dispatcher.handle_message(Message("job", retries=retries), DEFAULT_PRIORITY)
                jitters.append(jitter_of(driver.sent[-1], t0, retries))
            return jitters
        finally:
            driver.teardown()

    first, second = one_run(1), one_run(2)

    assert first == second
    assert len(set(first)) > 1  # a constant would also repeat; Random(42)'s values do not


def test_random_42_delays_follow_the_formula_first_retry_first_value(
    recording_driver: Any,
) -> None:
    source = random.Random(42)
    expected = [source.randint(1, 30) for _ in range(4)]
    dispatcher = Dispatcher(recording_driver, randomizer=random.Random(42))
    dispatcher.register_handler("job", Flaky())

    for retries, jitter in zip((0, 1, 2, 4), expected, strict=True):
        t0 = time.time()
        dispatcher.handle_message(Message("job", retries=retries), DEFAULT_PRIORITY)
        t1 = time.time()
        copy = recording_driver.sent[-1]
        low, high = at_bounds(t0, t1, retries, jitter)
        assert copy.execute_at is not None
        assert low <= copy.execute_at <= high, (retries, jitter)


@pytest.mark.parametrize(
    ("retries", "shortest", "longest"), [(0, 16, 45), (1, 18, 76), (2, 34, 121), (3, 100, 216)]
)
def test_retry_delays_span_the_documented_range(retries: int, shortest: int, longest: int) -> None:
    randomizer = random.Random(retries)  # any source: 3000 draws of 1..30 cover every value
    message = Message("job", retries=retries)

    delays = {next_retry(message, randomizer, now=1000.0) - 1000.0 for _ in range(3000)}

    assert min(delays) == shortest
    assert max(delays) == longest
    assert delays == {retries**4 + 15 + j * (retries + 1) for j in range(1, 31)}


def test_the_first_retry_of_a_dispatcher_is_delayed_16_to_45_seconds(driver: MemoryDriver) -> None:
    dispatcher = Dispatcher(driver)  # the default SystemRandom
    message = Message("job")

    for _ in range(2000):
        t0 = time.time()
        execute_at = dispatcher.next_retry(message)
        t1 = time.time()
        assert t0 + 16 <= execute_at <= t1 + 45


def test_the_default_randomizer_is_system_random(driver: MemoryDriver) -> None:
    assert isinstance(Dispatcher(driver).randomizer, random.SystemRandom)


# The retry policy's building blocks -----------------------------------------------


def test_retry_mixin_always_retries_up_to_25_times() -> None:
    class Defaults(RetryMixin, RetryableHandler):
        def handle(self, message: Message) -> bool:
            return True

    handler = Defaults()

    assert handler.max_retry() == 25
    assert handler.can_retry(Message("job"), RuntimeError("x")) is True


def test_a_retryable_handler_without_can_retry_and_max_retry_cannot_be_created() -> None:
    class Incomplete(RetryableHandler):
        def handle(self, message: Message) -> bool:
            return True

    with pytest.raises(TypeError, match="can_retry"):
        Incomplete()  # type: ignore[abstract]


def test_a_can_retry_that_raises_is_logged_and_the_worker_goes_on(
    recording_driver: Any, hermes_log: pytest.LogCaptureFixture
) -> None:
    class BrokenPolicy(Flaky):
        def can_retry(self, message: Message, exception: Exception) -> bool:
            raise ValueError("policy bug")

    after = Succeeds()
    dispatcher = Dispatcher(recording_driver).register_handlers("job", [BrokenPolicy(), after])

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is False

    assert len(after.handled) == 1
    assert recording_driver.calls == []
    assert any(
        r.levelno == logging.ERROR and "retry policy throws exception - policy bug" in r.message
        for r in hermes_log.records
    )
    assert any(
        r.levelno == logging.ERROR
        and r.message.endswith("not retried: its retry policy raised ValueError: policy bug")
        for r in hermes_log.records
    )
    assert dispatcher.stats.gave_up == 1


# The legacy 5.x rule -------------------------------------------------------------


def legacy_handler(source: str) -> Any:
    """A fresh 5.x-style handler class (both methods, no ABC) each call; ``source`` says where
    the methods come from. ``can_retry`` returns False with the 5.x signature, and records."""

    calls: list[Any] = []

    class Methods:
        def can_retry(self) -> bool:
            calls.append("can_retry")
            return False

        def max_retry(self) -> int:
            return 3

    def handle(self: Any, message: Message) -> bool:
        raise RuntimeError("legacy failure")

    if source == "class":
        cls = type(
            "LegacyOwn",
            (),
            {"handle": handle, "can_retry": Methods.can_retry, "max_retry": Methods.max_retry},
        )
    elif source == "parent":
        parent = type(
            "LegacyParent", (), {"can_retry": Methods.can_retry, "max_retry": Methods.max_retry}
        )
        cls = type("LegacyChild", (parent,), {"handle": handle})
    elif source == "mixin":
        cls = type("LegacyWithMixin", (RetryMixin,), {"handle": handle})
    else:
        raise AssertionError(source)
    handler = cls()
    handler.can_retry_calls = calls
    return handler


@pytest.mark.parametrize("source", ["class", "parent", "mixin"])
def test_a_legacy_handler_is_retried_while_retries_is_below_max_retry(
    source: str, recording_driver: Any
) -> None:
    handler = legacy_handler(source)
    limit = handler.max_retry()
    dispatcher = Dispatcher(recording_driver).register_handler("job", handler)

    with pytest.warns(DeprecationWarning):
        for retries in range(limit + 2):
            dispatcher.handle_message(Message("job", retries=retries), DEFAULT_PRIORITY)

    assert [copy.retries for copy in retry_copies(recording_driver)] == list(range(1, limit + 1))


@pytest.mark.parametrize("source", ["class", "parent"])
def test_a_legacy_handler_s_can_retry_is_never_called(source: str, recording_driver: Any) -> None:
    handler = legacy_handler(source)
    dispatcher = Dispatcher(recording_driver).register_handler("job", handler)

    with pytest.warns(DeprecationWarning):
        dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    assert handler.can_retry_calls == []
    assert len(retry_copies(recording_driver)) == 1  # although can_retry() would say False


@pytest.mark.parametrize("missing", ["can_retry", "max_retry"])
def test_a_handler_with_only_one_of_the_two_methods_is_never_retried(
    missing: str, recording_driver: Any, recwarn: pytest.WarningsRecorder
) -> None:
    def handle(self: Any, message: Message) -> bool:
        raise RuntimeError("failure")

    methods: dict[str, Any] = {
        "handle": handle,
        "can_retry": lambda self, *args: True,
        "max_retry": lambda self: 25,
    }
    del methods[missing]
    handler = type("HalfLegacy", (), methods)()
    dispatcher = Dispatcher(recording_driver).register_handler("job", handler)

    dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)

    assert recording_driver.calls == []
    assert len(recwarn) == 0


def test_a_legacy_handler_warns_once_per_class_with_a_deprecation_warning_and_a_log_record(
    recording_driver: Any, hermes_log: pytest.LogCaptureFixture
) -> None:
    first = legacy_handler("class")
    second_of_same_class = type(first)()
    other_class = legacy_handler("class")
    dispatcher = Dispatcher(recording_driver)
    dispatcher.register_handlers("job", [first, second_of_same_class])
    dispatcher.register_handler("other", other_class)

    with pytest.warns(DeprecationWarning) as warned:
        for _ in range(3):
            dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY)
        dispatcher.handle_message(Message("other"), DEFAULT_PRIORITY)

    legacy_records = [r for r in hermes_log.records if hasattr(r, "handler")]
    assert [r.handler for r in legacy_records] == [type(first), type(other_class)]
    assert all(r.levelno == logging.WARNING for r in legacy_records)
    assert "LegacyOwn" in legacy_records[0].message
    assert "RetryableHandler" in legacy_records[0].message
    assert "(message, exception)" in legacy_records[0].message
    assert [w.category for w in warned] == [DeprecationWarning, DeprecationWarning]
    assert "LegacyOwn" in str(warned[0].message)


def test_a_legacy_handler_that_never_fails_is_not_warned_about(
    recording_driver: Any, recwarn: pytest.WarningsRecorder
) -> None:
    class Quiet:
        def handle(self, message: Message) -> bool:
            return True

        def can_retry(self) -> bool:
            return True

        def max_retry(self) -> int:
            return 25

    Dispatcher(recording_driver).register_handler("job", Quiet()).handle_message(
        Message("job"), DEFAULT_PRIORITY
    )

    assert len(recwarn) == 0


def test_a_retryable_handler_is_not_warned_about(
    recording_driver: Any, recwarn: pytest.WarningsRecorder, hermes_log: pytest.LogCaptureFixture
) -> None:
    Dispatcher(recording_driver).register_handler("job", Flaky()).handle_message(
        Message("job"), DEFAULT_PRIORITY
    )

    assert len(recwarn) == 0
    assert not [r for r in hermes_log.records if hasattr(r, "handler")]
    # The one WARNING is the retry line itself.
    (warning,) = [r for r in hermes_log.records if r.levelno == logging.WARNING]
    assert "retry 1 of 25" in warning.getMessage()


class _Recording(MemoryDriver):
    """Like the ``recording_driver`` fixture, for tests that need more than one."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.sent: list[Message] = []

    def send(self, message: Message, *args: Any, **kwargs: Any) -> None:
        self.sent.append(message)
        super().send(message, *args, **kwargs)
