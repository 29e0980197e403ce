"""Delivery counts: how many times the broker handed a message out, and ``max_deliveries``.

``counts_deliveries=True``: the consumer sets ``Received.delivery_count`` to 1
on a first delivery and to more once the message was given back and taken
again, and a :class:`~hermes.core.Worker` with ``max_deliveries=N`` sets a
message delivered more than N times aside instead of calling its handler
(the message that kills its worker every time). ``False``: the count is
None, and ``max_deliveries`` changes nothing -- the message is handled.

A redelivery is made with the consumer's own ``release`` (what a worker does
when its callback dies): the kit takes the message and gives it back, as a
worker killed mid-handler would leave it, without waiting for a lease or a
visibility timeout to run out.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

import pytest

from hermes.conformance._harness import (
    DELIVERY_S,
    QUIET_S,
    WORKER_START_S,
    Kit,
    stays_false,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.core import Message, Worker
from hermes.core.driver import Consumer, Delivery, Received

#: The ``max_deliveries`` the kit runs a worker with.
LIMIT = 2


def _take(consumer: Consumer, message: Message) -> Received:
    """Receive until ``message`` comes (anything else is acknowledged); fail after DELIVERY_S."""
    found: list[Received] = []

    def arrived() -> bool:
        received = consumer.receive(0.2)
        if received is None:
            return False
        if message.id.encode() in _bytes(received.body):
            found.append(received)
            return True
        consumer.ack(received)
        return False

    assert wait_until(arrived, DELIVERY_S), (
        f"message {message.id} was not received within {DELIVERY_S} s (scaled)"
    )
    return found[0]


def _bytes(body: str | bytes) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)


@pytest.mark.hermes_check("deliveries", "delivery_count as declared")
def test_a_counting_driver_reports_one_then_more_after_a_redelivery(hermes_kit: Kit) -> None:
    message = hermes_kit.emit(hermes_kit.message(1))
    consumer = hermes_kit.driver().consumer([])
    try:
        first = _take(consumer, message)
        if not hermes_kit.capabilities.counts_deliveries:
            hermes_kit.claim("delivery_count: None (the driver does not count)")
            assert first.delivery_count is None, (
                f"counts_deliveries=False, yet the consumer reported delivery_count="
                f"{first.delivery_count!r}: declare counts_deliveries=True"
            )
            consumer.ack(first)
            return
        hermes_kit.claim("delivery_count: 1, then more after a redelivery")
        assert first.delivery_count == 1, (
            f"counts_deliveries=True: the first delivery must report delivery_count=1, "
            f"got {first.delivery_count!r}"
        )
        consumer.release(first)
        again = _take(consumer, message)
        assert again.delivery_count is not None and again.delivery_count >= 2, (
            f"a message given back and taken again must report delivery_count >= 2, "
            f"got {again.delivery_count!r}"
        )
        consumer.ack(again)
    finally:
        consumer.close()


@pytest.mark.hermes_check("deliveries", "max_deliveries sets aside or is inert, as declared")
def test_a_worker_sets_aside_what_was_delivered_more_than_max_deliveries(hermes_kit: Kit) -> None:
    counts = hermes_kit.capabilities.counts_deliveries
    killer = hermes_kit.emit(hermes_kit.message(1))
    if counts:
        consumer = hermes_kit.driver().consumer([])
        try:
            for _ in range(LIMIT):  # LIMIT deliveries whose worker "died": never settled
                consumer.release(_take(consumer, killer))
        finally:
            consumer.close()
    fine = hermes_kit.emit(hermes_kit.message(2))
    with _limited_worker(hermes_kit) as (worker, handled):
        if counts:
            hermes_kit.claim(f"max_deliveries={LIMIT}: set aside on delivery {LIMIT + 1}")
            assert wait_until(lambda: fine.id in handled and worker.stats.set_aside, DELIVERY_S), (
                f"within {DELIVERY_S} s (scaled): handled {handled}, set aside "
                f"{worker.stats.set_aside}; expected {fine.id} handled and {killer.id} set aside"
            )
            assert killer.id not in handled, (
                f"message {killer.id} was delivered {LIMIT} times before, yet its handler ran "
                f"with max_deliveries={LIMIT}"
            )
            assert stays_false(lambda: killer.id in handled, QUIET_S), (
                f"message {killer.id} came back after it was set aside"
            )
        else:
            hermes_kit.claim("max_deliveries: inert, the message is handled")
            assert wait_until(lambda: {killer.id, fine.id} <= set(handled), DELIVERY_S), (
                f"counts_deliveries=False: both messages must be handled, got {handled}"
            )
            assert worker.stats.set_aside == 0, (
                f"counts_deliveries=False, yet the worker set {worker.stats.set_aside} aside"
            )


def _taken_by(kit: Kit, message_id: str, pid: int) -> bool:
    """Whether the worker process ``pid`` has recorded taking ``message_id``."""
    return any(r.id == message_id and r.pid == pid for r in kit.records())


@pytest.mark.hermes_check("deliveries", "counts survive SIGKILLed workers", new=True)
def test_a_message_that_kills_its_workers_is_set_aside_after_max_deliveries(
    hermes_kit: Kit,
) -> None:
    """The count lives with the message, not in a worker: a message whose handler kills
    its worker process every time (a poison pill) is set aside once it has killed
    ``LIMIT`` of them, however many processes that took."""
    hermes_kit.require_cross_process()
    caps = hermes_kit.capabilities
    if not caps.counts_deliveries:
        pytest.skip("n/a: driver declares counts_deliveries=False (max_deliveries is inert)")
    if caps.delivery is not Delivery.AT_LEAST_ONCE:
        pytest.skip("n/a: driver declares AT_MOST_ONCE (a killed worker's message is gone)")
    killer = hermes_kit.emit(hermes_kit.message(1))
    bound = WORKER_START_S + caps.redelivery_timeout_s + DELIVERY_S
    for death in range(1, LIMIT + 1):
        blocked = hermes_kit.spawn_worker(block=True)
        taken = wait_until(functools.partial(_taken_by, hermes_kit, killer.id, blocked.pid), bound)
        assert taken, (
            f"delivery {death} of message {killer.id} never reached a fresh worker within "
            f"{bound} s (scaled)\n{hermes_kit.process_output()}"
        )
        blocked.kill()
    fine = hermes_kit.emit(hermes_kit.message(2))
    with _limited_worker(hermes_kit) as (worker, handled):
        settled = wait_until(
            lambda: fine.id in handled and (worker.stats.set_aside or killer.id in handled),
            caps.redelivery_timeout_s + DELIVERY_S,
        )
        assert settled, (
            f"within {caps.redelivery_timeout_s + DELIVERY_S:g} s (scaled): handled {handled}, "
            f"set aside {worker.stats.set_aside}; expected {fine.id} handled and {killer.id} "
            "set aside"
        )
        assert killer.id not in handled, (
            f"message {killer.id} killed {LIMIT} worker processes mid-handler, yet a worker "
            f"with max_deliveries={LIMIT} ran its handler again: its delivery count did not "
            "survive the workers it killed"
        )
        assert stays_false(lambda: killer.id in handled, QUIET_S), (
            f"message {killer.id} came back after it was set aside"
        )
    hermes_kit.claim(f"set aside after killing {LIMIT} worker processes (max_deliveries={LIMIT})")


@contextlib.contextmanager
def _limited_worker(kit: Kit) -> Iterator[tuple[Worker, list[str]]]:
    """A worker with ``max_deliveries=LIMIT`` running on a thread for the block, and the
    ids its handler was called with."""
    handled: list[str] = []
    lock = threading.Lock()

    def handle(message: Message) -> bool:
        with lock:
            handled.append(message.id)
        return True

    done = threading.Event()
    worker = Worker(
        kit.driver(),
        {JOB: handle},
        max_deliveries=LIMIT,
        handle_signals=False,
        stop_when=done.is_set,
    )
    thread = threading.Thread(target=worker.run, name="kit-deliveries", daemon=True)
    thread.start()
    try:
        yield worker, handled
    finally:
        done.set()
        thread.join(DELIVERY_S)
