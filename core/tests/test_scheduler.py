"""The Scheduler: each tick emitted once among many schedulers; missed ticks by each policy."""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
import threading
from collections import Counter

import pytest

from hermes.core import Message, NotSupportedError, hookimpl
from hermes.core.drivertools import MessageSerializer
from hermes.core.schedule import LocalClaims, Schedule, Scheduler
from hermes.core.spi._memory import MemoryDriver
from hermes.core.spi._registry import plugin_manager

_names = itertools.count()
MINUTE = 60.0
#: 2025-01-01T00:00:00Z, a minute boundary.
T0 = 1735689600.0


@pytest.fixture
def memory() -> MemoryDriver:
    driver = MemoryDriver(f"scheduler-test-{next(_names)}")
    yield driver  # type: ignore[misc]
    driver.teardown()


def queued(driver: MemoryDriver) -> list[Message]:
    with driver._broker.condition:
        bodies = [body for queue in driver._broker.queues.values() for body in queue]
    serializer = MessageSerializer()
    return [serializer.unserialize(body) for body in bodies]


def minutely(catch_up: str = "once") -> Schedule:
    schedule = Schedule()
    schedule.every(
        minutes=1, type="ping", name="ping", catch_up=catch_up, payload=lambda t: {"key": t.key}
    )
    return schedule


def emitted_keys(driver: MemoryDriver) -> list[str]:
    return [message.payload["key"] for message in queued(driver)]


def test_a_tick_is_emitted_once_when_it_is_due_and_not_again() -> None:
    memory = MemoryDriver(f"scheduler-test-{next(_names)}")
    scheduler = Scheduler(minutely(), memory, catch_up=False, clock=lambda: T0 - 1)
    assert scheduler.run_pending(T0 - 1) == []
    [result] = scheduler.run_pending(T0 + 0.2)
    assert (result.outcome, result.key, result.late_s >= 0) == (
        "emitted",
        "ping@2025-01-01T00:00:00Z",
        True,
    )
    assert scheduler.run_pending(T0 + 30) == []
    assert emitted_keys(memory) == ["ping@2025-01-01T00:00:00Z"]
    memory.teardown()


