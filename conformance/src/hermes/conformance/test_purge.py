"""``purge(priority)`` deletes what waits on that priority, and nothing else.

With messages ready and due later on two priorities, and one of the lower
priority held by a running handler: ``purge(100)`` deletes the ready and
scheduled messages of priority 100 and says how many; the higher priority's
messages, scheduled ones included, all arrive; and the message in the
handler, released afterwards, comes back (it was not waiting: purge must not
touch it). A driver whose broker cannot delete part of it without deleting
more may refuse with a :class:`DriverError`; what must be kept is checked
still, and the row says it could not verify the deletion.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from hermes.conformance._harness import (
    DELAY_LATE_S,
    DELIVERY_S,
    QUIET_S,
    Kit,
    scaled,
    stays_false,
    wait_until,
)
from hermes.conformance.test_settles import _BlocksThenFails
from hermes.core import DEFAULT_PRIORITY, DriverError, Message
from hermes.core.driver import Delay, Delivery, SupportsPurge, SupportsStats

_HIGH = 200
_READY = 3
_LATER = 2
#: How long after the purge the scheduled messages fall due (scaled).
_DUE_S = 2.0


@pytest.mark.hermes_check("queue stats", "purge(priority) deletes only that priority", new=True)
def test_purge_of_one_priority_leaves_other_priorities_and_the_messages_in_handlers(
    hermes_kit: Kit,
) -> None:
    caps = hermes_kit.capabilities
    driver = hermes_kit.driver()
    if not isinstance(driver, SupportsPurge):
        pytest.skip("not verified: the driver has no purge()")
    if not caps.priorities:
        pytest.skip("n/a: driver declares priorities=False (purge() is checked separately)")
    hermes_kit.setup_priority_queue("kit-high", _HIGH)
    ledger = hermes_kit.ledger

    held = hermes_kit.emit(hermes_kit.message(0))
    blocked = hermes_kit.worker(dispatcher_class=_BlocksThenFails, priorities=[DEFAULT_PRIORITY])
    dispatcher = blocked.dispatcher
    assert isinstance(dispatcher, _BlocksThenFails), f"the kit worker made a {dispatcher!r}"
    assert dispatcher.started.wait(scaled(DELIVERY_S)), (
        f"message {held.id} was not delivered within {DELIVERY_S} s (scaled)"
    )
    due = time.time() + scaled(_DUE_S)
    low = [hermes_kit.emit(hermes_kit.message(n)) for n in range(1, _READY + 1)]
    low += [hermes_kit.emit(hermes_kit.message(10 + n, execute_at=due)) for n in range(_LATER)]
    high = [hermes_kit.emit(hermes_kit.message(20 + n), _HIGH) for n in range(_READY)]
    high += [
        hermes_kit.emit(hermes_kit.message(30 + n, execute_at=due), _HIGH) for n in range(_LATER)
    ]
    # A driver may file every delayed message under the default priority, where it
    # lands when due (Redis, as PHP Hermes: one schedule for all priorities); its own
    # counts say so. Then purge(default) owns the higher priority's delayed ones too.
    shared_schedule = _files_delayed_under_default(driver, _LATER * 2)
    if shared_schedule:
        low, high = low + high[_READY:], high[:_READY]
    # A broker may be unable to delete some of what waits without deleting more
    # (SQS deletes delayed messages only with PurgeQueue, which takes those in
    # flight too): the driver then refuses with a DriverError saying what is
    # left. What purge must keep is checked either way.
    refused: DriverError | None = None
    try:
        removed = driver.purge(DEFAULT_PRIORITY)
    except DriverError as exc:
        refused, removed = exc, -1
    finally:
        dispatcher.go_on.set()  # the held message is released: it was not waiting
    assert blocked.join(DELIVERY_S), "the worker did not end after its callback raised"
    blocked.stop(expect=Exception)
    where = f"({_READY} ready, {len(low) - _READY} scheduled" + (
        ", every priority's delayed ones counted there by queue_stats)" if shared_schedule else ")"
    )
    assert refused is not None or removed == len(low), (
        f"purge({DEFAULT_PRIORITY}) deleted {removed} messages; {len(low)} were waiting there "
        + where
    )

    hermes_kit.worker()
    wanted = {m.id for m in high}
    if caps.delivery is Delivery.AT_LEAST_ONCE:
        wanted.add(f"again:{held.id}")

    def arrived() -> set[str]:
        return set(ledger.ids()) | ({f"again:{held.id}"} if len(ledger.of(held.id)) > 1 else set())

    late_s = _DUE_S + DELAY_LATE_S if caps.delay is Delay.NATIVE else 0.0
    bound = caps.redelivery_timeout_s + DELIVERY_S + late_s
    later = {m.id for m in high[_READY:]}  # empty with a shared schedule: purged above

    def what(id_: str) -> str:
        if id_ == f"again:{held.id}":
            return "the message in a handler, released (purge must leave it)"
        return f"a {'scheduled' if id_ in later else 'ready'} one of priority {_HIGH}"

    assert wait_until(lambda: wanted <= arrived(), bound), (
        f"after purge({DEFAULT_PRIORITY}) these never arrived: "
        + ", ".join(what(id_) for id_ in sorted(wanted - arrived()))
    )
    kept_text = f"priority {_HIGH}'s {len(high)} and the message in a handler"
    _purged_stay_gone(hermes_kit, DEFAULT_PRIORITY, low, removed, refused, kept_text)
    hermes_kit.claim(
        f"purge({DEFAULT_PRIORITY}) deleted its {len(low)}, kept priority {_HIGH}'s "
        f"{len(high)} and the message in a handler"
    )


def _files_delayed_under_default(driver: object, delayed: int) -> bool:
    """Whether the driver's own counts put all ``delayed`` messages on the default row."""
    if not isinstance(driver, SupportsStats):
        return False
    rows = {row.priority: row for row in driver.queue_stats()}
    default, high = rows.get(DEFAULT_PRIORITY), rows.get(_HIGH)
    return (
        default is not None
        and high is not None
        and default.scheduled == delayed
        and high.scheduled is None
    )


