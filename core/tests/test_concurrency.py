"""Several handlers at once: threads, async handlers, time limits, stopping with a grace period."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from hermes.core import (
    ConfigurationError,
    HandlerRegistry,
    Message,
    RetryableHandler,
    RetryMixin,
    TimeLimitExceeded,
    Worker,
    compat,
)
from hermes.core.compat import Dispatcher
from hermes.core.driver import Consumer, Received
from hermes.core.drivertools import MemoryDriver

from .conftest import RecordingDriver

DEADLINE_S = 20.0


class StopWhen:
    """A Shutdown that asks once ``condition()`` holds (or after a deadline, so no test hangs)."""

    def __init__(self, condition: Callable[[], bool], deadline_s: float = DEADLINE_S) -> None:
        self.condition = condition
        self.deadline = time.monotonic() + deadline_s

    def should_shutdown(self, start_time: float) -> bool:
        return self.condition() or time.monotonic() > self.deadline

    def shutdown(self, at: float | None = None) -> bool:
        return False


def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def run_in_thread(dispatcher: Dispatcher) -> threading.Thread:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            dispatcher.handle()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def release_abandoned(stuck: threading.Event, before: set[threading.Thread]) -> None:
    """Let the handlers a run abandoned finish, and wait for their threads to end: they log
    as they end, which must not outlive the test's log capture."""
    stuck.set()
    for thread in set(threading.enumerate()) - before:
        thread.join(DEADLINE_S)


def queued(driver: MemoryDriver) -> int:
    broker = driver._broker
    with broker.condition:
        return sum(len(q) for q in broker.queues.values()) + len(broker.scheduled)


# Configuration ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_concurrency_must_be_a_whole_number_of_at_least_one(driver: MemoryDriver, bad) -> None:
    with pytest.raises(ConfigurationError, match="concurrency must be an int >= 1"):
        Dispatcher(driver, concurrency=bad)


def test_a_time_limit_must_be_positive(driver: MemoryDriver) -> None:
    with pytest.raises(ConfigurationError, match="time_limit_s must be > 0"):
        Dispatcher(driver, time_limit_s=0)


def test_wait_refuses_a_concurrency_below_one(driver: MemoryDriver) -> None:
    with pytest.raises(ValueError, match="concurrency must be an int >= 1"):
        compat.wait(driver, lambda message, priority: True, concurrency=0)


# Threads ------------------------------------------------------------------------


def test_a_blocked_handler_does_not_stop_the_others(driver: MemoryDriver) -> None:
    release = threading.Event()
    done: list[str] = []

    class Handler:
        def handle(self, message: Message) -> bool:
            if message.payload["block"]:
                release.wait(DEADLINE_S)
            done.append(message.payload["name"])
            return True

    driver.send(Message("job", {"name": "blocker", "block": True}))
    for i in range(5):
        driver.send(Message("job", {"name": f"quick-{i}", "block": False}))
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: len(done) == 6), concurrency=2)
    dispatcher.register_handler("job", Handler())
    thread = run_in_thread(dispatcher)

    eventually(lambda: len(done) == 5, "the five quick messages were handled")
    assert "blocker" not in done
    release.set()
    thread.join(DEADLINE_S)
    assert not thread.is_alive() and not thread.errors
    assert done[-1] == "blocker"
    assert queued(driver) == 0


class _WatchedConsumer(Consumer):
    """A memory consumer that writes down who receives, and any close during a receive."""

    def __init__(self, inner: Consumer) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.receiving = 0
        self.threads: set[int] = set()
        self.closed_while_receiving = False

    def receive(self, timeout_s: float) -> Received | None:
        with self.lock:
            self.receiving += 1
            self.threads.add(threading.get_ident())
        try:
            return self.inner.receive(timeout_s)
        finally:
            with self.lock:
                self.receiving -= 1

    def ack(self, received: Received) -> None:
        self.inner.ack(received)

    def release(self, received: Received) -> None:
        self.inner.release(received)

    def close(self) -> None:
        with self.lock:
            self.closed_while_receiving = self.receiving > 0
        self.inner.close()


class _WatchedDriver(MemoryDriver):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.consumers: list[_WatchedConsumer] = []

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        consumer = _WatchedConsumer(super().consumer(priorities, concurrency=concurrency))
        self.consumers.append(consumer)
        return consumer


