"""Max items and shutdown: how a worker stops.

``max_items=n``: a run returns after n messages, and the
messages it did not handle are left for the next worker. A
``SharedFileShutdown`` stops an idle worker within 2 s (the driver
checks the shutdown at the top of every loop and before every idle wait, and
no idle wait lasts longer than about a second). Both in-process and, for
drivers that cross processes, in a worker process. A busy worker -- a
backlog of 200 waiting -- stops after the message in progress, starts no
other, and leaves the rest to the next worker: none lost, none handled twice.
"""

from __future__ import annotations

import threading
import time

import pytest

from hermes.conformance._harness import (
    DELIVERY_S,
    QUIET_S,
    SHUTDOWN_S,
    STOP_S,
    WORKER_START_S,
    Kit,
    TotalQueue,
    scaled,
    stays_false,
    wait_for_progress,
    wait_quiet,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.core import Message, SharedFileShutdown
from hermes.core.driver import Delivery

_MAX_ITEMS = 3
_SENT = 5
#: The backlog a busy worker leaves when it is asked to stop.
_BACKLOG = 200
#: The message (1-based) in whose handler the stop request comes.
_STOP_AT = 10


@pytest.mark.hermes_check("max items", "in-process")
def test_a_worker_with_max_items_returns_after_that_many_messages(hermes_kit: Kit) -> None:
    ledger = hermes_kit.ledger
    sent = [hermes_kit.emit(hermes_kit.message(n)).id for n in range(_SENT)]
    driver = hermes_kit.driver()
    limited = hermes_kit.worker(driver=driver, max_items=_MAX_ITEMS)

    assert wait_until(lambda: len(ledger) >= _MAX_ITEMS, DELIVERY_S), (
        f"{len(ledger)} of {_SENT} messages were delivered within {DELIVERY_S} s (scaled), "
        f"not max items {_MAX_ITEMS}"
    )
    assert limited.join(SHUTDOWN_S), (
        f"handle() did not return after max items ({_MAX_ITEMS}); it handled {len(ledger)} messages"
    )
    limited.check()
    assert len(ledger) == _MAX_ITEMS, (
        f"a worker with max items {_MAX_ITEMS} handled {len(ledger)} messages"
    )
    driver.close()

    hermes_kit.worker()
    bound = hermes_kit.capabilities.redelivery_timeout_s + DELIVERY_S
    assert wait_until(lambda: ledger.distinct() >= _SENT, bound), (
        "the messages a worker with max items left were not delivered to the next worker"
    )
    check = TotalQueue.of(sent, ledger.ids())
    assert (check.lost, check.duplicated, check.unexpected) == (set(), {}, set()), (
        f"around a worker with max items: {check.summary()}"
    )


#: Waiting behind the one message a worker with max items 1 handles: more than a
#: consumer that takes ahead of its handlers holds (a Redis prefetch of 5).
_AHEAD = 12
#: A lease shorter than this cannot tell a give-back from a lease that ran out.
_LEASE_TO_TELL_S = 4.0


@pytest.mark.hermes_check("max items", "what a stopped worker took ahead", new=True)
def test_what_a_stopped_worker_took_ahead_goes_to_the_next_at_once_not_after_its_lease(
    hermes_kit: Kit,
) -> None:
    """A consumer may take messages ahead of its handlers; closing it gives back those
    it never handed out, so the next worker gets them before their lease runs out."""
    caps = hermes_kit.capabilities
    if caps.delivery is not Delivery.AT_LEAST_ONCE:
        pytest.skip("n/a: driver declares AT_MOST_ONCE (the max items row checks what is left)")
    lease_s = caps.redelivery_timeout_s
    if 0 < lease_s < _LEASE_TO_TELL_S:
        pytest.skip(
            f"not verified: redelivery_timeout_s={lease_s:g} is shorter than "
            f"{_LEASE_TO_TELL_S:g} s, too short to tell a give-back from a lease that ran out"
        )
    ledger = hermes_kit.ledger
    sent = [hermes_kit.emit(hermes_kit.message(n)).id for n in range(_AHEAD + 1)]
    limited = hermes_kit.worker(max_items=1)
    assert limited.join(DELIVERY_S + SHUTDOWN_S), (
        f"a worker with max items 1 did not return; it handled {len(ledger)} messages"
    )
    limited.check()
    stopped_at = time.monotonic()

    hermes_kit.worker()
    # redelivery_timeout_s=0: the broker gives back what a closed connection held.
    within_s = lease_s * 0.75 if lease_s else scaled(DELIVERY_S)
    arrived = wait_until(lambda: ledger.distinct() >= len(sent), within_s, scale=False)
    took_s = time.monotonic() - stopped_at
    assert arrived, (
        f"{len(sent) - ledger.distinct()} of the {_AHEAD} messages a worker with max items 1 "
        f"left were not delivered to the next worker within {within_s:g} s of its stop "
        f"(redelivery_timeout_s={lease_s:g}): close() must give back what the consumer "
        "took ahead and never handed out, not leave it to its lease"
    )
    check = TotalQueue.of(sent, ledger.ids())
    assert (check.lost, check.duplicated, check.unexpected) == (set(), {}, set()), (
        f"around a worker with max items 1: {check.summary()}"
    )
    hermes_kit.claim(
        f"the {_AHEAD} left arrived {took_s:.1f} s after the stop, "
        + (
            f"within three quarters of the {lease_s:g} s lease"
            if lease_s
            else "the broker gave them back"
        )
    )


@pytest.mark.hermes_check("max items", "worker process")
def test_a_worker_process_with_max_items_exits_after_that_many_messages(hermes_kit: Kit) -> None:
    hermes_kit.require_cross_process()
    for n in range(_SENT):
        hermes_kit.emit(hermes_kit.message(n))
    process = hermes_kit.spawn_worker(max_items=_MAX_ITEMS)

    assert wait_until(
        lambda: len(hermes_kit.records()) >= _MAX_ITEMS, WORKER_START_S + DELIVERY_S
    ), f"the worker handled too little\n{hermes_kit.process_output()}"
    code = process.wait_exit(STOP_S)
    assert code == 0, (
        f"the worker with max items {_MAX_ITEMS} did not exit by itself (exit code {code})\n"
        f"{hermes_kit.process_output()}"
    )
    assert len(hermes_kit.records()) == _MAX_ITEMS, (
        f"a worker process with max items {_MAX_ITEMS} handled {len(hermes_kit.records())}"
    )
    assert hermes_kit.statuses(process.pid) == ["#ready", "#stopped"], (
        f"the worker process did not stop cleanly\n{hermes_kit.process_output()}"
    )

    hermes_kit.spawn_worker()
    bound = WORKER_START_S + hermes_kit.capabilities.redelivery_timeout_s + DELIVERY_S
    assert wait_until(lambda: len({r.id for r in hermes_kit.records()}) >= _SENT, bound), (
        "the messages a worker process with max items left were not delivered to the next "
        f"worker\n{hermes_kit.process_output()}"
    )


@pytest.mark.hermes_check("shutdown", "SharedFileShutdown, in-process")
def test_shared_file_shutdown_stops_an_idle_worker_within_two_seconds(hermes_kit: Kit) -> None:
    shutdown = SharedFileShutdown(hermes_kit.tmp_path / "stop")
    worker = hermes_kit.worker(shutdown=shutdown)
    sentinel = hermes_kit.emit(hermes_kit.message(1))
    assert wait_until(lambda: hermes_kit.ledger.has(sentinel.id), DELIVERY_S), (
        f"a message sent to a running worker was not delivered within {DELIVERY_S} s (scaled)"
    )
    assert stays_false(lambda: not worker.running, QUIET_S / 2), (
        f"the worker stopped by itself: {worker.error!r}"
    )

    shutdown.shutdown()

    assert worker.join(SHUTDOWN_S), (
        f"an idle worker still runs {SHUTDOWN_S} s (scaled) after SharedFileShutdown asked"
    )
    worker.check()


@pytest.mark.hermes_check("shutdown", "SharedFileShutdown, worker process")
def test_shared_file_shutdown_stops_an_idle_worker_process_within_two_seconds(
    hermes_kit: Kit,
) -> None:
    hermes_kit.require_cross_process()
    stop_file = hermes_kit.tmp_path / "stop"
    process = hermes_kit.spawn_worker(shutdown_file=stop_file)
    sentinel = hermes_kit.emit(hermes_kit.message(1))
    assert wait_until(
        lambda: any(r.id == sentinel.id for r in hermes_kit.records()),
        WORKER_START_S + DELIVERY_S,
    ), f"the worker handled nothing\n{hermes_kit.process_output()}"

    SharedFileShutdown(stop_file).shutdown()

    assert wait_until(lambda: "#stopped" in hermes_kit.statuses(process.pid), SHUTDOWN_S), (
        f"an idle worker process still runs {SHUTDOWN_S} s (scaled) after "
        f"SharedFileShutdown asked\n{hermes_kit.process_output()}"
    )
    code = process.wait_exit(STOP_S)
    assert code == 0, (
        f"the stopped worker process exited with code {code}\n{hermes_kit.process_output()}"
    )


class _AskToStopAt:
    """Holds the ``at``-th message in its handler until the test has asked the worker to stop."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.count = 0
        self.holding = threading.Event()
        self.asked = threading.Event()

    def handle(self, message: Message) -> bool:
        self.count += 1
        if self.count == self.at:
            self.holding.set()
            self.asked.wait(DELIVERY_S + STOP_S)
        return True


@pytest.mark.hermes_check("shutdown", "a busy worker")
def test_a_busy_worker_stops_after_the_message_in_progress_and_leaves_the_backlog(
    hermes_kit: Kit,
) -> None:
    hermes_kit.claim(
        f"with {_BACKLOG} waiting: stops after the message in progress, starts no other; "
        "the next worker gets the rest"
    )
    ledger = hermes_kit.ledger
    sent = [hermes_kit.emit(hermes_kit.message(n)).id for n in range(_BACKLOG)]
    shutdown = SharedFileShutdown(hermes_kit.tmp_path / "stop")
    handler = _AskToStopAt(_STOP_AT)
    worker = hermes_kit.worker(shutdown=shutdown, handlers={JOB: [handler]})
    assert handler.holding.wait(DELIVERY_S), (
        f"{_STOP_AT} of {_BACKLOG} messages did not arrive within {DELIVERY_S} s (scaled): "
        f"{len(ledger)} did"
    )

    shutdown.shutdown()
    handler.asked.set()

    assert worker.join(SHUTDOWN_S), (
        f"a busy worker still runs {SHUTDOWN_S} s (scaled) after SharedFileShutdown asked, "
        f"having started {len(ledger) - _STOP_AT} more messages since"
    )
    worker.check()
    assert len(ledger) == _STOP_AT, (
        f"a busy worker asked to stop in the handler of message {_STOP_AT} started "
        f"{len(ledger) - _STOP_AT} more of the {_BACKLOG} waiting before it stopped: the "
        "loop must check the shutdown before every receive, not only when the queue is empty"
    )
    hermes_kit.worker()
    bound = hermes_kit.capabilities.redelivery_timeout_s + DELIVERY_S
    wait_for_progress(ledger.distinct, _BACKLOG, bound)
    wait_quiet(lambda: len(ledger), QUIET_S / 2, DELIVERY_S)
    check = TotalQueue.of(sent, ledger.ids())
    assert (len(check.lost), len(check.duplicated), len(check.unexpected)) == (0, 0, 0), (
        f"the backlog a stopped worker left did not reach the next worker intact: {check.summary()}"
    )
