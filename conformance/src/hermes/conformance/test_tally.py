"""Tallies (``SupportsTally``): the atomic count a workflow's group ends by.

For a driver that has ``tally_add`` and ``tally_read``: a member added twice
counts once and keeps its first value; members added at once by threads
(sharing a driver, or with one each) and by processes are each counted once,
exactly one call adds each, and a call that adds the last member sees the
full count (a group whose last member saw less would never end); one member
added by many at once is added by exactly one; a set is gone once its ttl
passed (within a second of expiry precision), not before; and a namespace
never sees another's sets. A driver without them is reported as not
verified: workflows then count a group by compare-and-set on its record.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from hermes.conformance._harness import (
    CLOSE_S,
    Kit,
    call_within,
    namespace_for,
    scaled,
    wait_until,
)
from hermes.core import connect
from hermes.core.driver import Driver, SupportsTally, SupportsTeardown
from hermes.core.drivertools import isolated_url

#: Threads adding at once, and the distinct members each adds.
_THREADS = 8
_EACH = 25
#: Processes adding at once, and the members each adds (on threads of its own).
_PROCESSES = 4
_PROCESS_THREADS = 4
_PROCESS_EACH = 10
#: How long the sets of the checks are kept: longer than any check.
_KEPT_S = 600.0
#: The ttl of the expiry check, and how much expiry may lag behind it (both scaled).
_TTL_S = 1.0
_PRECISION_S = 1.0


def _tally(driver: Driver) -> SupportsTally:
    if not isinstance(driver, SupportsTally):
        pytest.skip(
            "not verified: the driver has no tally_add()/tally_read(); workflows count "
            "a group's members by compare-and-set on its record"
        )
    return driver


def _add(store: SupportsTally, key: str, member: str, value: bytes) -> tuple[bool, int]:
    answer = store.tally_add(key, member, value, _KEPT_S)
    what = f"tally_add({key!r}, {member!r})"
    assert isinstance(answer, tuple) and len(answer) == 2, f"{what} returned {answer!r}"
    added, count = answer
    assert isinstance(added, bool), f"{what} returned added={added!r}, not a bool"
    assert isinstance(count, int) and not isinstance(count, bool), (
        f"{what} returned count={count!r}, not an int"
    )
    return added, count


@pytest.mark.hermes_check("tally", "a member added twice counts once", new=True)
def test_a_member_added_twice_counts_once_and_keeps_its_first_value(hermes_kit: Kit) -> None:
    store = _tally(hermes_kit.driver())
    key = "kit:twice"
    first = _add(store, key, "a", b"first")
    assert first == (True, 1), f"the first add to a new key answered {first}, not (True, 1)"
    again = _add(store, key, "a", b"second")
    assert again == (False, 1), f"the same member added again answered {again}, not (False, 1)"
    other = _add(store, key, "b", b"other")
    assert other == (True, 2), f"a second member added answered {other}, not (True, 2)"
    read = store.tally_read(key)
    assert read == {"a": b"first", "b": b"other"}, (
        f"tally_read gave {read!r}: a member's first value stays, whatever is added after"
    )
    assert store.tally_read("kit:never-added") == {}, "an unknown key must read as {}"
    hermes_kit.claim("added twice: counted once, its first value kept")


@pytest.mark.hermes_check("tally", "members added at once by threads: each once", new=True)
def test_members_added_by_threads_at_once_are_each_counted_once_and_one_sees_them_all(
    hermes_kit: Kit,
) -> None:
    shared = _tally(hermes_kit.driver())
    stores = [shared] * (_THREADS // 2)
    stores += [_tally(hermes_kit.driver()) for _ in range(_THREADS - _THREADS // 2)]
    key, total = "kit:threads", _THREADS * _EACH
    barrier = threading.Barrier(_THREADS)
    answers: list[tuple[str, bool, int]] = []
    errors: list[BaseException] = []

    def add(n: int, store: SupportsTally) -> None:
        try:
            barrier.wait()
            for i in range(_EACH):
                member = f"m{n}-{i}"
                added, count = _add(store, key, member, member.encode())
                answers.append((member, added, count))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(n, s)) for n, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, f"tally_add raised {errors[0]!r}"
    added = sum(1 for _, was_added, _ in answers if was_added)
    assert added == total, f"{total} distinct members added at once: {added} calls said added"
    most = max(count for _, _, count in answers)
    assert most == total, (
        f"{total} distinct members added by {_THREADS} threads at once: the highest count any "
        f"call saw was {most}, so the call that added the last one did not see them all"
    )
    read = shared.tally_read(key)
    assert len(read) == total and all(read[m] == m.encode() for m, _, _ in answers), (
        f"tally_read gave {len(read)} members, not the {total} added with their values"
    )
    hermes_kit.claim(f"{total} members from {_THREADS} threads: each added once, one saw {total}")


@pytest.mark.hermes_check("tally", "one member added by many at once: added once", new=True)
def test_one_member_added_by_many_threads_at_once_is_added_once(hermes_kit: Kit) -> None:
    stores = [_tally(hermes_kit.driver()) for _ in range(_THREADS)]
    key = "kit:one-member"
    barrier = threading.Barrier(_THREADS)
    answers: list[tuple[bool, int]] = []

    def add(n: int, store: SupportsTally) -> None:
        barrier.wait()
        answers.append(_add(store, key, "the-member", f"from {n}".encode()))

    threads = [threading.Thread(target=add, args=(n, s)) for n, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == _THREADS, "a tally_add call raised"
    said_added = sum(1 for added, _ in answers if added)
    assert said_added == 1, (
        f"one member added by {_THREADS} threads at once: {said_added} calls said added, not 1"
    )
    assert {count for _, count in answers} == {1}, f"counts answered: {sorted(answers)}"
    hermes_kit.claim(f"one member from {_THREADS} threads at once: added by exactly one")


_ADDER = """
import json, sys, threading, time
from hermes.core import connect
url, key, start, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
threads_, each, kept = int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
store = connect(url)
answers, errors = [], []
def add(t):
    while time.time() < start:
        time.sleep(0.001)
    try:
        for i in range(each):
            member = f"p{n}-{t}-{i}"
            added, count = store.tally_add(key, member, member.encode(), kept)
            answers.append([member, added, count])
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=add, args=(t,)) for t in range(threads_)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
if errors:
    sys.exit(f"tally_add raised {errors[0]}")
