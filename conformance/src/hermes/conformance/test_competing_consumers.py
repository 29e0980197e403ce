"""Competing consumers: several workers on one queue share its messages.

Three workers (threads with a driver object each; then processes, when the
driver crosses processes) and 300 messages. The count is Jepsen's total-queue
check: lost = sent - delivered, unexpected = delivered - sent, duplicated = ids
delivered more than once. No worker dies here, so with
``competing_consumers=True`` all three are 0; with ``False`` the driver only
promises that nothing is lost or invented.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from hermes.conformance._harness import (
    DELIVERY_S,
    QUIET_S,
    STOP_S,
    WORKER_START_S,
    Kit,
    TotalQueue,
    wait_for_progress,
    wait_quiet,
    wait_until,
)
from hermes.conformance._worker import Record
from hermes.core import SharedFileShutdown

_WORKERS = 3
_MESSAGES = 300


def _check(kit: Kit, how: str, check: TotalQueue, per_worker: Counter[str]) -> None:
    kit.report(f"{how}: {check.summary()}; per worker {sorted(per_worker.values())}")
    assert not check.lost, f"lost {len(check.lost)} messages: {sorted(check.lost)[:5]}"
    assert not check.unexpected, f"{len(check.unexpected)} unexpected ids"
    if kit.capabilities.competing_consumers:
        kit.claim(f"{_WORKERS} {how}, {_MESSAGES} messages: none lost, none duplicated")
        assert not check.duplicated, (
            f"{len(check.duplicated)} messages went to more than one worker: "
            f"{dict(list(check.duplicated.items())[:5])}"
        )
    else:
        kit.claim(f"{_WORKERS} {how}, {_MESSAGES} messages: none lost (duplicates allowed)")


@pytest.mark.hermes_check("competing consumers", "threads")
def test_three_worker_threads_share_300_messages_without_loss_or_duplicates(
    hermes_kit: Kit,
) -> None:
    ledger = hermes_kit.ledger
    workers = [hermes_kit.worker() for _ in range(_WORKERS)]
    sent = [hermes_kit.emit(hermes_kit.message(n)).id for n in range(_MESSAGES)]

    wait_for_progress(ledger.distinct, _MESSAGES, DELIVERY_S)
    wait_quiet(lambda: len(ledger), QUIET_S / 2, DELIVERY_S)
    for worker in workers:
        worker.stop()

    per_worker = Counter(e.worker for e in ledger.entries())
    _check(hermes_kit, "threads", TotalQueue.of(sent, ledger.ids()), per_worker)


@pytest.mark.hermes_check("competing consumers", "processes")
def test_three_worker_processes_share_300_messages_without_loss_or_duplicates(
    hermes_kit: Kit,
) -> None:
    sent, records = share_among_processes(hermes_kit)
    per_worker = Counter(str(r.pid) for r in records)
    _check(hermes_kit, "processes", TotalQueue.of(sent, [r.id for r in records]), per_worker)


def share_among_processes(kit: Kit, concurrency: int = 1) -> tuple[list[str], list[Record]]:
    """3 worker processes (each running ``concurrency`` handlers) handle 300 messages.

    Returns the ids sent and the records the workers wrote, once nothing moves
    any more and every worker has stopped cleanly.
    """
    kit.require_cross_process()
    stop_file = kit.tmp_path / "stop"
    processes = [
        kit.spawn_worker(shutdown_file=stop_file, concurrency=concurrency) for _ in range(_WORKERS)
    ]
    assert wait_until(lambda: all(kit.statuses(p.pid) for p in processes), WORKER_START_S), (
        f"the worker processes did not start\n{kit.process_output()}"
    )
    sent = [kit.emit(kit.message(n)).id for n in range(_MESSAGES)]

    def distinct() -> int:
        return len({r.id for r in kit.records()})

    wait_for_progress(distinct, _MESSAGES, WORKER_START_S + DELIVERY_S)
    wait_quiet(lambda: len(kit.records()), QUIET_S / 2, DELIVERY_S)
    # Dated a minute ahead: also stops a worker whose handle() started late.
    SharedFileShutdown(stop_file).shutdown(at=time.time() + 60)
    codes = [p.wait_exit(STOP_S) for p in processes]
    assert codes == [0] * _WORKERS, (
        f"the worker processes did not stop cleanly: exit codes {codes}\n{kit.process_output()}"
    )
    return sent, kit.records()
