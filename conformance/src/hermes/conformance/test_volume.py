"""Promises away from the easy moment: workers that have run a while, and thousands waiting.

What holds for a fresh worker must hold for one that has handled a few
hundred messages beside another worker: it still reads the highest priority
first, holds a delayed message until it is due and delivers it on time. And
what holds for ten messages must hold for thousands: 2000 waiting on two
priorities and 1000 scheduled all arrive, once each, the higher priority
first, none before its ``execute_at``.
"""

from __future__ import annotations

import time

import pytest

from hermes.conformance._harness import (
    DELAY_LATE_S,
    DELIVERY_S,
    EARLY_TOLERANCE_S,
    TAKEN_AHEAD,
    Kit,
    TotalQueue,
    scaled,
    wait_for_progress,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.conformance.test_priorities import _Gate, _hold_while_fresh, _overtaken_by_lower
from hermes.core import DEFAULT_PRIORITY, Message
from hermes.core.driver import Delay

_HIGH = 200
_WARM_UP = 300
_BACKLOG_EACH = 20
_DELAY_S = 2.0
_WAITING_EACH = 1000
_SCHEDULED = 1000
_BATCH = 100
_CONCURRENCY = 4


def _tagged(n: int, priority: int, execute_at: float | None = None) -> Message:
    return Message(JOB, {"n": n, "priority": priority}, execute_at=execute_at)


@pytest.mark.hermes_check("priorities", "a worker that has run a while beside another", new=True)
def test_a_worker_that_has_run_a_while_beside_another_still_honours_priority_and_delay(
    hermes_kit: Kit,
) -> None:
    caps = hermes_kit.capabilities
    if caps.priorities:
        hermes_kit.setup_priority_queue("kit-high", _HIGH)
    ledger = hermes_kit.ledger
    gate = _Gate(hold=lambda message: message.payload.get("n") == -1)
    warm = hermes_kit.worker(handlers={JOB: [gate]})
    beside = hermes_kit.worker()
    warm_up = [hermes_kit.emit(_tagged(n, DEFAULT_PRIORITY)).id for n in range(_WARM_UP)]
    assert wait_for_progress(ledger.distinct, _WARM_UP, DELIVERY_S), (
        f"{_WARM_UP - ledger.distinct()} of {_WARM_UP} warm-up messages never arrived"
    )
    beside.stop()  # it ran beside; the order check reads one worker's deliveries
    done = len(ledger)
    checked = []

    if caps.priorities:
        hermes_kit.emit(_tagged(-1, DEFAULT_PRIORITY))
        assert gate.holding.wait(scaled(DELIVERY_S)), "the warm worker took nothing more"
        backlog = [
            hermes_kit.emit(_tagged(n, priority), priority)
            for priority in (DEFAULT_PRIORITY, _HIGH)
            for n in range(_BACKLOG_EACH)
        ]
        _hold_while_fresh(hermes_kit, gate)
        wait_for_progress(ledger.distinct, _WARM_UP + 1 + len(backlog), DELIVERY_S)
        entries = [e for e in ledger.entries(done) if e.message.payload.get("n", -1) >= 0]
        assert len(entries) == len(backlog), (
            f"{len(backlog) - len(entries)} of {len(backlog)} backlog messages did not arrive"
        )
        worst, which = _overtaken_by_lower(entries)
        assert worst <= TAKEN_AHEAD, (
            f"a worker that had handled {_WARM_UP} messages beside another no longer reads "
            f"highest priority first: {which} came after {worst} of lower priority; order: "
            f"{[e.priority for e in entries]}"
        )
        checked.append("highest first")
    else:
        gate.open.set()

    due = time.time() + scaled(_DELAY_S)
    delayed = hermes_kit.emit(_tagged(-2, DEFAULT_PRIORITY, execute_at=due))
    assert wait_until(lambda: ledger.has(delayed.id), _DELAY_S + DELAY_LATE_S), (
        f"a warm worker did not deliver a message due in {scaled(_DELAY_S):.1f} s within "
        f"{DELAY_LATE_S} s (scaled) of its execute_at"
    )
    at = ledger.of(delayed.id)[0].at
    if caps.delay is Delay.NATIVE:
        assert at >= due - EARLY_TOLERANCE_S, (
            f"a worker that had handled {_WARM_UP} messages delivered a message "
            f"{due - at:.2f} s before its execute_at"
        )
        checked.append("delay held and on time")
    else:
        checked.append("delay ignored: at once")
    assert not set(warm_up) - set(ledger.ids()), "warm-up messages went missing"
    warm.check()
    hermes_kit.claim(f"after {_WARM_UP} messages beside another worker: " + ", ".join(checked))


@pytest.mark.hermes_check("priorities", "thousands waiting and scheduled", new=True)
def test_thousands_waiting_and_scheduled_all_arrive_once_highest_priority_first(
    hermes_kit: Kit,
) -> None:
    caps = hermes_kit.capabilities
    priorities = (_HIGH, DEFAULT_PRIORITY) if caps.priorities else (DEFAULT_PRIORITY,)
    if caps.priorities:
        hermes_kit.setup_priority_queue("kit-high", _HIGH)
    sender = hermes_kit.sender
    ledger = hermes_kit.ledger
    due = time.time() + scaled(10.0)  # after every send, before most are handled
    scheduled = [_tagged(n, DEFAULT_PRIORITY, execute_at=due) for n in range(_SCHEDULED)]
    waiting = {
        priority: [_tagged(n, priority) for n in range(_WAITING_EACH)] for priority in priorities
    }
    for messages, priority in [(scheduled, DEFAULT_PRIORITY)] + [
        (waiting[p], p)
        for p in reversed(priorities)  # lowest first
    ]:
        for start in range(0, len(messages), _BATCH):
            sender.send_batch(messages[start : start + _BATCH], priority)
    sent = [m.id for m in scheduled] + [m.id for p in priorities for m in waiting[p]]
    hermes_kit.worker(concurrency=_CONCURRENCY)
    assert wait_for_progress(ledger.distinct, len(sent), DELIVERY_S), (
        f"{len(sent) - ledger.distinct()} of {len(sent)} messages ({_SCHEDULED} scheduled, "
        f"{_WAITING_EACH} waiting on each of {len(priorities)} priorities) never arrived"
    )
    check = TotalQueue.of(sent, ledger.ids())
    hermes_kit.report(f"{len(sent)} messages: {check.summary()}")
    assert not check.lost, f"lost {len(check.lost)}: {sorted(check.lost)[:5]}"
    assert not check.duplicated, f"{len(check.duplicated)} delivered more than once"
    scheduled_ids = {m.id for m in scheduled}
    if caps.delay is Delay.NATIVE:
        early = [
            e
            for e in ledger.entries()
            if e.message.id in scheduled_ids and e.at < due - EARLY_TOLERANCE_S
        ]
        assert not early, (
            f"{len(early)} of {_SCHEDULED} scheduled messages arrived before their execute_at"
        )
    if caps.priorities:
        # Judged per handler thread: each takes its next message after the previous one,
        # while across threads one descheduled between its take and its handler on a
        # busy machine shows up late without the driver having done anything wrong.
        entries = [e for e in ledger.entries() if e.message.id not in scheduled_ids]
        slack = TAKEN_AHEAD + _CONCURRENCY
        for thread in {e.thread for e in entries}:
            own = [e for e in entries if e.thread == thread]
            worst, which = _overtaken_by_lower(own)
            assert worst <= slack, (
                f"of the {len(own)} waiting messages one handler thread ran, {which} came "
                f"after {worst} of lower priority (at most {slack} may be taken ahead)"
            )
    hermes_kit.claim(
        f"{len(sent)} messages ({_SCHEDULED} scheduled): none lost, none duplicated"
        + (", highest first" if caps.priorities else "")
    )