@pytest.mark.hermes_check(
    "queue stats", "purge(a higher priority) leaves the default's, scheduled ones too", new=True
)
def test_purge_of_a_higher_priority_leaves_the_default_priority_s_messages_scheduled_ones_too(
    hermes_kit: Kit,
) -> None:
    """The other direction: a driver may file every delayed message under one schedule
    (the default priority's), and purging another priority must not empty it."""
    caps = hermes_kit.capabilities
    driver = hermes_kit.driver()
    if not isinstance(driver, SupportsPurge):
        pytest.skip("not verified: the driver has no purge()")
    if not caps.priorities:
        pytest.skip("n/a: driver declares priorities=False (purge() is checked separately)")
    hermes_kit.setup_priority_queue("kit-high", _HIGH)
    ledger = hermes_kit.ledger

    due = time.time() + scaled(_DUE_S)
    low = [hermes_kit.emit(hermes_kit.message(n)) for n in range(_READY)]
    low += [hermes_kit.emit(hermes_kit.message(10 + n, execute_at=due)) for n in range(_LATER)]
    high = [hermes_kit.emit(hermes_kit.message(20 + n), _HIGH) for n in range(_READY)]
    high += [
        hermes_kit.emit(hermes_kit.message(30 + n, execute_at=due), _HIGH) for n in range(_LATER)
    ]
    # With one schedule for every priority, the higher priority's delayed messages are
    # the default priority's until they are due: purge(_HIGH) leaves them.
    if _files_delayed_under_default(driver, _LATER * 2):
        low, high = low + high[_READY:], high[:_READY]
    refused: DriverError | None = None
    try:
        removed = driver.purge(_HIGH)
    except DriverError as exc:
        refused, removed = exc, -1
    assert refused is not None or removed == len(high), (
        f"purge({_HIGH}) deleted {removed} messages; {len(high)} were waiting there"
    )

    hermes_kit.worker()
    kept = {m.id for m in low}
    late_s = _DUE_S + DELAY_LATE_S if caps.delay is Delay.NATIVE else 0.0
    assert wait_until(lambda: kept <= set(ledger.ids()), DELIVERY_S + late_s), (
        f"after purge({_HIGH}) these of priority {DEFAULT_PRIORITY} never arrived: "
        + ", ".join(
            f"#{m.id} ({'scheduled' if m.execute_at is not None else 'ready'})"
            for m in low
            if m.id not in set(ledger.ids())
        )
    )
    kept_text = f"priority {DEFAULT_PRIORITY}'s {len(low)}"
    _purged_stay_gone(hermes_kit, _HIGH, high, removed, refused, kept_text)
    hermes_kit.claim(
        f"purge({_HIGH}) deleted its {len(high)}, kept priority {DEFAULT_PRIORITY}'s "
        f"{len(low)}, scheduled ones included"
    )


def _purged_stay_gone(
    kit: Kit,
    priority: int,
    purged: Sequence[Message],
    removed: object,
    refused: DriverError | None,
    kept: str,
) -> None:
    """What ``purge(priority)`` deleted never arrives; not verified when it was refused
    (after the run checked that it ``kept`` the rest)."""
    if refused is not None:
        pytest.skip(
            f"not verified: purge({priority}) refused, so what it deletes was not checked "
            f"(it kept {kept}) - {type(refused).__name__}: {refused}"
        )
    ids = {m.id for m in purged}
    arrived = kit.ledger.ids
    assert stays_false(lambda: ids & set(arrived()), QUIET_S), (
        f"purge({priority}) said it deleted {removed}, yet {len(ids & set(arrived()))} of "
        "them arrived"
    )