@pytest.fixture
def watched(broker_name: str) -> Iterator[_WatchedDriver]:
    driver = _WatchedDriver(broker_name)
    yield driver
    driver.teardown()


def test_a_long_handler_is_overtaken_and_the_next_message_is_received_elsewhere(
    watched: _WatchedDriver,
) -> None:
    driver = watched
    first_ran_on: list[int] = []
    second_ran_on: list[int] = []
    second_done = threading.Event()

    class Handler:
        def handle(self, message: Message) -> bool:
            if message.payload["n"] == 1:
                first_ran_on.append(threading.get_ident())
                second_done.wait(DEADLINE_S)  # long: runs until the next one is done
            else:
                second_ran_on.append(threading.get_ident())
                second_done.set()
            return True

    driver.send(Message("job", {"n": 1}))
    driver.send(Message("job", {"n": 2}))
    dispatcher = Dispatcher(driver, concurrency=2)
    dispatcher.register_handler("job", Handler())
    Worker(
        driver, dispatcher, shutdown=StopWhen(lambda: dispatcher.stats.handled == 2),
        handle_signals=False,
    ).run()  # fmt: skip

    assert second_done.is_set() and first_ran_on != second_ran_on
    assert len(driver.consumers[0].threads) == 2, "one thread received both messages"
    assert dispatcher.stats.handled == 2 and queued(driver) == 0


def test_the_consumer_is_closed_only_after_a_receive_in_progress_has_returned(
    watched: _WatchedDriver, caplog: pytest.LogCaptureFixture
) -> None:
    driver = watched
    stuck, running = threading.Event(), threading.Event()

    class Stuck:
        def handle(self, message: Message) -> bool:
            running.set()
            stuck.wait(DEADLINE_S)
            return True

    driver.send(Message("job"))
    before = set(threading.enumerate())
    dispatcher = Dispatcher(driver, concurrency=2, grace_s=0)
    dispatcher.register_handler("job", Stuck())
    consumers = driver.consumers
    # Stop once the other thread has taken the consumer over and waits in an idle receive.
    worker = Worker(
        driver,
        dispatcher,
        shutdown=StopWhen(lambda: running.is_set() and consumers[0].receiving > 0),
        handle_signals=False,
    )
    try:
        worker.run()
        consumer = consumers[0]
        assert len(consumer.threads) == 2
        assert not consumer.closed_while_receiving, "closed while a thread was in receive()"
        assert any("still running after the 0 s grace" in r.getMessage() for r in caplog.records)
    finally:
        release_abandoned(stuck, before)


def test_counts_are_exact_when_many_handlers_finish_at_once(driver: MemoryDriver) -> None:
    for i in range(200):
        driver.send(Message("job", {"i": i}))
    seen: list[int] = []
    lock = threading.Lock()

    class Handler:
        def handle(self, message: Message) -> bool:
            with lock:
                seen.append(message.payload["i"])
            return message.payload["i"] % 10 != 0  # every tenth "fails" by returning False

    dispatcher = Dispatcher(driver, concurrency=8)
    dispatcher.register_handler("job", Handler())
    stats = Worker(
        driver, dispatcher, shutdown=StopWhen(lambda: len(seen) == 200), handle_signals=False
    ).run()

    assert sorted(seen) == list(range(200))
    assert dispatcher.stats.received == 200
    assert dispatcher.stats.handled == 180
    assert dispatcher.stats.failed == 20
    assert stats.processed == stats.started == 200


def test_max_items_with_concurrency_never_starts_more_than_asked(driver: MemoryDriver) -> None:
    for i in range(20):
        driver.send(Message("job", {"i": i}))
    started: list[int] = []

    class Slow:
        def handle(self, message: Message) -> bool:
            started.append(message.payload["i"])
            time.sleep(0.05)
            return True

    compat.set_max_process_items(driver, 3)
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: False), concurrency=4)
    dispatcher.register_handler("job", Slow())
    dispatcher.handle()

    assert len(started) == 3
    assert dispatcher.stats.handled == 3
    assert queued(driver) == 17


