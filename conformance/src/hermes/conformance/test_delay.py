"""Delay: what the driver does with a message whose ``execute_at`` is in the future.

``delay=NATIVE``: held back -- not delivered before ``execute_at`` (the lower
bound, within EARLY_TOLERANCE_S) and delivered at most DELAY_LATE_S after it
(the upper bound); several come out in ``execute_at`` order; a message that is
due is not kept waiting behind them. Away from those few seconds: a message
due in a minute is still held after twelve seconds, one due in eight seconds
arrives on time, and so do 200 sent one after another, each due two seconds
after it was sent (judged by how long each waited while due and the worker
delivered nothing else: due together, they come out at the worker's pace).
``delay=IGNORED``: delivered at once, ``execute_at`` kept in
the message -- a message due in an hour, and 200 due in a minute.
"""

from __future__ import annotations

import time

import pytest

from hermes.conformance._harness import (
    DELAY_LATE_S,
    DELIVERY_S,
    EARLY_TOLERANCE_S,
    Kit,
    fields,
    scaled,
    stays_false,
    time_scale,
    wait_for_progress,
    wait_until,
)
from hermes.core import DEFAULT_PRIORITY, Message
from hermes.core.driver import Delay

#: How far in the future the kit schedules (unscaled seconds).
_AHEAD_S = 1.5
_FAR_AHEAD_S = 3600.0
#: A delay far beyond the others, and how long it must hold (unscaled seconds).
_MINUTE_S = 60.0
_HOLD_S = 12.0
#: Between the short delays and the hold: checked on time at both ends.
_EIGHT_S = 8.0
#: Many messages, each due this long after it was sent (unscaled seconds).
_MANY = 200
_SHORT_S = 2.0
#: A priority above the default, for the rows that use two.
_HIGH = 200


def _on_time(kit: Kit, message: Message) -> None:
    """NATIVE: ``message`` arrived no earlier than ``execute_at`` and not too late."""
    assert message.execute_at is not None, f"message {message.id} has no execute_at"
    deliveries = kit.ledger.of(message.id)
    assert deliveries, f"message {message.id} due at {message.execute_at:.3f} never arrived"
    early_by = message.execute_at - deliveries[0].at
    assert early_by <= EARLY_TOLERANCE_S, (
        f"delay=NATIVE: delivered {early_by:.3f} s before its execute_at"
    )
    late_by = -early_by
    assert late_by <= scaled(DELAY_LATE_S), (
        f"delay=NATIVE: delivered {late_by:.3f} s after its execute_at "
        f"(at most {DELAY_LATE_S} s, scaled)"
    )
    assert fields(deliveries[0].message) == fields(message), (
        f"message {message.id} changed on the broker"
    )


def _idle_lateness(kit: Kit, messages: list[Message]) -> dict[str, float]:
    """Message id -> seconds the worker delivered nothing while the message was due.

    Its first delivery, less its ``execute_at`` or the delivery just before it,
    whichever is later: many messages due at once wait their turn behind each
    other at the worker's pace (slower on a busy machine, or with a slow local
    broker), which says nothing about the delay; a due message held while the
    worker had nothing to do does. Messages not delivered are left out.
    """
    order = sorted(kit.ledger.entries(), key=lambda entry: entry.at)
    first: dict[str, int] = {}
    for n, entry in enumerate(order):
        first.setdefault(entry.message.id, n)
    waited = {}
    for message in messages:
        assert message.execute_at is not None, f"message {message.id} has no execute_at"
        at = first.get(message.id)
        if at is not None:
            free_from = max(message.execute_at, order[at - 1].at if at else message.execute_at)
            waited[message.id] = order[at].at - free_from
    return waited


def _lateness(kit: Kit, messages: list[Message]) -> dict[str, float]:
    """Message id -> seconds its first delivery came after its ``execute_at`` (< 0: early)."""
    late = {}
    for message in messages:
        assert message.execute_at is not None, f"message {message.id} has no execute_at"
        deliveries = kit.ledger.of(message.id)
        if deliveries:
            late[message.id] = deliveries[0].at - message.execute_at
    return late


