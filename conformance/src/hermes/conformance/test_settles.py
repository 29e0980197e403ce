"""Settles go out as what they were, whenever and from wherever they are made.

An acknowledgement made just before the worker stops reaches the broker
(a consumer that defers acks, or hands them to the client's thread, flushes
them in ``close()``): runs of a few messages each, serial and concurrent (up
to 8 at once, where a driver whose prefetch follows the concurrency batches
its acks), leave no duplicate behind. A release made from a handler thread that no
longer receives (another one took the consumer over while it ran) is a
release: the message comes back. A body set aside as poison stays set aside after
its lease would have run out. And a message whose broker connection dropped
between its receive and its settle is delivered again, never lost.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from hermes.conformance._harness import (
    DELIVERY_S,
    QUIET_S,
    STOP_S,
    Kit,
    KitDispatcher,
    ReceivingThreads,
    Sleeps,
    TotalQueue,
    scaled,
    stays_false,
    wait_for_progress,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.conformance.plugin import DropConnection
from hermes.conformance.test_delivery import _FailsOnceDispatcher, _RetrySendFailed
from hermes.conformance.test_leases import require_at_least_once
from hermes.core import Message
from hermes.core.driver import Delivery, Driver

_PER_RUN = 3
#: The concurrency of each run: serial, overtaken handlers, then enough at once that
#: a driver whose prefetch follows the concurrency batches its acknowledgements.
_CONCURRENCY = (1, 1, 2, 2, 8)
_RUNS = len(_CONCURRENCY)
_POISON = b"not a hermes message (the conformance kit's poison)"
#: What core logs for a body it sets aside.
_POISON_LOG = "which is not a Hermes message"


@pytest.mark.hermes_check("settles", "acks made just before a stop reach the broker", new=True)
def test_every_acknowledgement_reaches_the_broker_however_often_the_worker_stops(
    hermes_kit: Kit,
) -> None:
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    sent = [hermes_kit.emit(hermes_kit.message(n)).id for n in range(_RUNS * _PER_RUN)]
    for run in range(_RUNS):
        driver = hermes_kit.driver()
        # Serial runs, then concurrent ones whose handlers are overtaken: an ack
        # made off the receiving thread (handed to the client's own thread,
        # say) or held for a batch must be flushed by close() too.
        concurrency = _CONCURRENCY[run]
        concurrent = concurrency > 1
        worker = hermes_kit.worker(
            driver=driver,
            concurrency=concurrency,
            handlers={JOB: [Sleeps()]} if concurrent else None,
            max_items=_PER_RUN,
        )
        assert worker.join(DELIVERY_S + STOP_S), (
            f"run {run + 1}: a worker with max items {_PER_RUN} did not return"
        )
        worker.check()
        driver.close()  # as the worker's process would on exit
    hermes_kit.worker()  # takes whatever came back
    assert wait_for_progress(ledger.distinct, len(sent), DELIVERY_S), (
        f"{len(sent) - ledger.distinct()} of {len(sent)} messages never arrived"
    )
    window_s = caps.redelivery_timeout_s + scaled(QUIET_S)
    stays_false(lambda: TotalQueue.of(sent, ledger.ids()).duplicated, window_s, scale=False)
    check = TotalQueue.of(sent, ledger.ids())
    hermes_kit.report(f"{_RUNS} runs of max items {_PER_RUN}: {check.summary()}")
    assert not check.duplicated, (
        f"{len(check.duplicated)} messages handled once each came back after their worker "
        f"stopped ({_RUNS} runs of max items {_PER_RUN}): {sorted(check.duplicated)[:5]}; an "
        "acknowledgement deferred or handed to another thread must reach the broker in close()"
    )
    assert not check.lost and not check.unexpected, check.summary()
    hermes_kit.claim(f"{_RUNS} stops after {_PER_RUN} messages each: no duplicate")


class _FailsOnceOffThread(_FailsOnceDispatcher):
    """Raises for the first message once another thread has taken the consumer over,
    so its release is made off the receiving thread; handles every later message."""

    receiving: ReceivingThreads | None = None

    def handle_message(self, message: Message, priority: int) -> bool:
        if not self.raised and self.receiving is not None:
            self.receiving.wait_for_other(DELIVERY_S)
        return super().handle_message(message, priority)


@pytest.mark.hermes_check("settles", "a release from a handler thread", new=True)
def test_a_message_released_from_a_handler_thread_at_concurrency_four_comes_back(
    hermes_kit: Kit,
) -> None:
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    message = hermes_kit.emit(hermes_kit.message(1))
    driver = hermes_kit.driver()
    receiving = ReceivingThreads(driver)
    failing = hermes_kit.worker(
        driver=driver, dispatcher_class=_FailsOnceOffThread, concurrency=4, start=False
    )
    assert isinstance(failing.dispatcher, _FailsOnceOffThread), (
        f"the kit's worker was built with {type(failing.dispatcher).__name__}, "
        "not the dispatcher_class it was given"
    )
    failing.dispatcher.receiving = receiving
    failing.start()
    assert wait_until(lambda: ledger.has(message.id), DELIVERY_S), (
        f"message {message.id} was not delivered within {DELIVERY_S} s (scaled)"
    )
    assert failing.join(DELIVERY_S), (
        "at concurrency 4, an Exception escaping the callback must end the run; it went on"
    )
    failing.stop(expect=_RetrySendFailed)
    hermes_kit.worker()
    if caps.delivery is Delivery.AT_LEAST_ONCE:
        bound = caps.redelivery_timeout_s + DELIVERY_S
        assert wait_until(lambda: len(ledger.of(message.id)) >= 2, bound), (
            f"AT_LEAST_ONCE: a message released from a handler thread (concurrency 4) was not "
            f"delivered again within redelivery_timeout_s + {DELIVERY_S} = {bound} s: the "
            "release reached the broker as something else"
        )
        hermes_kit.claim("a release from a handler thread (concurrency 4): delivered again")
    else:
        sentinel = hermes_kit.emit(hermes_kit.message(2))
        assert wait_until(lambda: ledger.has(sentinel.id), DELIVERY_S), (
            f"a message sent after the release was not delivered within {DELIVERY_S} s"
        )
        hermes_kit.claim("a release from a handler thread (concurrency 4): AT_MOST_ONCE, gone")


@pytest.mark.hermes_check("malformed input", "set aside for good, past its lease", new=True)
def test_a_rejected_body_does_not_come_back_after_its_lease_runs_out(
    hermes_kit: Kit, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger

    def complaints() -> int:
        return sum(1 for r in caplog.records if _POISON_LOG in r.getMessage())

    hermes_kit.sender.send_raw(_POISON)
    first = hermes_kit.worker()
    assert wait_until(lambda: complaints() >= 1, DELIVERY_S), (
        f"a body that is not a message was not logged within {DELIVERY_S} s (scaled)"
    )
    first.stop()
    first.driver.close()  # its worker is gone: whatever it still held is the broker's again

    sentinel = hermes_kit.emit(hermes_kit.message(1))
    hermes_kit.worker()
    assert wait_until(lambda: ledger.has(sentinel.id), DELIVERY_S), (
        f"a message sent after the poison was not delivered within {DELIVERY_S} s (scaled)"
    )
    window_s = caps.redelivery_timeout_s + scaled(QUIET_S)
    assert stays_false(lambda: complaints() > 1, window_s, scale=False), (
        f"a body set aside as poison came back after its worker was gone (watched "
        f"redelivery_timeout_s + {QUIET_S} s): reject() must remove it or set it aside, "
        "not leave it held"
    )
    hermes_kit.claim("a rejected body stays set aside past redelivery_timeout_s")


class _BlocksThenFails(KitDispatcher):
    """Blocks in its callback until the test lets it go, then raises: a release."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = threading.Event()
        self.go_on = threading.Event()

    def handle_message(self, message: Message, priority: int) -> bool:
        ok = super().handle_message(message, priority)
        if not self.started.is_set():
            self.started.set()
            self.go_on.wait(scaled(DELIVERY_S + STOP_S))
            raise _RetrySendFailed(f"message {message.id} fails after its connection dropped")
        return ok


