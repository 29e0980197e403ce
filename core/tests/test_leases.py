"""Handover: settles reach a client that is not thread-safe through whichever thread owns it."""

from __future__ import annotations

import threading
import time

from hermes.core.drivertools import AckBatch, Handover, MemoryDriver


def test_a_settle_on_the_owner_runs_at_once_and_one_from_another_thread_waits_and_wakes() -> None:
    woken: list[int] = []
    handover = Handover(MemoryDriver(), wake=lambda: woken.append(1))
    handover.claim()
    done: list[str] = []
    handover.call(done.append, "on the owner")
    assert done == ["on the owner"]

    other = threading.Thread(target=handover.call, args=(done.append, "from a handler"))
    other.start()
    other.join()
    assert done == ["on the owner"]
    assert handover.pending() == 1 and woken == [1]
    handover.run_pending()
    assert done == ["on the owner", "from a handler"]


def test_once_another_thread_claims_the_client_the_former_owners_settles_are_queued() -> None:
    handover = Handover(MemoryDriver())
    done: list[str] = []
    former_claimed = threading.Event()

    def former_owner() -> None:
        handover.claim()
        former_claimed.set()
        receiver_claimed.wait()
        handover.call(done.append, "settled after the claim")

    receiver_claimed = threading.Event()
    former = threading.Thread(target=former_owner)
    former.start()
    assert former_claimed.wait(5)
    handover.claim()  # the worker's next receive, on this thread
    receiver_claimed.set()
    former.join()
    assert done == []
    assert handover.pending() == 1
    handover.run_pending()
    assert done == ["settled after the claim"]


def test_a_claim_waits_for_a_settle_the_former_owner_is_running_at_once() -> None:
    handover = Handover(MemoryDriver())
    in_settle, finish = threading.Event(), threading.Event()
    order: list[str] = []

    def slow_settle() -> None:
        in_settle.set()
        finish.wait(5)
        order.append("settle finished")

    def former_owner() -> None:
        handover.claim()
        handover.call(slow_settle)

    former = threading.Thread(target=former_owner)
    former.start()
    assert in_settle.wait(5)
    claimer = threading.Thread(target=lambda: (handover.claim(), order.append("claimed")))
    claimer.start()
    claimer.join(0.2)
    assert claimer.is_alive(), "the claim returned while the former owner used the client"
    finish.set()
    claimer.join(5)
    former.join(5)
    assert order == ["settle finished", "claimed"]


def test_acknowledgements_wait_for_the_next_send_and_go_oldest_first() -> None:
    batch: AckBatch[int] = AckBatch()

    assert batch.add(1) and batch.add(2)
    assert len(batch) == 2 and not batch.due()
    assert batch.take() == [1, 2]
    assert len(batch) == 0 and batch.take() == []


def test_a_batch_is_due_once_most_wait() -> None:
    batch: AckBatch[int] = AckBatch(most=2, delay_s=3600)
    batch.add(1)
    assert not batch.due()
    batch.add(2)
    assert batch.due()


def test_a_batch_is_due_once_the_oldest_waited_its_delay() -> None:
    batch: AckBatch[int] = AckBatch(delay_s=0.01)
    assert not batch.due()  # nothing waits
    batch.add(1)
    deadline = time.monotonic() + 30
    while not batch.due():
        assert time.monotonic() < deadline, "never due"
        time.sleep(0.005)
    batch.take()
    assert not batch.due()


def test_what_a_failed_send_took_goes_first_with_the_next() -> None:
    batch: AckBatch[int] = AckBatch(delay_s=3600)
    batch.add(1)
    taken = batch.take()
    batch.add(2)
    batch.put_back(taken)

    assert batch.take() == [1, 2]


def test_while_idle_an_acknowledgement_is_not_held_and_the_caller_sends_it() -> None:
    batch: AckBatch[int] = AckBatch()
    batch.add(1)
    assert not batch.is_idle
    with batch.idle() as waiting:
        assert waiting and batch.is_idle  # send what waits before the wait
        assert batch.add(2) is False
    assert batch.take() == [1]
    with batch.idle() as waiting:
        assert not waiting
    assert batch.add(3) and batch.take() == [3]


def test_acknowledgements_from_many_threads_are_all_kept() -> None:
    batch: AckBatch[int] = AckBatch()
    threads = [
        threading.Thread(target=lambda n=n: [batch.add(n * 1000 + i) for i in range(1000)])
        for n in range(4)
    ]
    for thread in threads:
        thread.start()
    taken: list[int] = []
    while any(thread.is_alive() for thread in threads):
        taken += batch.take()
    for thread in threads:
        thread.join()
    taken += batch.take()

    assert sorted(taken) == list(range(1000)) + list(range(1000, 2000)) + list(
        range(2000, 3000)
    ) + list(range(3000, 4000))