@pytest.mark.hermes_check("delay", "a message due later")
def test_a_message_due_later_follows_the_declared_delay(hermes_kit: Kit) -> None:
    ledger = hermes_kit.ledger
    hermes_kit.worker()

    if hermes_kit.capabilities.delay is Delay.NATIVE:
        hermes_kit.claim("held until execute_at, then delivered")
        message = hermes_kit.emit(hermes_kit.message(1, execute_at=time.time() + scaled(_AHEAD_S)))
        assert wait_until(lambda: ledger.has(message.id), _AHEAD_S + DELAY_LATE_S), (
            f"delay=NATIVE: a message due in {scaled(_AHEAD_S):.1f} s did not arrive within "
            f"{scaled(DELAY_LATE_S):.1f} s after that (scaled)"
        )
        _on_time(hermes_kit, message)
    else:
        hermes_kit.claim("delivered at once, execute_at kept")
        message = hermes_kit.emit(hermes_kit.message(1, execute_at=time.time() + _FAR_AHEAD_S))
        assert wait_until(lambda: ledger.has(message.id), DELIVERY_S), (
            f"delay=IGNORED: a message due in {_FAR_AHEAD_S:.0f} s was not delivered "
            f"within {DELIVERY_S} s"
        )
        assert fields(ledger.of(message.id)[0].message) == fields(message), (
            f"message {message.id} changed on the broker"
        )


@pytest.mark.hermes_check("delay", "several messages due later")
def test_delayed_messages_come_out_in_execute_at_order_after_due_ones(hermes_kit: Kit) -> None:
    ledger = hermes_kit.ledger
    now = time.time()
    if hermes_kit.capabilities.delay is Delay.NATIVE:
        hermes_kit.claim("in execute_at order, due ones first")
        # The worker is up and has handled a message before the clock starts:
        # the window below measures the driver, not how long the broker takes
        # to let a new consumer in (a Kafka group join can outlast _AHEAD_S).
        hermes_kit.worker()
        ready = hermes_kit.emit(hermes_kit.message(4))
        assert wait_until(lambda: ledger.has(ready.id), DELIVERY_S), (
            f"a plain message was not delivered within {DELIVERY_S} s"
        )
        start = len(ledger)
        now = time.time()
        later = hermes_kit.emit(hermes_kit.message(3, execute_at=now + scaled(2 * _AHEAD_S)))
        sooner = hermes_kit.emit(hermes_kit.message(2, execute_at=now + scaled(_AHEAD_S)))
        past = hermes_kit.emit(hermes_kit.message(1, execute_at=now - 5))
        plain = hermes_kit.emit(hermes_kit.message(0))

        assert wait_until(lambda: ledger.has(later.id), 2 * _AHEAD_S + DELAY_LATE_S), (
            f"delay=NATIVE: a message due in {scaled(2 * _AHEAD_S):.1f} s did not arrive within "
            f"{scaled(DELAY_LATE_S):.1f} s after that (scaled)"
        )
        order = [e.message.id for e in ledger.entries(after=start)]
        names = {past.id: "due", plain.id: "plain", sooner.id: "sooner", later.id: "later"}
        came = [names.get(id_, id_) for id_ in order]
        assert sorted(order[:2]) == sorted([past.id, plain.id]), (
            f"due messages waited behind delayed ones: they came in the order {came}"
        )
        assert order[2:] == [sooner.id, later.id], (
            f"delayed messages out of execute_at order: they came in the order {came}"
        )
        _on_time(hermes_kit, sooner)
        _on_time(hermes_kit, later)
    else:
        hermes_kit.claim("all delivered at once, execute_at kept")
        sent = [
            hermes_kit.emit(hermes_kit.message(n, execute_at=now + _FAR_AHEAD_S - n))
            for n in range(3)
        ]
        hermes_kit.worker()
        assert wait_until(lambda: all(ledger.has(m.id) for m in sent), DELIVERY_S), (
            f"delay=IGNORED: {sum(1 for m in sent if not ledger.has(m.id))} of 3 messages due "
            f"in an hour were not delivered within {DELIVERY_S} s (scaled)"
        )
        for message in sent:
            assert fields(ledger.of(message.id)[0].message) == fields(message), (
                f"message {message.id} changed on the broker"
            )


