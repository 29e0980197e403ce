"""Queue counts and purging (``SupportsStats``, ``SupportsPurge``): what ``hermes stats`` shows.

For a driver that counts its queues: 5 messages sent are 5 ready; 3 sent
for ten minutes from now are 3 scheduled where the driver holds delays (3
more ready where it delivers at once); a worker blocked inside its handler
makes 1 in flight (more when its consumer takes messages ahead, each one taken
from ready). A count the broker cannot give is None, never 0, and is
reported as not verified. ``purge()`` then deletes what waits and says how
many it deleted. Counts of some brokers are approximate and lag behind (SQS):
every check polls to a deadline.
"""

from __future__ import annotations

import threading
import time

import pytest

from hermes.conformance._harness import DELIVERY_S, STOP_S, Kit, wait_until
from hermes.conformance._worker import JOB
from hermes.core import DEFAULT_PRIORITY, Message
from hermes.core.driver import Delay, Driver, QueueStats, SupportsPurge, SupportsStats

_READY = 5
_SCHEDULED = 3
_LATER_S = 600.0


def _row(driver: Driver) -> QueueStats:
    assert isinstance(driver, SupportsStats), f"{driver!r} has no queue_stats()"
    rows = driver.queue_stats()
    matching = [row for row in rows if row.priority == DEFAULT_PRIORITY]
    assert len(matching) == 1, f"queue_stats() has {len(matching)} rows for priority 100: {rows}"
    return matching[0]


def _settles(driver: Driver, field: str, expected: int) -> tuple[bool, int | None]:
    """Whether ``field`` of the default queue reaches ``expected`` within the deadline."""
    seen: list[int | None] = [None]

    def reached() -> bool:
        seen[0] = getattr(_row(driver), field)
        return seen[0] == expected

    return wait_until(reached, DELIVERY_S), seen[0]


class _Blocks:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def handle(self, message: Message) -> bool:
        self.started.set()
        self.release.wait(DELIVERY_S + STOP_S)
        return True


@pytest.mark.hermes_check("queue stats", "ready, scheduled, in flight, then purge")
def test_queue_stats_count_ready_scheduled_and_in_flight_and_purge_deletes_what_waits(
    hermes_kit: Kit,
) -> None:
    driver = hermes_kit.driver()
    if not isinstance(driver, SupportsStats) or not isinstance(driver, SupportsPurge):
        pytest.skip("not verified: the driver has no queue_stats() and purge()")
    caps = hermes_kit.capabilities
    unknown: list[str] = []

    for n in range(_READY):
        hermes_kit.emit(hermes_kit.message(n))
    ok, seen = _settles(driver, "ready", _READY)
    assert ok, f"{_READY} messages sent: queue_stats() says ready={seen}"

    later = time.time() + _LATER_S
    for n in range(_SCHEDULED):
        hermes_kit.emit(hermes_kit.message(_READY + n, execute_at=later))
    in_ready = 0  # scheduled messages a broker counts as ready (it cannot tell them apart)
    if caps.delay is Delay.NATIVE:
        if _row(driver).scheduled is None:
            unknown.append("scheduled")
            ready = _row(driver).ready
            assert ready in (_READY, _READY + _SCHEDULED), (
                f"{_SCHEDULED} messages due later and scheduled unknown: ready={ready}, not "
                f"{_READY} (held apart) or {_READY + _SCHEDULED} (counted as waiting)"
            )
            in_ready = (ready or 0) - _READY
        else:
            ok, seen = _settles(driver, "scheduled", _SCHEDULED)
            assert ok, f"{_SCHEDULED} messages due in {_LATER_S:.0f} s: scheduled={seen}"
        waiting_ready = _READY + in_ready
    else:
        ok, seen = _settles(driver, "ready", _READY + _SCHEDULED)
        assert ok, (
            f"delay=IGNORED: {_SCHEDULED} messages with a future execute_at are ready at once, "
            f"so ready should be {_READY + _SCHEDULED}, not {seen}"
        )
        waiting_ready = _READY + _SCHEDULED

    blocker = _Blocks()
    worker_driver = hermes_kit.driver()
    worker = hermes_kit.worker(driver=worker_driver, handlers={JOB: [blocker]}, max_items=1)
    try:
        assert blocker.started.wait(DELIVERY_S), "the worker never started a handler"
        if _row(driver).in_flight is None:
            # A broker that cannot tell in flight from waiting (Kafka's lag counts
            # every record not committed) may still count it as ready.
            unknown.append("in flight")
            ready = _row(driver).ready
            assert ready in (waiting_ready - 1, waiting_ready), (
                f"with one message in a handler and in flight unknown, ready={ready}, not "
                f"{waiting_ready - 1} or {waiting_ready}"
            )
        else:
            # In flight is what workers took and have not settled: the one in the handler,
            # and any a consumer claimed ahead of it (prefetch). Taking ahead moves
            # messages from ready to in flight, and loses none.
            counts: list[tuple[int | None, int | None]] = [(None, None)]

            def taken() -> bool:
                row = _row(driver)
                counts[0] = (row.in_flight, row.ready)
                in_flight, ready = counts[0]
                return (
                    in_flight is not None
                    and ready is not None
                    and in_flight >= 1
                    and ready + in_flight == waiting_ready
                )

            assert wait_until(taken, DELIVERY_S), (
                f"a worker blocked inside its handler: in_flight={counts[0][0]}, "
                f"ready={counts[0][1]}; in flight should be 1 (more when its consumer takes "
                f"ahead) and ready + in flight {waiting_ready}"
            )
    finally:
        blocker.release.set()
    assert worker.join(STOP_S), "the worker with max items 1 did not return"
    worker.check()

    held_apart = _SCHEDULED if caps.delay is Delay.NATIVE and not in_ready else 0
    waiting = waiting_ready - 1 + held_apart
    removed = driver.purge()
    assert removed == waiting, f"purge() deleted {removed} messages; {waiting} were waiting"
    ok, seen = _settles(driver, "ready", 0)
    assert ok, f"after purge(), ready={seen}"
    if caps.delay is Delay.NATIVE and "scheduled" not in unknown:
        ok, seen = _settles(driver, "scheduled", 0)
        assert ok, f"after purge(), scheduled={seen}"
    if unknown:
        hermes_kit.claim(f"ready and purge ({' and '.join(unknown)}: the broker cannot say)")
    else:
        hermes_kit.claim("ready, scheduled, in flight and purge")