def test_a_shutdown_waits_for_handlers_in_flight_within_the_grace_period(
    driver: MemoryDriver,
) -> None:
    for i in range(4):
        driver.send(Message("job", {"i": i}))
    running = threading.Semaphore(0)
    finished: list[int] = []

    class Slow:
        def handle(self, message: Message) -> bool:
            running.release()
            time.sleep(0.3)
            finished.append(message.payload["i"])
            return True

    asked = threading.Event()
    dispatcher = Dispatcher(driver, shutdown=StopWhen(asked.is_set), concurrency=4, grace_s=10)
    dispatcher.register_handler("job", Slow())
    thread = run_in_thread(dispatcher)
    for _ in range(4):
        assert running.acquire(timeout=DEADLINE_S)
    asked.set()
    thread.join(DEADLINE_S)

    assert not thread.is_alive() and not thread.errors
    assert sorted(finished) == [0, 1, 2, 3]
    assert queued(driver) == 0


def test_a_handler_still_running_after_the_grace_period_is_not_acknowledged(
    driver: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    driver.send(Message("job", {"name": "stuck"}))
    stuck = threading.Event()
    running = threading.Event()

    class Stuck:
        def handle(self, message: Message) -> bool:
            running.set()
            stuck.wait(DEADLINE_S)
            return True

    before = set(threading.enumerate())
    dispatcher = Dispatcher(driver, shutdown=StopWhen(running.is_set), concurrency=2, grace_s=0.2)
    dispatcher.register_handler("job", Stuck())
    try:
        dispatcher.handle()
        assert queued(driver) == 0, "given back while its handler may still run"
        assert any("still running after the 0.2 s grace" in r.getMessage() for r in caplog.records)
        # The memory broker's lease runs out redelivery_timeout_s after the close.
        eventually(
            lambda: driver.consumer(()).receive(0) is not None, "the message is handed out again"
        )
    finally:
        release_abandoned(stuck, before)


def test_a_callback_that_raises_under_concurrency_stops_the_run_and_is_released(
    driver: MemoryDriver,
) -> None:
    driver.send(Message("job"))

    def callback(message: Message, priority: int) -> bool:
        raise RuntimeError("the retry could not be sent")

    with pytest.raises(RuntimeError, match="the retry could not be sent"):
        compat.wait(driver, callback, concurrency=3)
    assert queued(driver) == 1


# Async handlers -----------------------------------------------------------------


def test_an_async_handler_is_awaited_and_its_side_effect_happens(driver: MemoryDriver) -> None:
    effects: list[str] = []

    class AsyncHandler:
        async def handle(self, message: Message) -> bool:
            await asyncio.sleep(0.01)
            effects.append(message.payload["to"])
            return True

    driver.send(Message("mail", {"to": "ana@example.com"}))
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: bool(effects)))
    dispatcher.register_handler("mail", AsyncHandler())
    dispatcher.handle()

    assert effects == ["ana@example.com"]
    assert dispatcher.stats.handled == 1


def test_async_handlers_run_at_once_up_to_the_concurrency(driver: MemoryDriver) -> None:
    active = 0
    most = 0
    done: list[int] = []

    class AsyncHandler:
        async def handle(self, message: Message) -> bool:
            nonlocal active, most
            active += 1  # only the event loop's thread touches these
            most = max(most, active)
            await asyncio.sleep(0.1)
            active -= 1
            done.append(message.payload["i"])
            return True

    for i in range(8):
        driver.send(Message("job", {"i": i}))
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: len(done) == 8), concurrency=4)
    dispatcher.register_handler("job", AsyncHandler())
    dispatcher.handle()

    assert sorted(done) == list(range(8))
    assert most == 4


def test_an_async_handler_that_returns_false_counts_as_failed(driver: MemoryDriver) -> None:
    class Refuses:
        async def handle(self, message: Message) -> bool:
            return False

    driver.send(Message("job"))
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: dispatcher.stats.received == 1))
    dispatcher.register_handler("job", Refuses())
    dispatcher.handle()
    assert (dispatcher.stats.handled, dispatcher.stats.failed) == (0, 1)


# Time limits --------------------------------------------------------------------


class Overruns(RetryMixin, RetryableHandler):
    time_limit_s = 0.2

    def __init__(self) -> None:
        self.interrupted = threading.Event()

    def handle(self, message: Message) -> bool:
        try:
            for _ in range(int(DEADLINE_S / 0.01)):
                time.sleep(0.01)  # Python bytecode between sleeps: the interruption lands
        except TimeLimitExceeded:
            self.interrupted.set()
            raise
        return True


