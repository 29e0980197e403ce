"""Periodic ticks per entry: fired (emitted by this scheduler) and skipped (by catch-up policy)."""

from __future__ import annotations

from prometheus_client import Counter

from hermes.core import hookimpl
from hermes.core.schedule import Entry, Tick

TICKS = Counter(
    "hermes_ticks",
    "Periodic ticks settled by this process's scheduler: fired (emitted) or skipped "
    "(missed, left out by the entry's catch_up policy). Summed over every scheduler, "
    "each tick is counted once.",
    ["entry", "outcome"],
)


@hookimpl
def hermes_tick(entry: Entry, tick: Tick, fired: bool) -> None:
    TICKS.labels(entry.name, "fired" if fired else "skipped").inc()