@pytest.mark.hermes_check("settles", "connection dropped between receive and settle", new=True)
def test_a_message_whose_connection_dropped_before_its_settle_is_delivered_again(
    hermes_kit: Kit, hermes_drop_connection: DropConnection
) -> None:
    require_at_least_once(hermes_kit)
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    driver: Driver = hermes_kit.driver()
    if hermes_drop_connection.how(driver) is None:
        pytest.skip(hermes_drop_connection.skip_reason)
    message = hermes_kit.emit(hermes_kit.message(1))
    worker = hermes_kit.worker(driver=driver, dispatcher_class=_BlocksThenFails)
    dispatcher = worker.dispatcher
    assert isinstance(dispatcher, _BlocksThenFails), f"the kit worker made a {dispatcher!r}"
    assert dispatcher.started.wait(scaled(DELIVERY_S)), (
        f"message {message.id} was not delivered within {DELIVERY_S} s (scaled)"
    )
    try:
        how = hermes_drop_connection(driver)
    finally:
        dispatcher.go_on.set()  # the release goes out on a connection that is gone
    if hermes_drop_connection.said:
        hermes_kit.report(f"{how}: {hermes_drop_connection.said}")
    assert worker.join(DELIVERY_S + STOP_S), "the worker did not end after its callback raised"
    # The callback's error, or the broker's if the release could not go out.
    worker.stop(expect=Exception)
    driver.close()

    hermes_kit.worker()
    bound = caps.redelivery_timeout_s + DELIVERY_S
    assert wait_until(lambda: len(ledger.of(message.id)) >= 2, bound), (
        f"a message released after its broker connection was dropped ({how}) was not "
        f"delivered again within redelivery_timeout_s + {DELIVERY_S} = {bound} s (unscaled): "
        "it was lost"
    )
    hermes_kit.claim(f"connection dropped mid-handler ({how}): delivered again")
