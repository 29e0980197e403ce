"""Handover: settles reach a client that is not thread-safe through whichever thread owns it."""

from __future__ import annotations

import threading

from hermes.core.driver import Handover


def test_a_settle_on_the_owner_runs_at_once_and_one_from_another_thread_waits_and_wakes() -> None:
    woken: list[int] = []
    handover = Handover(wake=lambda: woken.append(1))
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
    handover = Handover()
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
    handover = Handover()
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