@pytest.mark.parametrize("concurrency", [1, 3])
def test_an_overrunning_handler_is_interrupted_logged_and_retried(
    recording_driver: RecordingDriver, caplog: pytest.LogCaptureFixture, concurrency: int
) -> None:
    caplog.set_level(logging.INFO, logger="hermes")
    handler = Overruns()
    recording_driver.send(Message("slow"))
    dispatcher = Dispatcher(
        recording_driver,
        shutdown=StopWhen(lambda: dispatcher.stats.retried == 1),
        concurrency=concurrency,
    )
    dispatcher.register_handler("slow", handler)
    dispatcher.handle()

    assert handler.interrupted.is_set()
    assert dispatcher.stats.failed == 1
    [retry] = [m for m in recording_driver.sent if m.retries == 1]
    assert retry.type == "slow"
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("timed out after 0.2 s" in text for text in errors), errors


def test_the_worker_time_limit_applies_to_handlers_without_their_own(
    driver: MemoryDriver,
) -> None:
    outcome: list[str] = []

    class Slow:
        def handle(self, message: Message) -> bool:
            try:
                for _ in range(int(DEADLINE_S / 0.01)):
                    time.sleep(0.01)
            except TimeLimitExceeded:
                outcome.append("interrupted")
                raise
            return True

    driver.send(Message("slow"))
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: bool(outcome)), time_limit_s=0.2)
    dispatcher.register_handler("slow", Slow())
    dispatcher.handle()
    assert outcome == ["interrupted"]
    assert dispatcher.stats.failed == 1


def test_a_handler_that_finishes_in_time_is_never_interrupted_later(
    driver: MemoryDriver,
) -> None:
    for i in range(50):
        driver.send(Message("quick", {"i": i}))
    done: list[int] = []

    class Quick:
        time_limit_s = 0.05

        def handle(self, message: Message) -> bool:
            done.append(message.payload["i"])
            return True

    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: len(done) == 50))
    dispatcher.register_handler("quick", Quick())
    dispatcher.handle()
    time.sleep(0.2)  # past every limit: a late interruption would surface now, in this thread
    assert dispatcher.stats.handled == 50 and dispatcher.stats.failed == 0


def test_an_overrunning_async_handler_is_cancelled(driver: MemoryDriver) -> None:
    cancelled = threading.Event()

    class Hangs:
        time_limit_s = 0.2

        async def handle(self, message: Message) -> bool:
            try:
                await asyncio.sleep(DEADLINE_S)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return True

    driver.send(Message("hang"))
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: dispatcher.stats.failed == 1))
    dispatcher.register_handler("hang", Hangs())
    dispatcher.handle()
    assert cancelled.wait(5)


def _overrunning_function(outcome: list[str]) -> Callable[[Message], None]:
    def slow(message: Message) -> None:
        try:
            for _ in range(int(DEADLINE_S / 0.01)):
                time.sleep(0.01)
        except TimeLimitExceeded:
            outcome.append("interrupted")
            raise

    return slow


def test_a_handler_function_s_own_time_limit_s_attribute_interrupts_it(
    driver: MemoryDriver,
) -> None:
    outcome: list[str] = []
    slow = _overrunning_function(outcome)
    slow.time_limit_s = 0.2  # type: ignore[attr-defined]
    driver.send(Message("slow"))
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: bool(outcome)))
    dispatcher.register_handler("slow", slow)
    dispatcher.handle()
    assert outcome == ["interrupted"]
    assert dispatcher.stats.failed == 1


@pytest.mark.parametrize("where", ["dispatcher", "registry"])
def test_the_handler_decorator_s_time_limit_s_interrupts_the_function(
    driver: MemoryDriver, where: str
) -> None:
    outcome: list[str] = []
    driver.send(Message("slow"))
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: bool(outcome)), time_limit_s=60)
    if where == "dispatcher":
        dispatcher.handler("slow", time_limit_s=0.2)(_overrunning_function(outcome))
    else:
        registry = HandlerRegistry()
        registry.handler("slow", time_limit_s=0.2)(_overrunning_function(outcome))
        registry.register(dispatcher)
    dispatcher.handle()
    assert outcome == ["interrupted"]


@pytest.mark.parametrize("bad", [0, -1, "1"])
def test_a_handler_function_s_time_limit_must_be_positive(driver: MemoryDriver, bad) -> None:
    dispatcher = Dispatcher(driver)
    with pytest.raises(ConfigurationError, match="time_limit_s"):
        dispatcher.handler("slow", time_limit_s=bad)(lambda message: None)