@pytest.mark.hermes_check("delay", "a minute ahead, and 200 more")
def test_a_delay_of_a_minute_holds_while_200_short_ones_and_one_of_eight_seconds_are_on_time(
    hermes_kit: Kit,
) -> None:
    ledger = hermes_kit.ledger
    if hermes_kit.capabilities.delay is not Delay.NATIVE:
        hermes_kit.claim(f"a minute ahead and {_MANY} more: all at once, execute_at kept")
        later = time.time() + _MINUTE_S
        sent = [hermes_kit.emit(hermes_kit.message(n, execute_at=later)) for n in range(_MANY)]
        hermes_kit.worker()
        delivered = wait_for_progress(
            lambda: sum(1 for m in sent if ledger.has(m.id)), _MANY, DELIVERY_S
        )
        missing = [m.id for m in sent if not ledger.has(m.id)]
        assert delivered and not missing, (
            f"delay=IGNORED: {len(missing)} of {_MANY} messages due in a minute were not "
            f"delivered at once (none for {DELIVERY_S} s, scaled), e.g. {missing[:3]}"
        )
        changed = [m.id for m in sent if fields(ledger.of(m.id)[0].message) != fields(m)]
        assert not changed, f"{len(changed)} messages changed on the broker, e.g. {changed[:3]}"
        return

    hermes_kit.claim(
        f"held a minute (not there after {_HOLD_S:g} s), "
        f"{_EIGHT_S:g} s and {_MANY} x {_SHORT_S:g} s on time"
    )
    # Held from its send on: the worker's start counts towards the window.
    minute_sent = time.time()
    minute = hermes_kit.emit(hermes_kit.message(0, execute_at=minute_sent + scaled(_MINUTE_S)))
    # The worker is up before the clock of the others starts: their lateness
    # measures the driver, not a broker letting a new consumer in.
    hermes_kit.worker()
    ready = hermes_kit.emit(hermes_kit.message(-1))
    assert wait_until(lambda: ledger.has(ready.id), DELIVERY_S), (
        f"a plain message was not delivered within {DELIVERY_S} s (scaled)"
    )
    start = time.time()
    eight = hermes_kit.emit(hermes_kit.message(1, execute_at=start + scaled(_EIGHT_S)))
    # Each due _SHORT_S after its own send: however slow sending is, every one is held.
    short = [
        hermes_kit.emit(hermes_kit.message(n, execute_at=time.time() + scaled(_SHORT_S)))
        for n in range(2, _MANY + 2)
    ]
    sent_s = time.time() - start

    def arrived() -> int:
        return sum(1 for m in [eight, *short] if ledger.has(m.id))

    # From now, the one of eight seconds is due within _EIGHT_S, the short ones sooner.
    wait_until(lambda: arrived() == _MANY + 1, _EIGHT_S + DELAY_LATE_S)
    late = _lateness(hermes_kit, [eight, *short])
    missing = []
    if eight.id not in late:
        missing.append(f"the one due in {scaled(_EIGHT_S):g} s")
    short_missing = sum(1 for m in short if m.id not in late)
    if short_missing:
        missing.append(
            f"{short_missing} of the {_MANY} due {scaled(_SHORT_S):g} s after their send"
        )
    assert not missing, (
        f"delay=NATIVE: delayed messages did not arrive within {scaled(DELAY_LATE_S):g} s "
        f"(scaled) of their execute_at: {' and '.join(missing)} (all {_MANY + 1} were sent "
        f"within {sent_s:.1f} s)"
    )
    earliest = min(late, key=lambda id_: late[id_])
    assert late[earliest] >= -EARLY_TOLERANCE_S, (
        f"delay=NATIVE: message {earliest} arrived {-late[earliest]:.3f} s before its execute_at; "
        f"{sum(1 for v in late.values() if v < -EARLY_TOLERANCE_S)} of {len(late)} came early"
    )
    idle = _idle_lateness(hermes_kit, [eight, *short])
    latest = max(idle, key=lambda id_: idle[id_])
    assert idle[latest] <= scaled(DELAY_LATE_S), (
        f"delay=NATIVE: message {latest} was due {idle[latest]:.3f} s before it arrived, "
        f"with no other delivery meanwhile (at most {scaled(DELAY_LATE_S):.1f} s, scaled); "
        f"{sum(1 for v in idle.values() if v > scaled(DELAY_LATE_S))} of {len(idle)} came late"
    )
    hermes_kit.report(
        f"{_MANY + 1} delayed messages: {min(late.values()):+.3f} .. "
        f"{max(late.values()):+.3f} s from execute_at; sending took {sent_s:.1f} s"
    )

    # Watched without a break from its send until _HOLD_S (scaled) after it.
    hold_left_s = (minute_sent + scaled(_HOLD_S) - time.time()) / time_scale()
    assert stays_false(lambda: ledger.has(minute.id), hold_left_s), (
        f"delay=NATIVE: a message due in {scaled(_MINUTE_S):.0f} s (scaled) arrived "
        f"{ledger.of(minute.id)[0].at - minute_sent:.1f} s after it was sent"
    )


