"""The Worker: one run over a driver's consumer, and the hooks plugins see on every path."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from hermes.core import (
    BrokerRefusedError,
    Dispatcher,
    HandlerRegistry,
    Message,
    Outcome,
    RetryableHandler,
    RetryMixin,
    Worker,
    hookimpl,
)
from hermes.core.app._failed import FailedMessageSerializer
from hermes.core.driver import Consumer, Driver, Received
from hermes.core.drivertools import MemoryDriver
from hermes.core.spi._registry import plugin_manager


class Spy:
    """A plugin that records, per message id, the order of lifecycle hooks and outcomes."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()

    def _add(self, name: str, key: str, detail: Any = None) -> None:
        with self.lock:
            self.events.append((name, key, detail))

    @hookimpl
    def hermes_message_started(self, message: Message) -> None:
        self._add("started", message.id)

    @hookimpl
    def hermes_handler_call(self, message: Message) -> Any:
        @contextmanager
        def around() -> Iterator[None]:
            self._add("call", message.id)
            yield

        return around()

    @hookimpl
    def hermes_message_finished(self, message: Message, outcome: Outcome, result: bool) -> None:
        self._add("finished", message.id, (outcome, result))

    @hookimpl
    def hermes_message_rejected(self, body: bytes, reason: str) -> None:
        self._add("rejected", body.decode(errors="replace"), reason)

    def for_message(self, message_id: str) -> list[tuple[str, Any]]:
        return [(name, detail) for name, key, detail in self.events if key == message_id]


@pytest.fixture
def spy() -> Iterator[Spy]:
    plugin = Spy()
    plugin_manager().register(plugin, name="test-spy")
    yield plugin
    plugin_manager().unregister(plugin)


class Flaky(RetryMixin, RetryableHandler):
    def handle(self, message: Message) -> bool:
        raise RuntimeError("flaky")


class Broken(RetryableHandler):
    """Retryable, but its retries are used up at once."""

    def handle(self, message: Message) -> bool:
        raise RuntimeError("broken")

    def can_retry(self, message: Message, exception: Exception) -> bool:
        return True

    def max_retry(self) -> int:
        return 0


def test_started_comes_before_finished_with_an_outcome_on_every_path(
    driver: MemoryDriver, spy: Spy
) -> None:
    handlers = HandlerRegistry()
    handlers.register_handler("ok", lambda message: None)
    handlers.register_handler("false", lambda message: False)

    def raises(message: Message) -> None:
        raise RuntimeError("no retry")

    def slow(message: Message) -> None:
        for _ in range(500):  # the time limit interrupts Python code, not one long sleep
            time.sleep(0.01)

    handlers.register_handler("raises", raises)
    handlers.register_handler("retried", Flaky())
    handlers.register_handler("given-up", Broken())
    handlers.register_handler("slow", slow)
    dispatcher = handlers.register(Dispatcher(driver, time_limit_s=0.2))
    expected = {
        "ok": Outcome.SUCCEEDED,
        "false": Outcome.RETURNED_FALSE,
        "raises": Outcome.NOT_RETRYABLE,
        "retried": Outcome.RETRIED,
        "given-up": Outcome.GAVE_UP,
        "slow": Outcome.TIME_LIMIT,
        "nobody": Outcome.NO_HANDLER,
    }
    messages = {kind: Message(kind) for kind in expected}
    driver.send_raw(b"not a message")
    for message in messages.values():
        driver.send(message)

    Worker(driver, dispatcher, max_items=len(messages), handle_signals=False).run()

    for kind, message in messages.items():
        events = spy.for_message(message.id)
        names = [name for name, _ in events]
        assert names[0] == "started", (kind, names)
        assert names[-1] == "finished", (kind, names)
        assert names.count("started") == names.count("finished") == 1, (kind, names)
        outcome, result = events[-1][1]
        assert outcome is expected[kind], kind
        assert result is (outcome is Outcome.SUCCEEDED)
        assert ("call" in names) is (kind != "nobody"), (kind, names)
    rejected = [event for event in spy.events if event[0] == "rejected"]
    assert [body for _, body, _ in rejected] == ["not a message"]


