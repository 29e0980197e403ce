"""Several handlers at once in one worker (``Dispatcher(concurrency=4)``).

Core's loop runs the handlers on threads and settles each message from the
thread that ran it, so the driver's ack and release must work from any
thread, and a broker's prefetch must let 4 messages be in flight. The
consumer goes to whichever thread is free: a handler that runs long is
overtaken, and the next receive is made on another thread (one at a time),
so receive must work from any thread too, and an ack must reach the broker
when it is made while another thread waits in a receive. With 4
handlers blocked and the worker SIGKILLed, all 4 messages come back on an
at-least-once driver and none on an at-most-once one. Three such worker
processes share 300 messages: none lost, none duplicated. Max items counts
finished messages and never starts more than asked.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from hermes.conformance._harness import (
    DELIVERY_S,
    OVERTAKEN_S,
    QUIET_S,
    STOP_S,
    WORKER_START_S,
    Kit,
    ReceivingThreads,
    Sleeps,
    TotalQueue,
    scaled,
    stays_false,
    wait_for_progress,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.conformance.test_competing_consumers import share_among_processes
from hermes.core import Message
from hermes.core.driver import Delivery

_CONCURRENCY = 4
_WORKERS = 3
_MESSAGES = 300
_MAX_ITEMS = 5


@pytest.mark.hermes_check("worker concurrency", "SIGKILL with 4 handlers in flight")
def test_a_worker_killed_with_four_handlers_in_flight_follows_the_declared_delivery(
    hermes_kit: Kit,
) -> None:
    hermes_kit.require_cross_process()
    caps = hermes_kit.capabilities
    sent = [hermes_kit.emit(hermes_kit.message(n)).id for n in range(_CONCURRENCY)]
    blocked = hermes_kit.spawn_worker(block=True, concurrency=_CONCURRENCY)

    def started_by(pid: int) -> set[str]:
        return {r.id for r in hermes_kit.records() if r.pid == pid}

    assert wait_until(lambda: started_by(blocked.pid) == set(sent), WORKER_START_S + DELIVERY_S), (
        f"a worker at concurrency {_CONCURRENCY} started {len(started_by(blocked.pid))} of "
        f"{_CONCURRENCY} handlers at once (a prefetch below the concurrency, or a loop that "
        f"waits for each handler)\n{hermes_kit.process_output()}"
    )
    blocked.kill()
    fresh = hermes_kit.spawn_worker(concurrency=_CONCURRENCY)
    assert wait_until(lambda: hermes_kit.statuses(fresh.pid), WORKER_START_S), (
        f"the fresh worker did not start\n{hermes_kit.process_output()}"
    )

    if caps.delivery is Delivery.AT_LEAST_ONCE:
        hermes_kit.claim("SIGKILL with 4 handlers in flight: all 4 delivered again")
        bound = caps.redelivery_timeout_s + DELIVERY_S
        assert wait_until(lambda: started_by(fresh.pid) >= set(sent), bound), (
            f"AT_LEAST_ONCE: of {_CONCURRENCY} messages in flight in a SIGKILLed worker, "
            f"{len(started_by(fresh.pid) & set(sent))} were delivered again within {bound} s "
            f"(unscaled)\n{hermes_kit.process_output()}"
        )
    else:
        hermes_kit.claim("SIGKILL with 4 handlers in flight: none delivered again")
        sentinel = hermes_kit.emit(hermes_kit.message(_CONCURRENCY))
        assert wait_until(lambda: sentinel.id in started_by(fresh.pid), DELIVERY_S), (
            f"the fresh worker handled nothing\n{hermes_kit.process_output()}"
        )
        assert stays_false(lambda: started_by(fresh.pid) & set(sent), QUIET_S), (
            "AT_MOST_ONCE: messages of a SIGKILLed worker were delivered again: "
            f"{sorted(started_by(fresh.pid) & set(sent))}"
        )


@pytest.mark.hermes_check("worker concurrency", "3 processes x concurrency 4, 300 messages")
def test_three_worker_processes_at_concurrency_four_share_300_messages(hermes_kit: Kit) -> None:
    sent, records = share_among_processes(hermes_kit, _CONCURRENCY)
    check = TotalQueue.of(sent, [r.id for r in records])
    per_worker = sorted(Counter(r.pid for r in records).values())
    hermes_kit.report(f"concurrency {_CONCURRENCY}: {check.summary()}; per worker {per_worker}")
    assert not check.lost, f"lost {len(check.lost)} messages: {sorted(check.lost)[:5]}"
    assert not check.unexpected, f"{len(check.unexpected)} unexpected ids"
    if hermes_kit.capabilities.competing_consumers:
        hermes_kit.claim("3 processes x concurrency 4: none lost, none duplicated")
        assert not check.duplicated, (
            f"{len(check.duplicated)} messages were handled more than once: "
            f"{dict(list(check.duplicated.items())[:5])}"
        )
    else:
        hermes_kit.claim("3 processes x concurrency 4: none lost (duplicates allowed)")


_OVERTAKEN = 12


@pytest.mark.hermes_check("worker concurrency", "receive on whichever thread is free", new=True)
def test_the_consumer_works_whichever_handler_thread_receives(hermes_kit: Kit) -> None:
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    sent = [hermes_kit.emit(hermes_kit.message(n)).id for n in range(_OVERTAKEN)]
    driver = hermes_kit.driver()
    receiving = ReceivingThreads(driver)
    worker = hermes_kit.worker(driver=driver, handlers={JOB: [Sleeps()]}, concurrency=_CONCURRENCY)
    assert wait_for_progress(ledger.distinct, len(sent), DELIVERY_S), (
        f"{len(sent) - ledger.distinct()} of {len(sent)} messages never arrived at a worker "
        f"of concurrency {_CONCURRENCY} whose handlers take {OVERTAKEN_S} s"
    )
    # The worker runs on until every message is settled: once the queue is empty a free
    # thread waits in receive, and the last handlers settle beside that wait.
    assert wait_until(lambda: receiving.settles()[0] >= len(sent), DELIVERY_S), (
        f"{receiving.settles()[0]} of {len(sent)} messages were settled by a running worker "
        f"within {DELIVERY_S} s (scaled)"
    )
    worker.stop()  # raises what ended the run: a consumer that refused a thread, say
    settles, beside_receive = receiving.settles()
    threads = receiving.distinct()
    assert threads >= 2, (
        f"every receive came from one thread, though each handler took {OVERTAKEN_S} s at "
        f"concurrency {_CONCURRENCY}: the worker no longer hands the consumer on"
    )
    hermes_kit.worker()  # takes what a settle lost between threads would bring back
    window_s = caps.redelivery_timeout_s + scaled(QUIET_S)
    stays_false(lambda: TotalQueue.of(sent, ledger.ids()).duplicated, window_s, scale=False)
    check = TotalQueue.of(sent, ledger.ids())
    hermes_kit.report(
        f"receives on {threads} threads, {beside_receive} of {settles} settles made while "
        f"another thread received: {check.summary()}"
    )
    assert not check.lost and not check.unexpected, check.summary()
    assert not check.duplicated, (
        f"{len(check.duplicated)} messages handled once came back: an ack made on a handler "
        f"thread, while another thread received ({beside_receive} of {settles} settles), must "
        "reach the broker; a client that is not thread-safe hands it to the receiving thread "
        f"(core's Handover): {sorted(check.duplicated)[:5]}"
    )
    hermes_kit.claim(f"receives on {threads} threads, settles off them: none lost or repeated")


class _Slow:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[str] = []

    def handle(self, message: Message) -> bool:
        with self.lock:
            self.started.append(message.id)
        time.sleep(0.05)
        return True


@pytest.mark.hermes_check("worker concurrency", "max items never overshoots")
def test_max_items_at_concurrency_four_starts_exactly_that_many(hermes_kit: Kit) -> None:
    hermes_kit.claim(f"max items {_MAX_ITEMS} at concurrency {_CONCURRENCY}: exactly that many")
    sent = [hermes_kit.emit(hermes_kit.message(n)).id for n in range(4 * _MAX_ITEMS)]
    slow = _Slow()
    driver = hermes_kit.driver()
    worker = hermes_kit.worker(
        driver=driver, handlers={JOB: [slow]}, concurrency=_CONCURRENCY, max_items=_MAX_ITEMS
    )
    assert worker.join(DELIVERY_S + STOP_S), (
        f"the run did not return after max items {_MAX_ITEMS} at concurrency {_CONCURRENCY}"
    )
    worker.check()
    assert len(slow.started) == _MAX_ITEMS, (
        f"max items {_MAX_ITEMS} at concurrency {_CONCURRENCY} started {len(slow.started)} handlers"
    )

    rest = hermes_kit.worker()
    remaining = set(sent) - set(slow.started)
    ledger = hermes_kit.ledger
    assert wait_until(lambda: remaining <= set(ledger.ids()), DELIVERY_S), (
        f"{len(remaining - set(ledger.ids()))} of the messages the first worker did not start "
        "never reached the next worker"
    )
    rest.stop()
