"""Pausing a priority fleet-wide: the record on the registry, and the Worker skipping it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hermes.core import Emitter, Message, Worker
from hermes.core.drivertools import MemoryDriver
from hermes.core.heartbeat import HeartbeatPublisher, live_workers, pause, paused_priorities, resume
from hermes.core.run._heartbeat import PAUSED_KEY

HIGH = 300


def wait_for(predicate: Any, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


@pytest.fixture
def two_queues(driver: MemoryDriver) -> MemoryDriver:
    driver.setup_priority_queue("high", HIGH)
    return driver


class Running:
    """A Worker on its own thread, beating every 50 ms; what its handlers ran, in order."""

    def __init__(self, driver: MemoryDriver, *, concurrency: int = 1, **kwargs: Any) -> None:
        self.ran: list[str] = []
        self.hold = threading.Event()
        self.hold.set()

        def job(message: Message) -> None:
            self.hold.wait(30)
            self.ran.append(message.id)

        self.worker = Worker(
            driver,
            {"job": job},
            concurrency=concurrency,
            handle_signals=False,
            heartbeat=HeartbeatPublisher(driver, url="memory://x", interval_s=0.05),
            **kwargs,
        )
        self.stats: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.stats = self.worker.run()

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hold.set()
        self.worker.stop()
        self.thread.join(15)
        assert not self.thread.is_alive()


@pytest.fixture
def emit(two_queues: MemoryDriver) -> Iterator[Any]:
    emitter = Emitter(two_queues)

    def send(job_id: str, priority: int) -> None:
        emitter.emit(Message("job", {}, id=job_id), priority=priority)

    yield send


def test_a_paused_priority_is_not_taken_and_runs_once_resumed(
    two_queues: MemoryDriver, emit: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hermes")
    assert pause(two_queues, HIGH, "by the test")
    with Running(two_queues) as run:
        emit("high-1", HIGH)
        emit("low-1", 100)
        assert wait_for(lambda: "low-1" in run.ran)
        (record,) = live_workers(two_queues)
        assert wait_for(lambda: live_workers(two_queues)[0]["paused"] == [HIGH]), record
        assert "high-1" not in run.ran

        assert resume(two_queues, HIGH, "by the test")
        assert wait_for(lambda: "high-1" in run.ran)
        assert wait_for(lambda: live_workers(two_queues)[0]["paused"] == [])
    assert "Priority 300 resumed: taking it again" in caplog.text


def test_a_pause_made_while_the_worker_runs_holds_within_a_poll(
    two_queues: MemoryDriver, emit: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hermes")
    with Running(two_queues) as run:
        emit("high-1", HIGH)
        assert wait_for(lambda: "high-1" in run.ran)
        assert pause(two_queues, HIGH, "from the test")
        assert wait_for(lambda: live_workers(two_queues)[0]["paused"] == [HIGH])
        emit("high-2", HIGH)
        emit("low-1", 100)
        assert wait_for(lambda: "low-1" in run.ran)
        time.sleep(0.3)  # a worker that still read 300 would have taken it by now
        assert "high-2" not in run.ran
    assert "Priority 300 paused from the test: finishing what runs" in caplog.text


def test_a_job_running_when_its_priority_is_paused_finishes_past_the_grace_period(
    two_queues: MemoryDriver, emit: Any
) -> None:
    with Running(two_queues, concurrency=2, grace_s=0.05) as run:
        run.hold.clear()
        emit("long", HIGH)
        assert wait_for(lambda: live_workers(two_queues)[0]["in_flight"])
        assert pause(two_queues, HIGH, "from the test")
        assert wait_for(lambda: run.worker._pause_version > 0)
        time.sleep(0.3)  # six grace periods: a stop would have left it unsettled by now
        run.hold.set()
        assert wait_for(lambda: "long" in run.ran)
        emit("low-1", 100)
        assert wait_for(lambda: "low-1" in run.ran)
    assert run.stats.processed == 2  # both acknowledged: the long one was not abandoned
    assert two_queues.queue_stats()[0].in_flight in (0, None)


def test_a_worker_whose_every_priority_is_paused_takes_nothing_and_still_stops(
    two_queues: MemoryDriver, emit: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hermes")
    pause(two_queues, HIGH, "by the test")
    pause(two_queues, 100, "by the test")
    with Running(two_queues) as run:
        emit("high-1", HIGH)
        emit("low-1", 100)
        assert wait_for(lambda: "Every priority this worker reads is paused" in caplog.text)
        time.sleep(0.3)
        assert run.ran == []
        stopped_at = time.monotonic()
    assert time.monotonic() - stopped_at < 10
    assert run.stats.stopped_by == "stop()"


def test_a_worker_reading_only_other_priorities_is_not_switched(
    two_queues: MemoryDriver, emit: Any
) -> None:
    pause(two_queues, HIGH, "by the test")
    with Running(two_queues, priorities=[100]) as run:
        emit("low-1", 100)
        assert wait_for(lambda: "low-1" in run.ran)
        assert live_workers(two_queues)[0]["paused"] == []


def test_pausing_twice_or_resuming_what_is_not_paused_changes_nothing(
    driver: MemoryDriver,
) -> None:
    assert pause(driver, 100, "by a")
    assert not pause(driver, 100, "by b")
    assert paused_priorities(driver)[100]["by"] == "by a"
    assert resume(driver, 100, "by a")
    assert not resume(driver, 100, "by a")
    assert paused_priorities(driver) == {}


def test_an_unreadable_paused_record_reads_as_nothing_paused_and_is_logged(
    driver: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    driver.record_put(PAUSED_KEY, b"[not json", 60, None)
    assert paused_priorities(driver) == {}
    assert "The paused priorities record 'hermes-paused' is not readable" in caplog.text