print(json.dumps(answers))
"""


@pytest.mark.hermes_check("tally", "members added at once by processes: each once", new=True)
def test_members_added_by_processes_at_once_are_each_counted_once_and_one_sees_them_all(
    hermes_kit: Kit,
) -> None:
    store = _tally(hermes_kit.driver())
    hermes_kit.require_cross_process()
    key = "kit:processes"
    total = _PROCESSES * _PROCESS_THREADS * _PROCESS_EACH
    start = time.time() + scaled(3.0)  # every process imported and connected by then
    args = [str(_PROCESS_THREADS), str(_PROCESS_EACH), str(_KEPT_S)]
    processes = [
        hermes_kit.python(_ADDER, hermes_kit.url, key, repr(start), str(n), *args)
        for n in range(_PROCESSES)
    ]
    answers: list[tuple[str, bool, int]] = []
    for process in processes:
        out, err = process.communicate(timeout=scaled(60.0))
        assert process.returncode == 0, f"an adder process failed: {err.strip()[-500:]}"
        answers += [(m, bool(a), int(c)) for m, a, c in json.loads(out)]
    added = sum(1 for _, was_added, _ in answers if was_added)
    most = max(count for _, _, count in answers)
    assert added == total and most == total, (
        f"{total} distinct members added by {_PROCESSES} processes at once: {added} calls said "
        f"added, and the highest count any call saw was {most} (both must be {total})"
    )
    read = store.tally_read(key)
    assert len(read) == total, f"tally_read gave {len(read)} members, not {total}"
    hermes_kit.claim(f"{total} members from {_PROCESSES} processes: each added once")


@pytest.mark.hermes_check("tally", "a set is gone after its ttl, in its namespace only", new=True)
def test_a_set_is_kept_for_its_ttl_and_gone_after_it_and_no_namespace_sees_another_s(
    hermes_kit: Kit,
) -> None:
    store = _tally(hermes_kit.driver())
    key, ttl = "kit:ttl", scaled(_TTL_S)
    elsewhere = connect(isolated_url(hermes_kit.target.url, namespace_for("tally-elsewhere")))
    try:
        other = _tally(elsewhere)
        added_at = time.monotonic()
        first = store.tally_add(key, "a", b"1", ttl)
        assert first == (True, 1), f"the first add to a new key answered {first}, not (True, 1)"
        assert other.tally_read(key) == {}, "another namespace read this namespace's set"
        other.tally_add(key, "b", b"2", _KEPT_S)
        _expires(store, key, ttl, added_at)
    finally:
        if isinstance(elsewhere, SupportsTeardown):
            call_within("teardown()", elsewhere.teardown, CLOSE_S, repr(elsewhere))
        call_within("close()", elsewhere.close, CLOSE_S, repr(elsewhere))
    hermes_kit.claim("kept for its ttl, gone after; namespaces apart")


def _expires(store: SupportsTally, key: str, ttl: float, added_at: float) -> None:
    while (elapsed := time.monotonic() - added_at) < ttl * 0.8:
        read = store.tally_read(key)
        assert read == {"a": b"1"}, (
            f"{elapsed:.2f} s after its add with a ttl of {ttl:.2f} s the set read {read!r}, "
            'not {"a": b"1"} (another namespace\'s member, or gone before its ttl)'
        )
        time.sleep(0.05)
    gone = wait_until(lambda: store.tally_read(key) == {}, _TTL_S + _PRECISION_S)
    elapsed = time.monotonic() - added_at
    assert gone, (
        f"a set with a ttl of {ttl:.2f} s still read {store.tally_read(key)!r} "
        f"{elapsed:.1f} s after its add"
    )
    assert store.tally_add(key, "a", b"again", ttl) == (True, 1), (
        "a member added again after its set expired must start a new set"
    )