def test_many_schedulers_on_one_broker_emit_each_tick_once(memory: MemoryDriver) -> None:
    schedulers = [
        Scheduler(minutely("all"), MemoryDriver(memory.name), catch_up=False, clock=lambda: T0 - 1)
        for _ in range(5)
    ]
    barrier = threading.Barrier(len(schedulers))

    def run(scheduler: Scheduler) -> None:
        for minute in range(10):
            barrier.wait()
            scheduler.run_pending(T0 + minute * MINUTE + 0.1)

    threads = [threading.Thread(target=run, args=(s,)) for s in schedulers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    keys = emitted_keys(memory)
    assert len(keys) == len(set(keys)) == 10
    outcomes = Counter(o for s in schedulers for o, n in s.counts.items() for _ in range(n))
    assert outcomes == {"emitted": 10, "taken": 40}


def started_then_down(memory: MemoryDriver, catch_up: str, down_minutes: int) -> Scheduler:
    """A scheduler that fired T0, then every scheduler was down: a new one starts later.

    Its catch-up window reaches back to T0 and no further.
    """
    first = Scheduler(minutely(catch_up), memory, catch_up=False, clock=lambda: T0 - 1)
    first.run_pending(T0 + 0.1)
    window_s = (down_minutes + 1) * MINUTE - 1
    return Scheduler(minutely(catch_up), MemoryDriver(memory.name), catch_up_window_s=window_s)


def test_catch_up_once_emits_one_message_for_the_missed_ticks(memory: MemoryDriver) -> None:
    again = started_then_down(memory, "once", 5)
    results = again.run_pending(T0 + 5 * MINUTE + 0.1)
    assert Counter(r.outcome for r in results) == {"emitted": 1, "skipped": 4, "taken": 1}
    assert emitted_keys(memory) == ["ping@2025-01-01T00:00:00Z", "ping@2025-01-01T00:05:00Z"]


def test_catch_up_all_emits_every_missed_tick_oldest_first(memory: MemoryDriver) -> None:
    again = started_then_down(memory, "all", 5)
    again.run_pending(T0 + 5 * MINUTE + 0.1)
    assert emitted_keys(memory) == [f"ping@2025-01-01T00:0{m}:00Z" for m in range(6)]


def test_catch_up_none_skips_missed_ticks_and_emits_only_one_that_is_on_time(
    memory: MemoryDriver,
) -> None:
    again = started_then_down(memory, "none", 5)
    results = again.run_pending(T0 + 5 * MINUTE + 3)  # 3 s late is on time
    assert Counter(r.outcome for r in results) == {"emitted": 1, "skipped": 4, "taken": 1}
    late = started_then_down(MemoryDriver(f"scheduler-test-{next(_names)}"), "none", 5)
    results = late.run_pending(T0 + 5 * MINUTE + 30)  # 30 s late is missed
    assert Counter(r.outcome for r in results) == {"skipped": 5, "taken": 1}


def test_catch_up_looks_back_only_over_its_window(memory: MemoryDriver) -> None:
    scheduler = Scheduler(minutely("all"), memory, catch_up_window_s=10 * MINUTE)
    results = scheduler.run_pending(T0 + 0.1)
    assert len(results) == 10  # the ticks of (T0 - 10 min, T0]: a new entry catches up too


def test_two_schedulers_catching_up_at_once_emit_each_missed_tick_once(
    memory: MemoryDriver,
) -> None:
    started_then_down(memory, "all", 5)
    late = [
        Scheduler(minutely("all"), MemoryDriver(memory.name), catch_up_window_s=6 * MINUTE - 1)
        for _ in range(4)
    ]
    threads = [threading.Thread(target=s.run_pending, args=(T0 + 5 * MINUTE + 0.1,)) for s in late]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    keys = emitted_keys(memory)
    assert sorted(keys) == [f"ping@2025-01-01T00:0{m}:00Z" for m in range(6)]


def test_a_jittered_tick_fires_late_by_its_share_and_no_sooner(memory: MemoryDriver) -> None:
    schedule = Schedule()
    entry = schedule.every(minutes=1, type="ping", jitter_s=30)
    scheduler = Scheduler(schedule, memory, catch_up=False, clock=lambda: T0 - 1)
    fire = entry.fire_at(T0)
    assert scheduler.run_pending(fire - 0.01) == []
    assert [r.outcome for r in scheduler.run_pending(fire)] == ["emitted"]


def test_a_driver_without_claims_needs_a_lock_or_local_claims(memory: MemoryDriver) -> None:
    class NoClaims(MemoryDriver):
        claim = None  # type: ignore[assignment]

    with pytest.raises(NotSupportedError, match="--lock-url"):
        Scheduler(minutely(), NoClaims(memory.name))
    scheduler = Scheduler(minutely(), NoClaims(memory.name), claims=LocalClaims(), catch_up=False)
    scheduler.run_pending(T0 + 1)
    assert scheduler.counts == {}


def test_each_settled_tick_is_one_info_line_and_one_hook_call(
    memory: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[str, bool]] = []

    class Spy:
        @hookimpl
        def hermes_tick(self, entry, tick, fired):  # type: ignore[no-untyped-def]
            seen.append((tick.key, fired))

    spy = Spy()
    plugin_manager().register(spy)
    try:
        caplog.set_level(logging.INFO, logger="hermes")
        again = started_then_down(memory, "once", 2)
        caplog.clear()
        again.run_pending(T0 + 2 * MINUTE + 0.1)
    finally:
        plugin_manager().unregister(spy)
    assert seen == [
        ("ping@2025-01-01T00:00:00Z", True),
        ("ping@2025-01-01T00:02:00Z", True),
        ("ping@2025-01-01T00:01:00Z", False),
    ]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(lines) == 2
    assert lines[0].startswith("Tick ping@2025-01-01T00:02:00Z: emitted message #")
    assert lines[1].startswith("Tick ping@2025-01-01T00:01:00Z skipped")


def test_a_payload_function_that_raises_is_logged_and_other_entries_and_later_ticks_go_on(
    memory: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    calls = Counter[str]()

    def broken_once(tick: object) -> dict[str, str]:
        calls["bad"] += 1
        if calls["bad"] == 1:
            raise KeyError("report_id")
        return {"key": "bad"}

    schedule = Schedule()
    schedule.every(minutes=1, type="bad", name="bad", payload=broken_once)
    schedule.every(minutes=1, type="ping", name="ping", payload=lambda t: {"key": t.key})
    scheduler = Scheduler(schedule, memory, catch_up=False, clock=lambda: T0 - 1)

    first = scheduler.run_pending(T0 + 0.1)

    assert sorted((r.entry.name, r.outcome) for r in first) == [
        ("bad", "lost"),
        ("ping", "emitted"),
    ]
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    text = error.getMessage()
    assert "bad" in text and "bad@2025-01-01T00:00:00Z" in text and "report_id" in text
    assert error.exc_info is not None
    later = scheduler.run_pending(T0 + MINUTE + 0.1)
    assert sorted((r.entry.name, r.outcome) for r in later) == [
        ("bad", "emitted"),
        ("ping", "emitted"),
    ]


def test_the_scheduler_s_run_goes_on_after_a_payload_function_raises(
    memory: MemoryDriver,
) -> None:
    now = [T0 + 0.1]

    def broken(tick: object) -> None:
        raise RuntimeError("always")

    schedule = Schedule()
    schedule.every(seconds=1, type="bad", name="bad", payload=broken)
    scheduler = Scheduler(schedule, memory, catch_up=False, clock=lambda: now[0])
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        deadline = T0 + 30
        while scheduler.counts["lost"] < 2 and now[0] < deadline:
            now[0] += 0.5
            thread.join(0.05)
            assert thread.is_alive()
    finally:
        scheduler.stop()
        thread.join(5)
    assert scheduler.counts["lost"] >= 2


#: Every named logger's settings, before and after importing a module, in a fresh interpreter.
LOGGERS_AROUND_IMPORT = """
import importlib
import logging
import sys

import hermes.core  # what the module imports besides, imported first


def settings():
    loggers = {"": logging.getLogger()}
    for name, logger in logging.Logger.manager.loggerDict.items():
        if isinstance(logger, logging.Logger):
            loggers[name] = logger
    return {
        name: (logger.level, len(logger.handlers), len(logger.filters), logger.propagate)
        for name, logger in loggers.items()
    }


before = settings()
importlib.import_module(sys.argv[1])
after = settings()
untouched = (logging.NOTSET, 0, 0, True)
changed = {n: s for n, s in after.items() if s != before.get(n, untouched)}
print(changed)
"""


def test_importing_the_scheduler_configures_no_logger() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOGGERS_AROUND_IMPORT, "hermes.core.run._scheduler"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{}"


def test_a_scheduler_s_emits_log_the_tick_not_the_emitter_s_line_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = MemoryDriver(f"sched-quiet-{next(_names)}")
    schedule = Schedule()
    schedule.every(seconds=60, type="ping", catch_up="once")
    caplog.set_level(logging.DEBUG)
    now = 1_000_000.0
    scheduler = Scheduler(schedule, driver, clock=lambda: now)
    scheduler.run_pending(now)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("Tick ") and "emitted message" in m for m in messages), messages
    assert not any(m.startswith("Emitted message") for m in messages), messages
    assert logging.getLogger("hermes.scheduler.emitter").level == logging.NOTSET
    driver.teardown()