#: Messages scheduled later than the one due soon, sent before it on each priority:
#: more than any batch a driver might look at first (unscaled seconds ahead).
_BEHIND = 150
_BEHIND_AHEAD_S = 120.0


@pytest.mark.hermes_check("delay", "due soon behind 150 due later, on every priority", new=True)
def test_a_message_due_soon_is_on_time_behind_hundreds_due_later_on_every_priority(
    hermes_kit: Kit,
) -> None:
    """Due is due however many were scheduled before it: a driver that looks at the
    first hundred it was sent, or only at the default priority's schedule, fails."""
    caps = hermes_kit.capabilities
    if caps.delay is not Delay.NATIVE:
        pytest.skip("n/a: driver declares delay=IGNORED (nothing is held back)")
    priorities = [DEFAULT_PRIORITY]
    if caps.priorities:
        hermes_kit.setup_priority_queue("kit-high", _HIGH)
        priorities.append(_HIGH)
    ledger = hermes_kit.ledger
    later_at = time.time() + scaled(_BEHIND_AHEAD_S)
    for priority in priorities:
        behind = [
            hermes_kit.message(1000 * priority + n, execute_at=later_at) for n in range(_BEHIND)
        ]
        for start in range(0, _BEHIND, 50):
            hermes_kit.sender.send_batch(behind[start : start + 50], priority)
    due_at = time.time() + scaled(_SHORT_S)
    soon = {
        priority: hermes_kit.emit(hermes_kit.message(priority, execute_at=due_at), priority)
        for priority in priorities
    }
    hermes_kit.worker()

    assert wait_until(
        lambda: all(ledger.has(m.id) for m in soon.values()), _SHORT_S + DELAY_LATE_S
    ), "delay=NATIVE: " + ", ".join(
        f"the message of priority {p} due in {scaled(_SHORT_S):.1f} s behind {_BEHIND} "
        f"due in {scaled(_BEHIND_AHEAD_S):.0f} s did not arrive within "
        f"{scaled(DELAY_LATE_S):.1f} s after that (scaled)"
        for p, m in soon.items()
        if not ledger.has(m.id)
    )
    for message in soon.values():
        _on_time(hermes_kit, message)
    early = [
        e.message.id for e in ledger.entries() if e.message.id not in {m.id for m in soon.values()}
    ]
    assert not early, f"{len(early)} messages due in {scaled(_BEHIND_AHEAD_S):.0f} s arrived early"
    hermes_kit.claim(
        f"due soon behind {_BEHIND} due later, on {len(priorities)} "
        f"priorit{'ies' if len(priorities) > 1 else 'y'}: on time"
    )
