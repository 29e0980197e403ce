"""Priorities: queues are read from the highest number down; a worker may be restricted.

``priorities=True``: ``setup_priority_queue`` adds queues; messages sent
before a worker starts come out highest priority first (not in the order the
queues were set up);
``handle(priorities=[...])`` reads only those queues; the driver passes each
message's queue priority to the callback. ``priorities=False``:
``setup_priority_queue`` raises NotSupportedError. Either way, sending to a
priority without a queue raises UnknownPriorityError.
"""

from __future__ import annotations

import pytest

from hermes.conformance._harness import DELIVERY_S, QUIET_S, Kit, stays_false, wait_until
from hermes.conformance._worker import JOB
from hermes.core import DEFAULT_PRIORITY, Message, NotSupportedError, UnknownPriorityError

#: Set up in this order on purpose: neither it nor its reverse is highest first.
_QUEUES = {"kit-low": 50, "kit-high": 200, "kit-top": 300}


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
