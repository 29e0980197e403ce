"""Leases: a message is held for as long as its handler runs, and only that long.

At-least-once drivers whose broker hands a message out again after a timeout
(a lease, a visibility timeout) must keep extending it while the handler
runs: a handler three times ``redelivery_timeout_s`` long is delivered once,
though a second worker polls the queue all along. And when a worker stops
with a handler still running past its grace period, the consumer is closed
with that message unsettled: it must not go to another worker at once (the
handler may still be running), and must come back once the worker is gone.

Leases are the broker's time, not the kit's: the spans measured against
``redelivery_timeout_s`` are not scaled by ``HERMES_KIT_TIME_SCALE``.
"""

from __future__ import annotations

import threading
import time

import pytest

from hermes.conformance._harness import (
    DELIVERY_S,
    QUIET_S,
    STOP_S,
    WORKER_START_S,
    Kit,
    scaled,
    stays_false,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.core import Message
from hermes.core.driver import Delivery

#: The grace period of the stopping worker: short, so its handler outlives it.
_GRACE_S = 0.2


def require_at_least_once(kit: Kit) -> None:
    if kit.capabilities.delivery is not Delivery.AT_LEAST_ONCE:
        pytest.skip("n/a: AT_MOST_ONCE removes a message when it is taken: nothing is leased")


class _Runs:
    """Runs ``seconds`` (the first delivery only; later ones return at once)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = threading.Event()
        self.finished = threading.Event()
        self.let_go = threading.Event()

    def handle(self, message: Message) -> bool:
        if self.started.is_set():
            return True
        self.started.set()
        self.let_go.wait(self.seconds)
        self.finished.set()
        return True


@pytest.mark.hermes_check("leases", "a handler 3x redelivery_timeout_s long", new=True)
def test_a_handler_running_three_times_the_redelivery_timeout_is_delivered_once(
    hermes_kit: Kit,
) -> None:
    require_at_least_once(hermes_kit)
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    # A broker that returns a message only when its worker's connection closes
    # (redelivery_timeout_s = 0) still gets a handler of a few seconds.
    runs_s = 3 * max(caps.redelivery_timeout_s, scaled(QUIET_S))
    long = _Runs(runs_s)
    message = hermes_kit.emit(hermes_kit.message(1))
    # Concurrency 2: the worker running the long handler could take the message again itself.
    hermes_kit.worker(handlers={JOB: [long]}, concurrency=2)
    assert long.started.wait(scaled(DELIVERY_S)), (
        f"message {message.id} was not delivered within {DELIVERY_S} s (scaled)"
    )
    started_at = time.monotonic()
    if caps.competing_consumers:
        hermes_kit.worker()  # polls the queue while the long handler runs

    assert wait_until(long.finished.is_set, runs_s + scaled(STOP_S), scale=False), (
        f"the long handler did not return after its {runs_s:.1f} s (a kit bug)"
    )
    again = ledger.of(message.id)[1:]
    assert not again, (
        f"a message whose handler runs {runs_s:.1f} s (3 x redelivery_timeout_s="
        f"{caps.redelivery_timeout_s:g}) was delivered again to {again[0].worker} "
        f"{again[0].at - ledger.of(message.id)[0].at:.1f} s after it was taken, while the "
        "first handler still ran: the lease must be extended while a handler runs"
    )
    after_s = caps.redelivery_timeout_s + scaled(QUIET_S)
    assert stays_false(lambda: len(ledger.of(message.id)) > 1, after_s, scale=False), (
        f"a message whose long handler returned True was delivered again "
        f"{time.monotonic() - started_at:.1f} s after it was taken: its ack did not hold"
    )
    hermes_kit.claim(
        f"a handler of {runs_s:.1f} s (3 x redelivery_timeout_s): delivered once"
        + (", with a second worker polling" if caps.competing_consumers else "")
    )


@pytest.mark.hermes_check("leases", "a handler outliving the grace period", new=True)
def test_a_handler_outliving_the_grace_period_keeps_its_message_until_its_worker_is_gone(
    hermes_kit: Kit,
) -> None:
    require_at_least_once(hermes_kit)
    caps = hermes_kit.capabilities
    timeout_s = caps.redelivery_timeout_s
    ledger = hermes_kit.ledger
    stuck = _Runs(scaled(DELIVERY_S + STOP_S) + 2 * timeout_s)
    message = hermes_kit.emit(hermes_kit.message(1))
    stopping = hermes_kit.worker(handlers={JOB: [stuck]}, concurrency=2, grace_s=_GRACE_S)
    assert stuck.started.wait(scaled(DELIVERY_S)), (
        f"message {message.id} was not delivered within {DELIVERY_S} s (scaled)"
    )
    try:
        stopping.stop()  # returns after the grace period: the handler still runs
        assert not stuck.finished.is_set(), "the stuck handler returned early (a kit bug)"
        stopped_at = time.monotonic()
        other = hermes_kit.worker()
        if timeout_s > 0:
            # Within its lease the message stays with the worker whose handler runs it.
            within_s = timeout_s / 2
            assert stays_false(lambda: len(ledger.of(message.id)) > 1, within_s, scale=False), (
                f"a message whose handler outlived the grace period was handed to "
                f"{ledger.of(message.id)[-1].worker} {time.monotonic() - stopped_at:.2f} s after "
                f"the stop, while that handler still ran (redelivery_timeout_s={timeout_s:g}): "
                "close() must not release a message that is still held"
            )
    finally:
        stuck.let_go.set()  # the handler returns now; core settles nothing after close()
    stopping.driver.close()

    if caps.cross_process:
        # A broker may keep a message held until its worker's process exits (the
        # filesystem driver's lock): "gone" is a worker process stopped past its grace.
        other.stop()  # the process must take the next message
        gone = hermes_kit.emit(hermes_kit.message(2))
        process = hermes_kit.spawn_worker(block=True, concurrency=2, grace_s=_GRACE_S)

        def started(message_id: str) -> bool:
            return any(r.id == message_id and r.pid == process.pid for r in hermes_kit.records())

        assert wait_until(lambda: started(gone.id), WORKER_START_S + DELIVERY_S), (
            f"the worker process never started the handler\n{hermes_kit.process_output()}"
        )
        process.ask_to_stop()
        assert process.wait_exit(STOP_S) is not None, (
            f"a worker process asked to stop did not exit after its {_GRACE_S} s grace "
            f"period\n{hermes_kit.process_output()}"
        )
        message, what = gone, "after its worker process exited"
        other = hermes_kit.worker()
    else:
        what = "after its worker was gone (its driver closed)"
    bound_s = timeout_s + scaled(DELIVERY_S)
    assert wait_until(
        lambda: other.name in {e.worker for e in ledger.of(message.id)}, bound_s, scale=False
    ), (
        f"AT_LEAST_ONCE: a message whose handler outlived the grace period was not delivered "
        f"again within redelivery_timeout_s + {DELIVERY_S} s (scaled) = {bound_s:.1f} s {what}"
    )
    if timeout_s > 0:
        hermes_kit.claim(
            "a handler outliving the grace period: held while it runs, delivered again once "
            "its worker is gone"
        )
    else:
        hermes_kit.claim(
            "a handler outliving the grace period: delivered again once its worker is gone "
            "(redelivery_timeout_s=0: at once)"
        )


#: Messages that finish while the first one's handler still runs: enough for a driver
#: whose prefetch follows the concurrency to send several batches of acks.
_OVERTAKING = 12


class _BlocksOn:
    """Blocks in the handler of one message until let go; handles every other at once."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.started = threading.Event()
        self.let_go = threading.Event()

    def handle(self, message: Message) -> bool:
        if message.id == self.message_id and not self.started.is_set():
            self.started.set()
            self.let_go.wait(scaled(DELIVERY_S + STOP_S) + 60)
        return True


@pytest.mark.hermes_check(
    "leases", "a running handler's message outlives the acks of those that overtook it", new=True
)
def test_a_message_whose_handler_runs_on_while_later_ones_are_acked_comes_back_after_a_death(
    hermes_kit: Kit,
) -> None:
    """An acknowledgement covers the message it names and no other: a driver that acks
    cumulatively (``multiple=True`` up to the last finished) takes with it the message
    whose handler still runs, and a death then loses that message."""
    require_at_least_once(hermes_kit)
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    first = hermes_kit.emit(hermes_kit.message(0))
    others = [hermes_kit.emit(hermes_kit.message(n)).id for n in range(1, _OVERTAKING + 1)]

    if caps.cross_process:
        process = hermes_kit.spawn_worker(block_n=0, concurrency=4)

        def handled_there() -> set[str]:
            return {r.id for r in hermes_kit.records() if r.pid == process.pid}

        assert wait_until(
            lambda: {first.id, *others} <= handled_there(), WORKER_START_S + DELIVERY_S
        ), (
            f"the worker process did not start message {first.id} and handle the "
            f"{_OVERTAKING} after it\n{hermes_kit.process_output()}"
        )
        time.sleep(scaled(QUIET_S))  # acks batched behind the handlers go out meanwhile
        process.kill()
        what = "after its worker process was SIGKILLed"
    else:
        blocker = _BlocksOn(first.id)
        worker = hermes_kit.worker(handlers={JOB: [blocker]}, concurrency=4, grace_s=_GRACE_S)
        assert wait_until(
            lambda: blocker.started.is_set() and set(others) <= set(ledger.ids()), DELIVERY_S
        ), f"message {first.id} did not start, or the {_OVERTAKING} after it were not handled"
        time.sleep(scaled(QUIET_S))
        try:
            worker.stop()  # returns after the grace period: the handler still runs
        finally:
            blocker.let_go.set()  # core settles nothing after close()
        worker.driver.close()  # as the dying process's connections would be
        what = "after its worker stopped past its grace period and closed its driver"

    other = hermes_kit.worker()
    bound_s = caps.redelivery_timeout_s + scaled(DELIVERY_S)
    assert wait_until(
        lambda: other.name in {e.worker for e in ledger.of(first.id)}, bound_s, scale=False
    ), (
        f"AT_LEAST_ONCE: message {first.id}, whose handler still ran while the "
        f"{_OVERTAKING} after it were handled and acknowledged, was not delivered again "
        f"within {bound_s:.1f} s {what}: an acknowledgement must not cover a message whose "
        "handler has not finished"
    )
    hermes_kit.claim(
        f"a handler running while {_OVERTAKING} later messages were acknowledged: its "
        "message came back after the death"
    )