def test_a_plugin_that_raises_around_the_handler_changes_nothing(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    class Rude:
        @hookimpl
        def hermes_handler_call(self) -> Any:
            @contextmanager
            def around() -> Iterator[None]:
                raise RuntimeError("plugin broke on entry")
                yield

            return around()

    class Swallower:
        @hookimpl
        def hermes_handler_call(self) -> Any:
            @contextmanager
            def around() -> Iterator[None]:
                try:
                    yield
                except RuntimeError:
                    pass  # would swallow the handler's exception: core must not let it

            return around()

    plugins = [Rude(), Swallower()]
    for i, plugin in enumerate(plugins):
        plugin_manager().register(plugin, name=f"test-wrapper-{i}")
    calls: list[str] = []

    def handler(message: Message) -> None:
        calls.append(message.id)
        raise RuntimeError("the job failed")

    try:
        dispatcher = Dispatcher(driver).register_handler("job", handler)
        message = Message("job")
        assert dispatcher.handle_message(message, 100) is False
    finally:
        for plugin in plugins:
            plugin_manager().unregister(plugin)

    assert calls == [message.id]
    assert dispatcher.stats.failed == 1
    assert "plugin broke on entry" in hermes_log.text


def test_a_worker_takes_a_registry_a_dict_or_a_function(driver: MemoryDriver) -> None:
    seen: list[str] = []
    registry = HandlerRegistry()
    registry.register_handler("a", lambda message: seen.append("registry"))
    driver.send(Message("a"))
    Worker(driver, registry, max_items=1, handle_signals=False).run()

    driver.send(Message("a"))
    Worker(driver, {"a": lambda m: seen.append("dict")}, max_items=1, handle_signals=False).run()

    def callback(message: Message, priority: int) -> bool:
        seen.append(f"callback {priority}")
        return True

    driver.send(Message("a"))
    stats = Worker(driver, callback, max_items=1, handle_signals=False).run()

    assert seen == ["registry", "dict", "callback 100"]
    assert stats.processed == 1
    assert stats.stopped_by == "max items"


def test_stop_from_another_thread_ends_the_run_after_the_message_in_flight(
    driver: MemoryDriver,
) -> None:
    started = threading.Event()
    finished: list[str] = []

    def slow(message: Message) -> None:
        started.set()
        time.sleep(0.3)
        finished.append(message.id)

    message = Message("slow")
    driver.send(message)
    driver.send(Message("slow"))
    worker = Worker(driver, {"slow": slow}, handle_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(10)
    worker.stop()
    thread.join(10)

    assert not thread.is_alive()
    assert finished == [message.id]
    assert worker.stats.stopped_by == "stop()"


def test_bad_settings_are_refused_with_the_name_of_the_setting(driver: MemoryDriver) -> None:
    with pytest.raises(ValueError, match="concurrency must be an int >= 1"):
        Worker(driver, {}, concurrency=0)
    with pytest.raises(ValueError, match="max_items must be an int >= 0"):
        Worker(driver, {}, max_items=-1)
    with pytest.raises(ValueError, match="grace_s must be >= 0"):
        Worker(driver, {}, grace_s=-1)
    with pytest.raises(ValueError, match="Worker handlers must be"):
        Worker(driver, 42)  # type: ignore[arg-type]


class _RefusingConsumer(Consumer):
    def receive(self, timeout_s: float) -> Received | None:
        raise PermissionError("password authentication failed for user 'app'")


class _RefusingDriver(MemoryDriver):
    refused_errors = (PermissionError,)

    def consumer(self, priorities: Any, *, concurrency: int = 1) -> Consumer:
        return _RefusingConsumer()


def test_a_driver_that_declares_an_error_refused_ends_the_run_at_once(broker_name: str) -> None:
    driver: Driver = _RefusingDriver(broker_name)

    with pytest.raises(BrokerRefusedError) as caught:
        Worker(driver, {"job": lambda m: None}, handle_signals=False).run()

    text = str(caught.value)
    assert "refused while receiving" in text
    assert "password authentication failed" in text
    assert "check the URL's credentials" in text
    assert isinstance(caught.value.__cause__, PermissionError)


def test_a_handler_still_running_after_the_grace_period_is_not_settled_after_close(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    settled: list[str] = []

    class Watching(MemoryDriver):
        def consumer(self, priorities: Any, *, concurrency: int = 1) -> Consumer:
            inner = super().consumer(priorities, concurrency=concurrency)
            original_ack = inner.ack

            def ack(received: Received) -> None:
                settled.append("ack")
                original_ack(received)

            inner.ack = ack  # type: ignore[method-assign]
            return inner

    watching = Watching(driver.name)
    watching.send(Message("stuck"))

    def stuck(message: Message) -> None:
        release.wait(10)

    worker = Worker(
        watching, {"stuck": stuck}, concurrency=2, grace_s=0.1, max_items=1, handle_signals=False
    )
    worker.run()
    release.set()
    deadline = time.monotonic() + 10
    while "did not acknowledge" not in hermes_log.text and time.monotonic() < deadline:
        time.sleep(0.02)

    assert settled == []
    assert "still running after the 0.1 s grace period" in hermes_log.text
    assert "did not acknowledge" in hermes_log.text


def _deliver_without_settling(driver: MemoryDriver, times: int) -> None:
    """What a worker killed mid-handler leaves behind: taken ``times`` times, never settled."""
    # A closed consumer's unsettled messages come back once their lease runs out: at once here.
    dying = MemoryDriver(driver.name, redelivery_timeout_s=0)
    for _ in range(times):
        consumer = dying.consumer([])
        assert consumer.receive(5.0) is not None
        consumer.close()
    with driver._broker.condition:  # its lease ran out: back on its queue now
        driver._broker.expire(time.monotonic())


def test_a_message_delivered_more_than_max_deliveries_is_set_aside_unhandled(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    killer = Message("kill")
    driver.send(killer)
    _deliver_without_settling(driver, 3)
    driver.send(Message("fine"))
    handled: list[str] = []

    stats = Worker(
        driver,
        {"kill": lambda m: handled.append("kill"), "fine": lambda m: handled.append("fine")},
        max_deliveries=3,
        stop_when=lambda: driver.queue_stats()[0].ready == 0,
        handle_signals=False,
    ).run()

    assert handled == ["fine"]
    assert stats.set_aside == 1
    ((body, reason),) = driver._broker.dead_letters
    assert killer.id.encode() in bytes(body)
    assert "max_deliveries=3" in reason
    errors = [r for r in hermes_log.records if r.levelname == "ERROR"]
    assert len(errors) == 1
    assert "delivered 4 times, more than max_deliveries=3" in errors[0].getMessage()


def test_a_set_aside_message_goes_to_the_failed_store_when_there_is_one(
    driver: MemoryDriver, broker_name: str
) -> None:
    killer = Message("kill", {"n": 1})
    driver.send(killer)
    _deliver_without_settling(driver, 2)
    store = MemoryDriver(broker_name + "-failed")
    dispatcher = Dispatcher(driver, failed=store, max_deliveries=2)
    dispatcher.register_handler("kill", lambda m: pytest.fail("handler called"))

    stats = Worker(
        driver,
        dispatcher,
        stop_when=lambda: driver.queue_stats()[0].ready == 0,
        handle_signals=False,
    ).run()

    assert stats.set_aside == 1
    assert driver._broker.dead_letters == []
    kept = store.consumer([]).receive(1.0)
    assert kept is not None
    failed = FailedMessageSerializer().unserialize(kept.body)
    assert failed.id == killer.id
    assert "max_deliveries=2" in failed.failed_reason
    assert failed.exceptions == (), "no handler ran: nothing was raised"
    store.teardown()


def test_max_deliveries_off_or_under_the_limit_hands_the_message_over(
    driver: MemoryDriver,
) -> None:
    driver.send(Message("again"))
    _deliver_without_settling(driver, 2)
    counts: list[int | None] = []

    def handler(message: Message) -> None:
        from hermes.core.drivertools import current_received

        received = current_received()
        counts.append(received.delivery_count if received else None)

    Worker(driver, {"again": handler}, max_deliveries=3, max_items=1, handle_signals=False).run()

    assert counts == [3]


def test_max_deliveries_on_a_driver_that_cannot_count_warns_once(
    broker_name: str, hermes_log: pytest.LogCaptureFixture
) -> None:
    from dataclasses import replace

    class Uncounted(MemoryDriver):
        capabilities = replace(MemoryDriver.capabilities, counts_deliveries=False)

    driver = Uncounted(broker_name)
    Worker(driver, {}, max_deliveries=3, stop_when=lambda: True, handle_signals=False).run()

    assert "does not count deliveries" in hermes_log.text
    with pytest.raises(ValueError, match="max_deliveries must be an int >= 0"):
        Worker(driver, {}, max_deliveries=-1)


# A consumer whose connection needs servicing while handlers run ------------------

#: Long enough for what takes milliseconds on a slow shared machine.
GENEROUS_S = 10.0


class _ServicedConsumer(Consumer):
    """A memory consumer that needs servicing: counts the calls, and any overlap with a receive."""

    def __init__(self, inner: Consumer, fail: Exception | None = None) -> None:
        self.inner = inner
        self.fail = fail
        self.lock = threading.Lock()
        self.inside = 0
        self.overlapped = False
        self.services = 0
        self.service_threads: set[int] = set()

    @contextmanager
    def _alone(self) -> Iterator[None]:
        with self.lock:
            self.inside += 1
            self.overlapped = self.overlapped or self.inside > 1
        try:
            yield
        finally:
            with self.lock:
                self.inside -= 1

    def receive(self, timeout_s: float) -> Received | None:
        with self._alone():
            return self.inner.receive(timeout_s)

    def service(self) -> None:
        with self._alone():
            with self.lock:
                self.services += 1
                self.service_threads.add(threading.get_ident())
            if self.fail is not None:
                raise self.fail

    def ack(self, received: Received) -> None:
        self.inner.ack(received)

    def release(self, received: Received) -> None:
        self.inner.release(received)

    def close(self) -> None:
        self.inner.close()


class _ServicedDriver(MemoryDriver):
    fail: Exception | None = None

    def consumer(self, priorities: Any, *, concurrency: int = 1) -> Consumer:
        self.made = _ServicedConsumer(
            super().consumer(priorities, concurrency=concurrency), self.fail
        )
        return self.made


def _wait_for(condition: Any) -> bool:
    """Whether ``condition()`` held within :data:`GENEROUS_S` (handlers must not raise it)."""
    deadline = time.monotonic() + GENEROUS_S
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_consumer_that_needs_it_is_serviced_while_every_handler_thread_is_busy(
    broker_name: str, concurrency: int
) -> None:
    driver = _ServicedDriver(broker_name)
    for n in range(concurrency):
        driver.send(Message("long", {"n": n}))
    busy = threading.Barrier(concurrency)
    handler_threads: set[int] = set()
    serviced: list[bool] = []

    def long_job(message: Message) -> None:
        handler_threads.add(threading.get_ident())
        busy.wait(GENEROUS_S)  # every handler thread is in a handler now
        seen = driver.made.services
        serviced.append(_wait_for(lambda: driver.made.services >= seen + 3))

    worker = Worker(
        driver,
        {"long": long_job},
        concurrency=concurrency,
        max_items=concurrency,
        handle_signals=False,
    )
    stats = worker.run()

    consumer = driver.made
    assert serviced == [True] * concurrency, "not serviced while every handler thread was busy"
    assert stats.processed == concurrency
    assert [(q.ready, q.in_flight) for q in driver.queue_stats()] == [(0, 0)]
    assert not consumer.overlapped, "service() ran while another thread was in the consumer"
    assert consumer.service_threads.isdisjoint(handler_threads)
    driver.teardown()


def test_a_consumer_that_does_not_override_service_gets_no_servicing_thread(
    driver: MemoryDriver,
) -> None:
    driver.send(Message("job"))
    names: list[str] = []

    def job(message: Message) -> None:
        time.sleep(0.6)  # longer than a servicing interval; no timing is asserted
        names.extend(thread.name for thread in threading.enumerate())

    Worker(driver, {"job": job}, max_items=1, handle_signals=False).run()

    assert names and "hermes-service" not in names


def test_a_consumer_that_cannot_be_serviced_is_logged_once_and_the_run_goes_on(
    broker_name: str, hermes_log: pytest.LogCaptureFixture
) -> None:
    from hermes.core import BrokerUnavailableError

    driver = _ServicedDriver(broker_name)
    driver.fail = BrokerUnavailableError("the connection is gone")
    driver.send(Message("long"))

    tried: list[bool] = []

    def long_job(message: Message) -> None:
        tried.append(_wait_for(lambda: driver.made.services >= 3))

    stats = Worker(driver, {"long": long_job}, max_items=1, handle_signals=False).run()

    assert tried == [True], "servicing was not tried several times"
    assert stats.processed == 1
    lines = [r for r in hermes_log.records if "keep the consumer's connection alive" in r.message]
    assert len(lines) == 1 and "the connection is gone" in lines[0].getMessage()
    driver.teardown()


def test_a_handler_that_finishes_as_the_grace_period_ends_is_settled_or_abandoned_not_both(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    acked: list[str] = []
    runs: list[Worker] = []

    class AckedAsTheGraceEnds(MemoryDriver):
        def consumer(self, priorities: Any, *, concurrency: int = 1) -> Consumer:
            inner = super().consumer(priorities, concurrency=concurrency)
            original_ack = inner.ack

            def ack(received: Received) -> None:
                # The handler returned in time; its acknowledgement is still under way
                # when the run gives up waiting.
                loop = runs[0]._loop
                deadline = time.monotonic() + 10
                while not (loop is not None and loop.abandoned) and time.monotonic() < deadline:
                    time.sleep(0.005)
                original_ack(received)
                acked.append(received.message.id if received.message else "?")

            inner.ack = ack  # type: ignore[method-assign]
            return inner

    acking = AckedAsTheGraceEnds(driver.name)
    message = Message("quick")
    acking.send(message)
    worker = Worker(
        acking, {"quick": lambda m: None}, concurrency=2, grace_s=0, max_items=1,
        handle_signals=False,
    )  # fmt: skip
    runs.append(worker)
    stats = worker.run()

    # One of the two, never both and never neither, whichever the scheduler let
    # come first: the acknowledgement under way wins (settled, counted, nothing
    # said of the grace period), or the grace period ended before the handler's
    # thread reached its settle (not acknowledged, not counted, and the log says
    # the broker delivers it again).
    if acked:
        assert acked == [message.id]
        assert stats.processed == 1
        assert "grace period" not in hermes_log.text
    else:
        assert stats.processed == 0
        # The run has returned; the handler's thread may still be on its way to the
        # settle it must not make, and says so when it gets there.
        deadline = time.monotonic() + 10
        while "outlived the grace period" not in hermes_log.text:
            assert time.monotonic() < deadline, hermes_log.text
            time.sleep(0.01)
        assert "the broker delivers it again" in hermes_log.text


def test_a_worker_stopped_and_run_again_starts_a_fresh_run(driver: MemoryDriver) -> None:
    seen: list[str] = []
    worker = Worker(driver, {"a": lambda m: seen.append(m.id)}, max_items=1, handle_signals=False)
    worker.stop()
    first = worker.run()
    assert (first.stopped_by, first.started) == ("stop()", 0)

    message = Message("a")
    driver.send(message)
    second = worker.run()
    assert (second.stopped_by, second.processed) == ("max items", 1)
    assert seen == [message.id]

    def stops_its_run(message: Message) -> None:
        seen.append(message.id)
        if message.id == first_message.id:
            stopping.stop()  # during the run: it ends that run only

    stopping = Worker(driver, {"a": stops_its_run}, handle_signals=False)
    first_message, second_message = Message("a"), Message("a")
    driver.send(first_message)
    assert stopping.run().stopped_by == "stop()"
    driver.send(second_message)
    stopping.max_items = 1
    assert stopping.run().stopped_by == "max items"
    assert seen[1:] == [first_message.id, second_message.id]


def test_a_run_that_ends_leaves_the_event_loop_to_another_run_of_its_dispatcher(
    broker_name: str,
) -> None:
    slow_driver = MemoryDriver(f"{broker_name}-slow")
    quick_driver = MemoryDriver(f"{broker_name}-quick")
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    class Slow:
        async def handle(self, message: Message) -> bool:
            started.set()
            while not release.is_set():
                await asyncio.sleep(0.005)
            finished.append(message.id)
            return True

    class Quick:
        async def handle(self, message: Message) -> bool:
            return True

    dispatcher = Dispatcher(slow_driver)
    dispatcher.register_handler("slow", Slow())
    dispatcher.register_handler("quick", Quick())
    slow, quick = Message("slow"), Message("quick")
    slow_driver.send(slow)
    quick_driver.send(quick)
    slow_run = threading.Thread(
        target=Worker(slow_driver, dispatcher, max_items=1, handle_signals=False).run
    )
    slow_run.start()
    try:
        assert started.wait(10)
        # A second run of the same Dispatcher starts and ends while the slow handler awaits.
        Worker(quick_driver, dispatcher, max_items=1, handle_signals=False).run()
    finally:
        release.set()
        slow_run.join(10)
    try:
        assert finished == [slow.id]
        assert (dispatcher.stats.handled, dispatcher.stats.failed) == (2, 0)
    finally:
        slow_driver.teardown()
        quick_driver.teardown()
