"""Tick counters: a scheduler's fired and skipped ticks, per entry."""

from __future__ import annotations

import itertools

from prometheus_client import REGISTRY

from hermes.core.schedule import Schedule, Scheduler
from hermes.core.spi._memory import MemoryDriver

_names = itertools.count()
T0 = 1735689600.0


def value(entry: str, outcome: str) -> float:
    labels = {"entry": entry, "outcome": outcome}
    return REGISTRY.get_sample_value("hermes_ticks_total", labels) or 0.0


def test_fired_and_skipped_ticks_are_counted_per_entry() -> None:
    name = f"metrics-ticks-{next(_names)}"
    schedule = Schedule()
    schedule.every(minutes=1, type="ping", name=name)
    driver = MemoryDriver(name)
    try:
        Scheduler(schedule, driver, catch_up_window_s=3 * 60 - 1).run_pending(T0 + 0.1)
        # The window held T0 - 2 min, T0 - 1 min and T0: one emit stands for all three.
        assert (value(name, "fired"), value(name, "skipped")) == (1.0, 2.0)
    finally:
        driver.teardown()
