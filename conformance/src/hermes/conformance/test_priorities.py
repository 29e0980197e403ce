"""Priorities: queues are read from the highest number down; a worker may be restricted.

``priorities=True``: ``setup_priority_queue`` adds queues; messages sent
before a worker starts come out highest priority first (not in the order the
queues were set up), and so does a backlog of 300; a higher priority sent
while the worker is busy with that backlog overtakes it, and a burst sent to
an idle worker comes out highest first too. On a running worker the kit lets
the higher ones wait FRESH_S (the worker is busy in a handler meanwhile and
must start nothing else), and a consumer may have taken up to TAKEN_AHEAD
messages before they arrived.
``handle(priorities=[...])`` reads only those queues; the driver passes each
message's queue priority to the callback. ``priorities=False``:
``setup_priority_queue`` raises NotSupportedError. Either way, sending to a
priority without a queue raises UnknownPriorityError, and so does a worker
restricted to one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from hermes.conformance._harness import (
    DELIVERY_S,
    FRESH_S,
    QUIET_S,
    STOP_S,
    TAKEN_AHEAD,
    Delivered,
    Kit,
    stays_false,
    wait_for_progress,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.core import DEFAULT_PRIORITY, Message, NotSupportedError, UnknownPriorityError

#: Set up in this order on purpose: neither it nor its reverse is highest first.
_QUEUES = {"kit-low": 50, "kit-high": 200, "kit-top": 300}
#: The backlog a busy worker works through: this many of each of 50, 100 and 200.
_BACKLOG_EACH = 100
#: A burst: this many of each of 50, 100 and 200, lowest first.
_BURST_EACH = 20
#: A priority no queue was set up for.
_UNKNOWN = 12345


class _Gate:
    """Holds the first message ``hold`` picks until the test opens the gate."""

    def __init__(self, hold: Callable[[Message], bool] = lambda message: True) -> None:
        self.hold = hold
        self.holding = threading.Event()
        self.open = threading.Event()

    def handle(self, message: Message) -> bool:
        if not self.holding.is_set() and self.hold(message):
            self.holding.set()
            self.open.wait(DELIVERY_S + STOP_S)
        return True


def _tagged(n: int, priority: int) -> Message:
    return Message(JOB, {"n": n, "priority": priority})


def _hold_while_fresh(kit: Kit, gate: _Gate) -> None:
    """Keep the worker in its handler FRESH_S (it starts nothing else), then let it go on."""
    started = len(kit.ledger)
    try:
        assert stays_false(lambda: len(kit.ledger) > started, FRESH_S), (
            f"a worker running one handler at a time started {len(kit.ledger) - started} "
            "more while its handler was busy"
        )
    finally:
        gate.open.set()


def _overtaken_by_lower(entries: Sequence[Delivered]) -> tuple[int, str]:
    """The most lower-priority deliveries any delivery came after, and which one that was."""
    worst, which = 0, ""
    for position, entry in enumerate(entries):
        lower = sum(1 for before in entries[:position] if before.priority < entry.priority)
        if lower > worst:
            worst, which = lower, f"a message of priority {entry.priority} at position {position}"
    return worst, which


def require_priorities(kit: Kit) -> None:
    if not kit.capabilities.priorities:
        pytest.skip("n/a: driver declares priorities=False (the fallback is checked separately)")


@pytest.mark.hermes_check("priorities", "setup_priority_queue")
def test_setting_up_a_priority_queue_follows_the_declared_capability(hermes_kit: Kit) -> None:
    hermes_kit.driver()
    if hermes_kit.capabilities.priorities:
        hermes_kit.claim("setup_priority_queue works, a message sent there arrives")
        hermes_kit.setup_priority_queue("kit-high", 200)
        message = hermes_kit.emit(hermes_kit.message(1), 200)
        hermes_kit.worker()
        assert wait_until(lambda: hermes_kit.ledger.has(message.id), DELIVERY_S), (
            f"a message sent to priority 200 was not delivered within {DELIVERY_S} s (scaled)"
        )
        assert hermes_kit.ledger.of(message.id)[0].priority == 200, (
            "the callback got another priority than sent"
        )
    else:
        hermes_kit.claim("setup_priority_queue raises NotSupportedError")
        with pytest.raises(NotSupportedError):
            hermes_kit.setup_priority_queue("kit-high", 200)


@pytest.mark.hermes_check("priorities", "unknown priority raises UnknownPriorityError")
def test_sending_to_a_priority_without_a_queue_raises_unknown_priority_error(
    hermes_kit: Kit,
) -> None:
    if hermes_kit.capabilities.priorities:
        hermes_kit.setup_priority_queue("kit-high", 200)
    sentinel = hermes_kit.message(0)

    with pytest.raises(UnknownPriorityError):
        hermes_kit.sender.send(hermes_kit.message(1), 12345)

    hermes_kit.emit(sentinel)
    hermes_kit.worker()
    assert wait_until(lambda: hermes_kit.ledger.has(sentinel.id), DELIVERY_S), (
        f"a message sent to the default priority was not delivered within {DELIVERY_S} s"
    )
    assert stays_false(lambda: len(hermes_kit.ledger) > 1, QUIET_S), (
        "a message sent to an unknown priority was delivered anyway"
    )


@pytest.mark.hermes_check("priorities", "highest first")
def test_messages_sent_before_the_worker_starts_come_out_highest_priority_first(
    hermes_kit: Kit,
) -> None:
    require_priorities(hermes_kit)
    for name, priority in _QUEUES.items():
        hermes_kit.setup_priority_queue(name, priority)
    sent: list[Message] = []
    for _ in range(2):
        for priority in (50, DEFAULT_PRIORITY, 300, 200):
            message = Message(JOB, {"n": len(sent), "priority": priority})
            sent.append(hermes_kit.emit(message, priority))
    hermes_kit.worker()

    assert wait_until(lambda: len(hermes_kit.ledger) >= len(sent), DELIVERY_S), (
        f"{len(hermes_kit.ledger)} of {len(sent)} messages were delivered within {DELIVERY_S} s"
    )
    entries = hermes_kit.ledger.entries()
    order = [e.message.payload["priority"] for e in entries]
    assert order == sorted(order, reverse=True), "not read highest priority first"
    assert [e.priority for e in entries] == order, "callback got another priority than sent"


@pytest.mark.hermes_check("priorities", "handle(priorities=...) restricts")
def test_a_worker_restricted_to_some_priorities_takes_only_those(hermes_kit: Kit) -> None:
    require_priorities(hermes_kit)
    for name, priority in _QUEUES.items():
        hermes_kit.setup_priority_queue(name, priority)
    ledger = hermes_kit.ledger
    sent = {
        priority: hermes_kit.emit(hermes_kit.message(priority), priority)
        for priority in (50, DEFAULT_PRIORITY, 200, 300)
    }
    restricted = hermes_kit.worker(priorities=[300, 200])

    assert wait_until(lambda: ledger.has(sent[300].id) and ledger.has(sent[200].id), DELIVERY_S), (
        f"a worker restricted to [300, 200] took {[e.priority for e in ledger.entries()]} "
        f"within {DELIVERY_S} s (scaled), not both"
    )
    assert stays_false(lambda: ledger.has(sent[50].id) or ledger.has(sent[100].id), QUIET_S), (
        f"a worker restricted to [300, 200] took: {[e.priority for e in ledger.entries()]}"
    )
    restricted.stop()
    hermes_kit.worker()
    assert wait_until(lambda: ledger.has(sent[50].id) and ledger.has(sent[100].id), DELIVERY_S), (
        "the messages the restricted worker left were lost"
    )


@pytest.mark.hermes_check("priorities", "a backlog of 300, overtaken by a later higher one")
def test_a_higher_priority_sent_while_the_worker_is_busy_overtakes_a_backlog_of_300(
    hermes_kit: Kit,
) -> None:
    require_priorities(hermes_kit)
    hermes_kit.claim(
        f"a backlog of {3 * _BACKLOG_EACH} highest first; priority 300 sent meanwhile "
        f"overtakes it (taken ahead: at most {TAKEN_AHEAD})"
    )
    for name, priority in _QUEUES.items():
        hermes_kit.setup_priority_queue(name, priority)
    ledger = hermes_kit.ledger
    backlog = [
        hermes_kit.emit(_tagged(n, priority), priority)
        for n in range(_BACKLOG_EACH)
        for priority in (50, DEFAULT_PRIORITY, 200)
    ]
    gate = _Gate()
    hermes_kit.worker(handlers={JOB: [gate]})
    assert gate.holding.wait(DELIVERY_S), f"no message arrived within {DELIVERY_S} s"
    top = hermes_kit.emit(_tagged(-1, 300), 300)
    _hold_while_fresh(hermes_kit, gate)

    wait_for_progress(ledger.distinct, len(backlog) + 1, DELIVERY_S)
    entries = ledger.entries()
    missing = {m.id for m in [*backlog, top]} - {e.message.id for e in entries}
    assert not missing, f"{len(missing)} of {len(backlog) + 1} messages did not arrive"
    taken_before = [e.message.id for e in entries].index(top.id) - 1  # after the held one
    assert taken_before <= TAKEN_AHEAD, (
        f"a message of priority 300 sent to a busy worker came after {taken_before} lower "
        f"ones of its backlog, though it had waited {FRESH_S} s (scaled) to be seen (at most "
        f"{TAKEN_AHEAD} may have been taken ahead): the worker reads a stale view of the queues"
    )
    order = [e.priority for e in entries if e.message.id != top.id]
    rises = [i for i in range(1, len(order)) if order[i] > order[i - 1]]
    assert not rises, (
        f"a backlog of {len(backlog)} did not come out highest priority first: "
        f"{len(rises)} times a higher priority came after a lower one, first priority "
        f"{order[rises[0]]} after {order[rises[0] - 1]} at position {rises[0]}"
    )
    sent_as = [e.message.payload["priority"] for e in entries]
    assert [e.priority for e in entries] == sent_as, "the callback got another priority than sent"


@pytest.mark.hermes_check("priorities", "a burst to an idle worker")
def test_a_burst_sent_to_an_idle_worker_comes_out_highest_priority_first(hermes_kit: Kit) -> None:
    require_priorities(hermes_kit)
    hermes_kit.claim(
        f"{3 * _BURST_EACH} sent lowest first to an idle worker: highest first "
        f"(taken ahead: at most {TAKEN_AHEAD})"
    )
    for name, priority in _QUEUES.items():
        hermes_kit.setup_priority_queue(name, priority)
    ledger = hermes_kit.ledger
    gate = _Gate(hold=lambda message: message.payload.get("n") != -1)
    hermes_kit.worker(handlers={JOB: [gate]})
    idle = hermes_kit.emit(_tagged(-1, DEFAULT_PRIORITY))
    assert wait_until(lambda: ledger.has(idle.id), DELIVERY_S), (
        f"a message sent to a running worker did not arrive within {DELIVERY_S} s"
    )
    # The worker is idle now: the first of the burst reaches it at once (pushed or
    # pulled) and is held in its handler while the rest arrive.
    burst = [
        hermes_kit.emit(_tagged(n, priority), priority)
        for priority in (50, DEFAULT_PRIORITY, 200)
        for n in range(_BURST_EACH)
    ]
    assert gate.holding.wait(DELIVERY_S), f"no message of the burst arrived within {DELIVERY_S} s"
    _hold_while_fresh(hermes_kit, gate)

    wait_for_progress(ledger.distinct, len(burst) + 1, DELIVERY_S)
    entries = [e for e in ledger.entries() if e.message.id != idle.id]
    assert len({e.message.id for e in entries}) == len(burst), (
        f"{len(burst) - len({e.message.id for e in entries})} of {len(burst)} messages of a "
        "burst did not arrive"
    )
    worst, which = _overtaken_by_lower(entries)
    assert worst <= TAKEN_AHEAD, (
        f"a burst sent to an idle worker did not come out highest first: {which} came after "
        f"{worst} of lower priority (at most {TAKEN_AHEAD} may have been taken ahead); order: "
        f"{[e.priority for e in entries]}"
    )


@pytest.mark.hermes_check("priorities", "handle(priorities=[unknown]) raises")
def test_a_worker_restricted_to_a_priority_without_a_queue_raises_unknown_priority_error(
    hermes_kit: Kit,
) -> None:
    hermes_kit.claim("handle(priorities=[12345]) raises UnknownPriorityError, takes nothing")
    if hermes_kit.capabilities.priorities:
        hermes_kit.setup_priority_queue("kit-high", 200)
    waiting = hermes_kit.emit(hermes_kit.message(1))
    worker = hermes_kit.worker(priorities=[_UNKNOWN])

    assert worker.join(DELIVERY_S), (
        f"handle(priorities=[{_UNKNOWN}]) still runs {DELIVERY_S} s (scaled) later: a "
        "priority without a queue must raise UnknownPriorityError"
    )
    assert isinstance(worker.error, UnknownPriorityError), (
        f"handle(priorities=[{_UNKNOWN}]) ended with {worker.error!r}, not UnknownPriorityError"
    )
    worker.stop(expect=UnknownPriorityError)
    assert not hermes_kit.ledger.has(waiting.id), (
        f"handle(priorities=[{_UNKNOWN}]) took a message of priority {DEFAULT_PRIORITY}"
    )
    hermes_kit.worker()
    assert wait_until(lambda: hermes_kit.ledger.has(waiting.id), DELIVERY_S), (
        f"the message waiting at priority {DEFAULT_PRIORITY} was lost"
    )
