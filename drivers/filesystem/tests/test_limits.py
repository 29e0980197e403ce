"""Fleet-wide limits in limits/: rate turns, slots across threads and processes, leases, scans."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hermes_test_support import DEADLINE_S, concurrently, eventually

from hermes.core.driver import LimitRule, SupportsLimits, Take
from hermes.core.drivertools import limit_state
from hermes.drivers.filesystem import FileSystemDriver, _limits


@pytest.fixture
def store(tmp_path: Path) -> FileSystemDriver:
    return FileSystemDriver(tmp_path / "store", fsync=False)


def limit_files(store: FileSystemDriver) -> list[str]:
    directory = Path(store.path) / "limits"
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def _state(store: FileSystemDriver, key: str) -> limit_state.State | None:
    states = dict(store.limit_scan(1000))
    return None if key not in states else limit_state.decode(states[key])


def _slot() -> str:
    return uuid.uuid4().hex


def _age(store: FileSystemDriver, name: str, seconds: float) -> None:
    """Make the file ``name`` look last written ``seconds`` ago."""
    path = Path(store.path) / "limits" / name
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_the_driver_keeps_limits(store: FileSystemDriver) -> None:
    assert isinstance(store, SupportsLimits)


def test_ten_concurrent_takes_get_one_start_and_turns_half_a_second_apart(
    store: FileSystemDriver,
) -> None:
    rule = LimitRule(interval_s=0.5, burst=1)

    answers, took = concurrently(10, lambda i: store.limit_take("rate", rule, _slot(), False, 30))

    waits = sorted(answer.wait_s for answer in answers)
    assert all(answer.charged for answer in answers)
    assert waits[0] == 0
    assert all(wait > 0 for wait in waits[1:]), waits
    # The k-th turn is k intervals after the first start; each wait is that
    # turn seen from when its take was decided, at most ``took`` later.
    for k, wait in enumerate(waits):
        assert 0.5 * k - took - 0.01 <= wait <= 0.5 * k + 0.01, (k, waits, took)
    for earlier, later in itertools.pairwise(waits[1:]):
        assert 0.5 - took - 0.01 <= later - earlier <= 0.5 + took + 0.01, (waits, took)


def test_three_slots_among_sixteen_threads_go_to_exactly_three(tmp_path: Path) -> None:
    # Two driver objects, as two processes would have.
    stores = [FileSystemDriver(tmp_path / "store", fsync=False) for _ in range(2)]
    rule = LimitRule(concurrency=3)

    answers, _ = concurrently(
        16, lambda i: stores[i % 2].limit_take("slots", rule, f"slot-{i}", False, 30)
    )

    assert len([answer for answer in answers if answer.wait_s == 0]) == 3
    assert all(answer.wait_s >= limit_state.MIN_WAIT_S for answer in answers if answer.wait_s)
    state = _state(stores[0], "slots")
    assert state is not None and len(state["slots"]) == 3


def _take_in_a_process(path: str, worker: int, barrier: Any, results: Any) -> None:
    store = FileSystemDriver(path, fsync=False)
    rule = LimitRule(concurrency=3)
    barrier.wait()
    started = 0
    for attempt in range(4):
        answer = store.limit_take("processes", rule, f"{worker}-{attempt}", False, 30)
        started += answer.wait_s == 0
    results.put(started)


def test_three_slots_among_four_processes_go_to_exactly_three(store: FileSystemDriver) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    results = context.Queue()
    workers = [
        context.Process(target=_take_in_a_process, args=(store.path, i, barrier, results))
        for i in range(4)
    ]
    for worker in workers:
        worker.start()
    started = [results.get(timeout=DEADLINE_S * 3) for _ in workers]
    for worker in workers:
        worker.join(DEADLINE_S)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    assert sum(started) == 3
    state = _state(store, "processes")
    assert state is not None and len(state["slots"]) == 3


def test_a_release_frees_one_slot(store: FileSystemDriver) -> None:
    rule = LimitRule(concurrency=2)
    held = [_slot(), _slot()]
    for slot in held:
        assert store.limit_take("release", rule, slot, False, 30).wait_s == 0
    assert store.limit_take("release", rule, _slot(), False, 30).wait_s > 0

    store.limit_release("release", held[0])
    store.limit_release("release", held[0])  # again: nothing happens
    store.limit_release("release", "never-held")
    store.limit_release("no-such-key", "never-held")
    assert limit_files(store) == ["k=release"]

    assert store.limit_take("release", rule, _slot(), False, 30).wait_s == 0
    assert store.limit_take("release", rule, _slot(), False, 30).wait_s > 0


def test_a_slot_whose_lease_is_not_renewed_is_free_after_it(store: FileSystemDriver) -> None:
    rule = LimitRule(concurrency=1)
    assert store.limit_take("lease", rule, "dies", False, 1.0).wait_s == 0
    assert store.limit_take("lease", rule, _slot(), False, 30).wait_s > 0

    eventually(
        lambda: store.limit_take("lease", rule, _slot(), False, 30).wait_s == 0,
        "the slot whose lease ran out to be free",
        interval_s=0.05,
    )
    assert store.limit_renew("lease", "dies", 30) is False


def test_a_renewal_keeps_the_slot_and_fails_for_an_unknown_one(store: FileSystemDriver) -> None:
    rule = LimitRule(concurrency=1)
    assert store.limit_take("renew", rule, "kept", False, 1.0).wait_s == 0

    until = time.monotonic() + 2.5  # more than twice the lease
    while time.monotonic() < until:
        assert store.limit_renew("renew", "kept", 1.0) is True
        assert store.limit_take("renew", rule, _slot(), False, 30).wait_s > 0
        time.sleep(0.2)

    assert store.limit_renew("renew", "unknown", 1.0) is False
    assert store.limit_renew("no-such-key", "kept", 1.0) is False
    store.limit_release("renew", "kept")
    assert store.limit_renew("renew", "kept", 1.0) is False


def test_a_job_already_charged_is_not_charged_again(store: FileSystemDriver) -> None:
    rule = LimitRule(interval_s=30.0, burst=1, concurrency=5)
    assert store.limit_take("charge", rule, _slot(), False, 30) == Take(0.0, True)
    deferred = store.limit_take("charge", rule, _slot(), False, 30)
    assert deferred.charged is True and deferred.wait_s > 20
    before = _state(store, "charge")
    assert before is not None

    # The deferred job, back at its turn: it runs and holds a slot, uncharged.
    slot = _slot()
    assert store.limit_take("charge", rule, slot, True, 30) == Take(0.0, True)

    after = _state(store, "charge")
    assert after is not None
    assert after["tat"] == before["tat"]
    assert slot in after["slots"]


def test_a_scan_lists_a_key_while_its_state_says_something(store: FileSystemDriver) -> None:
    assert store.limit_scan(10) == []
    store.limit_take("held", LimitRule(concurrency=2), "a", False, 30)
    store.limit_take("rate", LimitRule(interval_s=0.5), _slot(), False, 30)

    listed = dict(store.limit_scan(10))
    assert set(listed) == {"held", "rate"}
    assert list(limit_state.decode(listed["held"])["slots"]) == ["a"]
    assert listed["held"] == limit_state.encode(limit_state.decode(listed["held"]))
    assert len(store.limit_scan(1)) == 1
    assert store.limit_scan(0) == []

    store.limit_release("held", "a")
    assert "held" not in dict(store.limit_scan(10))
    eventually(
        lambda: store.limit_scan(10) == [],
        "the rate key to stop being listed once its turn passed",
        interval_s=0.05,
    )
    # Kept a while unlisted (it still knows how long slots were held), then deleted.
    assert limit_files(store) == ["k=held", "k=rate"]
    _age(store, "k=held", _limits.KEEP_AFTER_S + 1)
    assert store.limit_scan(10) == []
    assert limit_files(store) == ["k=rate"]


def test_a_file_holds_the_key_and_its_state_as_json(store: FileSystemDriver) -> None:
    store.limit_take("charge:customer 7/é", LimitRule(concurrency=1), "a", False, 30)
    (name,) = limit_files(store)
    stored = json.loads((Path(store.path) / "limits" / name).read_text())
    assert stored["key"] == "charge:customer 7/é"
    assert list(stored["state"]["slots"]) == ["a"]
    assert [key for key, _ in store.limit_scan(10)] == ["charge:customer 7/é"]


def test_a_long_key_is_scanned_by_its_own_name(store: FileSystemDriver) -> None:
    key = "charge:" + "x" * 400
    rule = LimitRule(concurrency=1)
    assert store.limit_take(key, rule, "a", False, 30).wait_s == 0
    assert store.limit_take(key, rule, "b", False, 30).wait_s > 0
    (name,) = limit_files(store)
    assert name.startswith("h=")
    assert [found for found, _ in store.limit_scan(10)] == [key]


def test_a_file_that_is_not_a_state_counts_as_an_unused_key(store: FileSystemDriver) -> None:
    rule = LimitRule(concurrency=1)
    store.limit_take("cut", rule, "a", False, 30)
    (Path(store.path) / "limits" / "k=cut").write_bytes(b'{"key": "cut", "sta')
    assert store.limit_scan(10) == []
    assert store.limit_renew("cut", "a", 30) is False
    assert store.limit_take("cut", rule, "b", False, 30).wait_s == 0
    assert [key for key, _ in store.limit_scan(10)] == ["cut"]


def test_the_sweep_deletes_unused_files_and_keeps_the_others(store: FileSystemDriver) -> None:
    store.limit_take("used", LimitRule(concurrency=1), "a", False, 30)
    store.limit_take("unused", LimitRule(concurrency=1), "a", False, 30)
    store.limit_release("unused", "a")
    store.limit_take("recent", LimitRule(concurrency=1), "a", False, 30)
    store.limit_release("recent", "a")
    for name in ("k=used", "k=unused"):
        _age(store, name, _limits.KEEP_AFTER_S + 1)

    _limits.sweep(store.path)

    assert limit_files(store) == ["k=recent", "k=used"]


def test_teardown_removes_the_limits(store: FileSystemDriver) -> None:
    store.limit_take("k", LimitRule(concurrency=1), "a", False, 30)
    store.teardown()
    assert not (Path(store.path) / "limits").exists()
    assert store.limit_take("k", LimitRule(concurrency=1), "b", False, 30).wait_s == 0
