"""The async path of a concurrent worker: coroutines in flight without a thread each.

A message whose handlers are all ``async def`` runs as a task on the
Dispatcher's event loop; ``concurrency`` bounds the messages in flight, sync
and async together; the work around each handler (records, retries,
settles) runs on threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from hermes.core import (
    Dispatcher,
    Emitter,
    Message,
    RetryableHandler,
    RetryMixin,
    Worker,
    connect,
    hookimpl,
)
from hermes.core.app._invoke import Awaiting, EventLoopThread
from hermes.core.driver import Consumer, Received
from hermes.core.drivertools import MemoryDriver, isolated_url
from hermes.core.jobs import Jobs, JobState, current_job
from hermes.core.run import _worker
from hermes.core.run._worker import handler_mix
from hermes.core.spi._registry import plugin_manager

DEADLINE_S = 20.0
EVENT_LOOP = "hermes-event-loop"


@pytest.fixture(autouse=True)
def no_thread_paired_plugins() -> Iterator[None]:
    """Unregister installed plugins that pair hooks by thread (none of Hermes's own do).

    With one of them the worker keeps a thread per message: see
    ``test_a_plugin_that_pairs_hooks_by_thread``.
    """
    manager = plugin_manager()
    removed: dict[str, object] = {}
    for hook in (manager.hook.hermes_message_started, manager.hook.hermes_handler_call):
        for impl in hook.get_hookimpls():
            if not getattr(impl.plugin, "hermes_async_safe", False):
                removed[impl.plugin_name] = impl.plugin
    for plugin in removed.values():
        manager.unregister(plugin)
    try:
        yield
    finally:
        for name, plugin in removed.items():
            manager.register(plugin, name=name)


def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


class _Settles(Consumer):
    """A consumer that writes down each settle and the thread it came from."""

    def __init__(self, inner: Consumer, log: list[tuple[str, str, str]]) -> None:
        self.inner = inner
        self.log = log

    def receive(self, timeout_s: float) -> Received | None:
        return self.inner.receive(timeout_s)

    def _note(self, what: str, received: Received) -> None:
        assert threading.current_thread().name != EVENT_LOOP, f"{what} on the event loop"
        message = received.message
        self.log.append((what, message.id if message else "", threading.current_thread().name))

    def ack(self, received: Received) -> None:
        self._note("ack", received)
        self.inner.ack(received)

    def release(self, received: Received) -> None:
        self._note("release", received)
        self.inner.release(received)

    def reject(self, received: Received, reason: str) -> None:
        self._note("reject", received)
        self.inner.reject(received, reason)

    def close(self) -> None:
        self.inner.close()


class SettlesDriver(MemoryDriver):
    """A memory driver whose consumers log their settles and whose sends refuse the event loop."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.settles: list[tuple[str, str, str]] = []
        self.sent: list[Message] = []

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _Settles(super().consumer(priorities, concurrency=concurrency), self.settles)

    def send(self, message: Message, *args: Any, **kwargs: Any) -> None:
        assert threading.current_thread().name != EVENT_LOOP, "a send on the event loop"
        self.sent.append(message)
        super().send(message, *args, **kwargs)

    def acked(self) -> int:
        return sum(1 for what, _, _ in self.settles if what == "ack")


@pytest.fixture
def driver() -> Iterator[SettlesDriver]:
    memory = SettlesDriver(f"async-worker-{uuid.uuid4().hex}")
    yield memory
    memory.teardown()


def run(driver: MemoryDriver, dispatcher: Dispatcher, **options: Any) -> Worker:
    worker = Worker(driver, dispatcher, handle_signals=False, **options)
    worker.run()
    return worker


def threads_now() -> int:
    return threading.active_count()


# In flight ------------------------------------------------------------------------


def test_an_async_only_worker_keeps_its_concurrency_in_flight_on_a_few_threads(
    driver: SettlesDriver,
) -> None:
    count, concurrency = 400, 200
    active = most = 0
    threads: list[int] = []

    class Waits:
        async def handle(self, message: Message) -> bool:
            nonlocal active, most
            active += 1  # only the event loop's thread touches these
            most = max(most, active)
            threads.append(threading.active_count())
            await asyncio.sleep(0.3)
            active -= 1
            return True

    for i in range(count):
        driver.send(Message("wait", {"i": i}))
    dispatcher = Dispatcher(driver).register_handler("wait", Waits())
    assert handler_mix(dispatcher) == "async"
    before = threads_now()
    worker = run(driver, dispatcher, concurrency=concurrency, max_items=count)

    assert worker.stats.processed == count and driver.acked() == count
    assert most == concurrency, "not as many in flight as the concurrency"
    # Two receiving threads, the event loop, four settle threads: not one per job.
    assert max(threads) - before <= 8, f"{max(threads) - before} threads for {concurrency} jobs"
    settled_on = {thread for _, _, thread in driver.settles}
    assert EVENT_LOOP not in settled_on


def test_concurrency_bounds_the_coroutines_in_flight(driver: SettlesDriver) -> None:
    active = most = 0

    async def job(message: Message) -> None:
        nonlocal active, most
        active += 1
        most = max(most, active)
        await asyncio.sleep(0.02)
        active -= 1

    for _ in range(40):
        driver.send(Message("job"))
    dispatcher = Dispatcher(driver)
    dispatcher.handler("job")(job)  # a FunctionHandler of an async def takes the async path
    assert handler_mix(dispatcher) == "async"
    worker = run(driver, dispatcher, concurrency=5, max_items=40)
    assert worker.stats.processed == 40
    assert most == 5


def test_mixed_handlers_sync_on_threads_async_on_the_loop_bounded_together(
    driver: SettlesDriver,
) -> None:
    lock = threading.Lock()
    active = most = 0
    where: dict[str, set[str]] = {"sync": set(), "async": set()}

    def enter(kind: str) -> None:
        nonlocal active, most
        with lock:
            active += 1
            most = max(most, active)
            where[kind].add(threading.current_thread().name)

    def leave() -> None:
        nonlocal active
        with lock:
            active -= 1

    class Blocks:
        def handle(self, message: Message) -> bool:
            enter("sync")
            time.sleep(0.05)
            leave()
            return True

    class Awaits:
        async def handle(self, message: Message) -> bool:
            enter("async")
            await asyncio.sleep(0.05)
            leave()
            return True

    for i in range(60):
        driver.send(Message("sync" if i % 3 == 0 else "async"))
    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("sync", Blocks()).register_handler("async", Awaits())
    assert handler_mix(dispatcher) == "mixed"
    worker = run(driver, dispatcher, concurrency=6, max_items=60)

    assert worker.stats.processed == 60
    assert most <= 6, f"{most} in flight at concurrency 6"
    assert where["async"] == {EVENT_LOOP}
    assert all(name.startswith("hermes-handler-") for name in where["sync"])


def test_a_plugin_that_pairs_hooks_by_thread_keeps_a_thread_per_message(
    driver: SettlesDriver,
) -> None:
    class PairsByThread:
        @hookimpl
        def hermes_message_started(self, message: Message, priority: int) -> None:
            pass

    class PairsByContext(PairsByThread):
        hermes_async_safe = True

    async def job(message: Message) -> None:
        pass

    dispatcher = Dispatcher(driver)
    dispatcher.handler("job")(job)
    manager = plugin_manager()
    for plugin, mix in ((PairsByThread(), "sync"), (PairsByContext(), "async")):
        manager.register(plugin, name="test-pairs")
        try:
            assert handler_mix(dispatcher) == mix
        finally:
            manager.unregister(plugin)


# Hand-offs between the threads and the event loop -------------------------------------


def test_coroutines_started_while_the_event_loop_is_busy_wake_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    event_loop = EventLoopThread()
    busy, free = threading.Event(), threading.Event()
    answers: list[Any] = []

    def done(value: Any, exc: BaseException | None) -> None:
        answers.append(exc or value)

    async def hold_the_loop() -> None:
        busy.set()
        free.wait(DEADLINE_S)  # blocks the loop's thread: nothing else runs on it meanwhile

    async def answer(i: int) -> int:
        return i

    try:
        event_loop.start(Awaiting(hold_the_loop(), None, None), contextvars.Context(), done)
        assert busy.wait(DEADLINE_S)
        loop = event_loop._running_loop()
        wakes: list[object] = []
        wake = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            wakes.append(args[0])
            return wake(*args, **kwargs)

        monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
        for i in range(50):
            event_loop.start(Awaiting(answer(i), None, None), contextvars.Context(), done)
        free.set()
        eventually(lambda: len(answers) == 51, "every coroutine ended")
        assert answers == [None, *range(50)]  # started in the order given
        assert len(wakes) == 1
    finally:
        free.set()
        event_loop.close()


def test_coroutines_that_end_together_are_settled_and_free_their_slots_in_lots(
    driver: SettlesDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    lots: list[int] = []
    submit = _worker._Settlers.submit

    def counted(self: _worker._Settlers, fn: Callable[..., None], *args: Any) -> None:
        lots.append(len(args[0]) if fn.__name__ == "_advance_all" else 1)
        submit(self, fn, *args)

    monkeypatch.setattr(_worker._Settlers, "submit", counted)
    frees: list[None] = []
    freed = _worker._ConcurrentRun._freed

    def counted_freed(self: _worker._ConcurrentRun) -> None:
        frees.append(None)
        freed(self)

    monkeypatch.setattr(_worker._ConcurrentRun, "_freed", counted_freed)
    waiting: list[asyncio.Future[None]] = []

    async def job(message: Message) -> None:
        future = asyncio.get_running_loop().create_future()
        waiting.append(future)
        await future

    def release_together() -> None:
        eventually(lambda: len(waiting) == 40, "40 coroutines wait")
        loop = waiting[0].get_loop()
        # One callback on the loop ends them all: they end in the same turn.
        loop.call_soon_threadsafe(lambda: [f.set_result(None) for f in waiting])

    for _ in range(40):
        driver.send(Message("job"))
    dispatcher = Dispatcher(driver)
    dispatcher.handler("job")(job)
    releaser = threading.Thread(target=release_together)
    releaser.start()
    run(driver, dispatcher, concurrency=40, max_items=40)
    releaser.join()
    assert driver.acked() == 40
    assert lots == [16, 16, 8]
    assert len(frees) == 3  # a thread waiting for a slot is woken once a lot


# Around the handler -----------------------------------------------------------------


class Overruns(RetryMixin, RetryableHandler):
    time_limit_s = 0.1

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    async def handle(self, message: Message) -> bool:
        try:
            await asyncio.sleep(DEADLINE_S)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return True


def test_a_coroutine_over_its_time_limit_is_cancelled_and_retried_from_a_thread(
    driver: SettlesDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hermes")
    handler = Overruns()
    driver.send(Message("slow"))
    dispatcher = Dispatcher(driver).register_handler("slow", handler)
    worker = run(driver, dispatcher, concurrency=10, max_items=1)

    assert handler.cancelled.is_set()
    assert worker.stats.processed == 1 and driver.acked() == 1
    retries = [m for m in driver.sent if m.retries == 1]
    assert len(retries) == 1, "no retry copy"
    assert any("timed out after 0.1 s" in r.getMessage() for r in caplog.records)


def test_the_job_s_cancel_cancels_its_coroutine_and_the_record_says_cancelled(
    driver: SettlesDriver,
) -> None:
    jobs = Jobs(f"memory://records-{uuid.uuid4().hex}")
    started = threading.Event()
    seen: list[object] = []

    class Sleeper:
        max_retry = 3

        async def handle(self, message: Message) -> bool:
            seen.append(current_job())
            started.set()
            await asyncio.sleep(DEADLINE_S * 10)
            return True

    message = Message("sleep")
    Emitter(driver, records=jobs).emit(message)
    dispatcher = Dispatcher(driver, records=jobs).register_handler("sleep", Sleeper())
    worker = threading.Thread(
        target=run, args=(driver, dispatcher), kwargs={"concurrency": 50, "max_items": 1}
    )
    worker.start()
    assert started.wait(DEADLINE_S)
    jobs.cancel(message.id)
    worker.join(DEADLINE_S)
    assert not worker.is_alive(), "the coroutine was not cancelled"

    record = jobs.get(message.id)
    assert record is not None and record.state is JobState.CANCELLED
    assert [m for m in driver.sent if m.retries] == [], "a cancelled job was retried"
    assert seen and seen[0] is not None and seen[0].id == message.id  # type: ignore[attr-defined]
    assert driver.acked() == 1
    jobs.close()


def test_records_and_hooks_run_off_the_event_loop_and_current_job_is_the_handler_s(
    driver: SettlesDriver,
) -> None:
    jobs = Jobs(f"memory://records-{uuid.uuid4().hex}")
    ids: list[tuple[str, str]] = []
    finished_on: list[str] = []

    class Observer:
        hermes_async_safe = True

        @hookimpl
        def hermes_message_finished(self, message: Message) -> None:
            finished_on.append(threading.current_thread().name)

    async def job(message: Message) -> None:
        await asyncio.sleep(0.01)
        running = current_job()
        assert running is not None
        ids.append((running.id, message.id))

    for _ in range(20):
        driver.send(Message("job"))
    dispatcher = Dispatcher(driver, records=jobs)
    dispatcher.handler("job")(job)
    manager = plugin_manager()
    observer = Observer()
    manager.register(observer, name="test-observer")
    try:
        run(driver, dispatcher, concurrency=10, max_items=20)
    finally:
        manager.unregister(observer)
    assert len(ids) == 20 and all(a == b for a, b in ids)
    assert len(finished_on) == 20 and EVENT_LOOP not in finished_on
    for _, message_id in ids:
        record = jobs.get(message_id)
        assert record is not None and record.state is JobState.SUCCEEDED
    jobs.close()


def test_a_coroutine_that_raises_is_retried_and_acknowledged(driver: SettlesDriver) -> None:
    class Fails(RetryMixin, RetryableHandler):
        async def handle(self, message: Message) -> bool:
            await asyncio.sleep(0)
            raise ValueError("no")

    driver.send(Message("fail"))
    dispatcher = Dispatcher(driver).register_handler("fail", Fails())
    run(driver, dispatcher, concurrency=4, max_items=1)
    assert [m.retries for m in driver.sent if m.retries] == [1]
    assert dispatcher.stats.failed == 1 and driver.acked() == 1


def test_steps_that_raise_after_a_coroutine_stop_the_run_and_release_the_message(
    driver: SettlesDriver,
) -> None:
    class Fails(RetryMixin, RetryableHandler):
        async def handle(self, message: Message) -> bool:
            raise ValueError("no")

    class Refuses(SettlesDriver):
        def send(self, message: Message, *args: Any, **kwargs: Any) -> None:
            if message.retries:
                raise RuntimeError("the broker refused the retry copy")
            super().send(message, *args, **kwargs)

    refusing = Refuses(f"async-worker-{uuid.uuid4().hex}")
    try:
        refusing.send(Message("fail"))
        dispatcher = Dispatcher(refusing).register_handler("fail", Fails())
        with pytest.raises(RuntimeError, match="refused"):
            run(refusing, dispatcher, concurrency=4)
        # Released, never acknowledged (a thread already inside receive may take it
        # once more before the run has stopped: it fails and is released again).
        assert {what for what, _, _ in refusing.settles} == {"release"}
    finally:
        refusing.teardown()


# Stopping ---------------------------------------------------------------------------


def test_coroutines_in_flight_finish_within_the_grace_period(driver: SettlesDriver) -> None:
    started = threading.Event()
    finished: list[str] = []

    async def job(message: Message) -> None:
        started.set()
        await asyncio.sleep(0.3)
        finished.append(message.id)

    for _ in range(10):
        driver.send(Message("job"))
    dispatcher = Dispatcher(driver)
    dispatcher.handler("job")(job)
    worker = Worker(driver, dispatcher, concurrency=10, grace_s=5, handle_signals=False)
    threading.Thread(target=lambda: (started.wait(DEADLINE_S), worker.stop())).start()
    worker.run()
    assert len(finished) == worker.stats.started == driver.acked() >= 1


def test_coroutines_past_the_grace_period_are_abandoned_unacknowledged_and_counted(
    driver: SettlesDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hermes")
    started = 0
    all_started = threading.Event()

    async def stuck(message: Message) -> None:
        nonlocal started
        started += 1
        if started == 5:
            all_started.set()
        await asyncio.sleep(DEADLINE_S * 10)

    for _ in range(5):
        driver.send(Message("stuck"))
    dispatcher = Dispatcher(driver)
    dispatcher.handler("stuck")(stuck)
    worker = Worker(driver, dispatcher, concurrency=50, grace_s=0.2, handle_signals=False)
    threading.Thread(target=lambda: (all_started.wait(DEADLINE_S), worker.stop())).start()
    began = time.monotonic()
    worker.run()

    assert time.monotonic() - began < DEADLINE_S
    assert driver.settles == [], "an abandoned message was settled"
    assert any(
        "5 handler(s) still running after the 0.2 s grace" in r.getMessage() for r in caplog.records
    )
    # The memory broker's lease runs out after the close: each comes back.
    back: list[Received] = []
    consumer = driver.consumer(())

    def all_back() -> bool:
        got = consumer.receive(0)
        if got is not None:
            back.append(got)
        return len(back) == 5

    eventually(all_back, "the abandoned messages are handed out again")


# Redis at least once: leases ----------------------------------------------------------


def _at_least_once(redis_url: str, lease_s: float) -> str:
    url = isolated_url(redis_url, f"async-worker-{uuid.uuid4().hex[:10]}")
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}delivery=at-least-once&lease_timeout={lease_s:g}"


def test_redis_leases_are_renewed_while_coroutines_outlive_them(redis_url: str) -> None:
    driver = connect(_at_least_once(redis_url, 1.0))
    runs: collections.Counter[str] = collections.Counter()

    async def slow(message: Message) -> None:
        runs[message.id] += 1
        await asyncio.sleep(2.5)  # well past the lease: only its renewal keeps it ours

    try:
        for _ in range(30):
            driver.send(Message("slow"))
        dispatcher = Dispatcher(driver)
        dispatcher.handler("slow")(slow)
        worker = run(driver, dispatcher, concurrency=30, max_items=30)
        assert worker.stats.processed == 30
        assert len(runs) == 30 and set(runs.values()) == {1}, "a lease ran out mid-coroutine"
        assert sum(row.ready or 0 for row in driver.queue_stats()) == 0  # type: ignore[attr-defined]
    finally:
        driver.teardown()  # type: ignore[attr-defined]
        driver.close()


def test_redis_coroutines_abandoned_at_the_grace_period_come_back(redis_url: str) -> None:
    url = _at_least_once(redis_url, 1.0)
    driver = connect(url)
    started = threading.Event()
    count = 0

    async def stuck(message: Message) -> None:
        nonlocal count
        count += 1
        if count == 3:
            started.set()
        await asyncio.sleep(DEADLINE_S * 10)

    done: list[str] = []

    async def quick(message: Message) -> None:
        done.append(message.id)

    try:
        sent = [Message("job") for _ in range(3)]
        for message in sent:
            driver.send(message)
        first = Dispatcher(driver)
        first.handler("job")(stuck)
        worker = Worker(driver, first, concurrency=10, grace_s=0.2, handle_signals=False)
        threading.Thread(target=lambda: (started.wait(DEADLINE_S), worker.stop())).start()
        worker.run()
        assert worker.stats.processed == 0

        again = connect(url)
        second = Dispatcher(again)
        second.handler("job")(quick)
        run(again, second, concurrency=10, max_items=3)
        assert sorted(done) == sorted(m.id for m in sent), "an abandoned message was lost"
        again.close()
    finally:
        driver.teardown()  # type: ignore[attr-defined]
        driver.close()
