"""Fleet-wide limits (``SupportsLimits``): what ``--limits-url`` relies on.

For a driver that has ``limit_take``, ``limit_release``, ``limit_renew`` and
``limit_scan``: takes racing on one key -- threads sharing a driver, threads
with a driver each, processes -- are decided one at a time, as
``limit_state.take`` decides them. Under a rate one start goes at once (as
many as the burst with a burst) and every refused start is given a turn of
its own (a block of them when the rule reserves several), one interval
after the one before; under a concurrency exactly that many run, a release
lets exactly one more in and a refused take is told to come back later. A
slot not renewed is free once its lease ran out (within a second of expiry
precision), not before; one renewed is kept. A take already charged for the
rate runs at once without moving the rate, and one that waits for a slot is
not charged. A scan lists the keys in use with states ``limit_state`` reads,
forgets a key once it says nothing any more, and never lists another
namespace's. A driver without them is reported as not verified: it cannot
keep limits for a fleet.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from hermes.conformance._harness import CLOSE_S, Kit, call_within, namespace_for, scaled, wait_until
from hermes.core import connect
from hermes.core.driver import Driver, LimitRule, SupportsLimits, SupportsTeardown, Take
from hermes.core.drivertools import isolated_url, limit_state

#: The rate of the rate checks, one start per this (scaled), and how far a turn
#: may be from where it belongs beyond what the calls' own durations explain.
_INTERVAL_S = 0.5
_TURN_TOLERANCE_S = 0.1
#: Threads taking at once under a rate, and under a concurrency.
_RATE_THREADS = 8
_THREADS = 16
#: The burst of the burst check, and the turns a refused take reserves in the reserve check.
_BURST = 3
_RESERVE = 3
#: Slots of the concurrency checks, and the lease they are taken with: longer than any check.
_SLOTS = 3
_HELD_S = 60.0
#: Processes taking at once, and the threads taking in each.
_PROCESSES = 4
_PROCESS_THREADS = 4
#: The lease of the expiry checks, and how much expiry may lag behind it (both scaled).
_LEASE_S = 1.0
_PRECISION_S = 1.0
#: How often the renewed slot is renewed, and how long it is watched (both scaled).
_RENEW_EVERY_S = 0.3
_RENEWED_FOR_S = 2.2
#: The interval of a rate whose one start makes a key say something for a short while (scaled).
_SHORT_S = 2.0
#: The interval of a rate whose next turn is far away, and how far a wait may be off it.
_FAR_S = 60.0
_FAR_TOLERANCE_S = _FAR_S / 4


def _limits(driver: Driver) -> SupportsLimits:
    if not isinstance(driver, SupportsLimits):
        pytest.skip(
            "not verified: the driver has no limit_take()/limit_release(); "
            "it cannot keep fleet-wide limits (--limits-url)"
        )
    return driver


def _stores(kit: Kit, count: int) -> list[SupportsLimits]:
    """``count`` stores for as many threads: half share one driver object, half have one each."""
    shared = _limits(kit.driver())
    return [shared] * (count // 2) + [_limits(kit.driver()) for _ in range(count - count // 2)]


def _checked(answer: object, what: str) -> Take:
    """``answer`` as a :class:`Take`, after checking it is one a caller can use."""
    assert isinstance(answer, Take), f"{what} returned {answer!r}, not a Take"
    assert isinstance(answer.wait_s, int | float) and math.isfinite(answer.wait_s), (
        f"{what} returned wait_s={answer.wait_s!r}, not a finite number of seconds"
    )
    assert answer.wait_s >= 0, f"{what} returned wait_s={answer.wait_s!r}, below 0"
    assert isinstance(answer.charged, bool), f"{what} returned charged={answer.charged!r}"
    more = answer.more
    assert isinstance(more, tuple) and all(
        isinstance(wait_s, int | float) and math.isfinite(wait_s) and wait_s > 0 for wait_s in more
    ), f"{what} returned more={more!r}, not a tuple of seconds until each further turn"
    return answer


def _take(
    store: SupportsLimits,
    key: str,
    rule: LimitRule,
    slot: str,
    charged: bool = False,
    lease_s: float = _HELD_S,
) -> Take:
    answer = store.limit_take(key, rule, slot, charged, lease_s)
    return _checked(answer, f"limit_take({key!r}, {rule}, {slot!r}, charged={charged})")


def _show(answer: Take) -> str:
    more = f", more {[round(wait_s, 2) for wait_s in answer.more]}" if answer.more else ""
    return f"(wait {answer.wait_s:.2f} s, charged={answer.charged}{more})"


def _runs_charged(answer: Take) -> bool:
    """The job runs now, the rate charged for it."""
    return answer.wait_s == 0 and answer.charged


@dataclass(frozen=True)
class _Answer:
    """One take of a race, and when (``time.monotonic()``) its call started and returned."""

    slot: str
    take: Take
    started: float
    ended: float

    @property
    def runs(self) -> bool:
        return self.take.wait_s == 0

    @property
    def turns(self) -> list[tuple[float, float]]:
        """The earliest and latest time, as the kit reads time, of each start it was given:
        its own, then those it reserved ahead."""
        waits = (self.take.wait_s, *self.take.more)
        return [(self.started + wait_s, self.ended + wait_s) for wait_s in waits]


def _race(stores: Sequence[SupportsLimits], key: str, rule: LimitRule) -> list[_Answer]:
    """One take of ``key`` from each of ``stores``, on threads started together, each for a
    slot of its own."""
    barrier = threading.Barrier(len(stores))
    answers: list[_Answer] = []
    errors: list[BaseException] = []

    def take(store: SupportsLimits) -> None:
        slot = uuid.uuid4().hex
        try:
            barrier.wait()
            started = time.monotonic()
            answer = _take(store, key, rule, slot)
            answers.append(_Answer(slot, answer, started, time.monotonic()))
        except BaseException as exc:  # reported below, with the key it happened on
            errors.append(exc)

    threads = [threading.Thread(target=take, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, f"limit_take({key!r}) raised {errors[0]!r}"
    return answers


def _waits(answers: Sequence[_Answer]) -> list[float]:
    """Every wait the answers give, for messages: their own and those of turns reserved ahead."""
    return sorted(round(wait_s, 2) for a in answers for wait_s in (a.take.wait_s, *a.take.more))


def _check_rate(answers: list[_Answer], rule: LimitRule, what: str) -> None:
    """``burst`` of ``answers`` ran; each other was given ``reserve`` turns, and every turn
    given is one interval after the one before, the first one interval after the first start."""
    assert rule.interval_s is not None, "a rate check needs a rule with a rate"
    interval, tolerance = rule.interval_s, scaled(_TURN_TOLERANCE_S)
    running = [answer for answer in answers if answer.runs]
    refused = [answer for answer in answers if not answer.runs]
    waits = _waits(answers)
    spread = max(a.started for a in answers) - min(a.started for a in answers)
    assert len(running) == rule.burst, (
        f"{what}: {len(running)} ran, not {rule.burst} (sorted waits {waits}; the calls "
        f"started within {spread:.3f} s of each other)"
    )
    uncharged = [answer.take for answer in answers if not answer.take.charged]
    assert not uncharged, (
        f"{what}: {len(uncharged)} were answered charged=False ({_show(uncharged[0])}): a "
        "start under a rate is charged when it runs, and a refused one for the turn it is given"
    )
    for answer in refused:
        assert len(answer.take.more) == rule.reserve - 1, (
            f"{what}: a refused take answered {_show(answer.take)}: {len(answer.take.more)} "
            f"further turns, not {rule.reserve - 1} (the rule reserves {rule.reserve})"
        )
    turns = sorted((turn for answer in refused for turn in answer.turns), key=sum)
    before = min(a.started for a in running), max(a.ended for a in running)
    for n, (low, high) in enumerate(turns, 1):
        if high < before[0] + interval - tolerance or low > before[1] + interval + tolerance:
            gap = (low + high - sum(before)) / 2
            raise AssertionError(
                f"{what}: sorted waits {waits}: turn {n} of the {len(turns)} given to the "
                f"refused takes is {gap:.2f} s after the "
                f"{'first start' if n == 1 else 'turn before'}, not one interval "
                f"({interval:g} s): each turn given must be a turn of its own, the next free"
            )
        before = low, high


@pytest.mark.hermes_check(
    "limits", "rate: one start at once, the others given turns one interval apart", new=True
)
def test_takes_racing_under_a_rate_get_one_start_and_turns_one_interval_apart(
    hermes_kit: Kit,
) -> None:
    stores = _stores(hermes_kit, _RATE_THREADS)
    rule = LimitRule(interval_s=scaled(_INTERVAL_S))
    answers = _race(stores, "kit:rate", rule)
    _check_rate(
        answers, rule, f"{_RATE_THREADS} takes at once under one start per {rule.interval_s:g} s"
    )
    hermes_kit.claim(
        f"{_RATE_THREADS} takes at once: one ran, {_RATE_THREADS - 1} given turns "
        f"{rule.interval_s:g} s apart"
    )


@pytest.mark.hermes_check("limits", f"rate: a burst of {_BURST} starts at once", new=True)
def test_takes_racing_under_a_rate_with_a_burst_get_that_many_starts_at_once(
    hermes_kit: Kit,
) -> None:
    stores = _stores(hermes_kit, _RATE_THREADS)
    rule = LimitRule(interval_s=scaled(_INTERVAL_S), burst=_BURST)
    answers = _race(stores, "kit:burst", rule)
    _check_rate(
        answers,
        rule,
        f"{_RATE_THREADS} takes at once under one start per {rule.interval_s:g} s, burst {_BURST}",
    )
    hermes_kit.claim(f"{_BURST} of {_RATE_THREADS} ran at once, the others given turns after")


@pytest.mark.hermes_check(
    "limits", f"rate: a refused take reserves {_RESERVE} turns, one interval apart", new=True
)
def test_takes_refused_under_a_rate_each_reserve_their_turns_one_interval_apart(
    hermes_kit: Kit,
) -> None:
    stores = _stores(hermes_kit, _RATE_THREADS)
    rule = LimitRule(interval_s=scaled(_INTERVAL_S), reserve=_RESERVE)
    answers = _race(stores, "kit:reserve", rule)
    _check_rate(
        answers,
        rule,
        f"{_RATE_THREADS} takes at once under one start per {rule.interval_s:g} s, "
        f"reserving {_RESERVE} turns each",
    )
    turns = (_RATE_THREADS - 1) * _RESERVE
    hermes_kit.claim(
        f"one of {_RATE_THREADS} ran, the others given {turns} turns {rule.interval_s:g} s apart"
    )


@pytest.mark.hermes_check("limits", "concurrency: exactly its slots among threads", new=True)
def test_of_sixteen_threads_taking_three_slots_at_once_three_run_and_a_release_lets_one_in(
    hermes_kit: Kit,
) -> None:
    stores = _stores(hermes_kit, _THREADS)
    key, rule = "kit:slots", LimitRule(concurrency=_SLOTS)
    answers = _race(stores, key, rule)
    running = [answer for answer in answers if answer.runs]
    assert len(running) == _SLOTS, (
        f"{_THREADS} threads taking one of {_SLOTS} slots at once: {len(running)} ran, "
        f"not {_SLOTS} (sorted waits {_waits(answers)})"
    )
    stores[0].limit_release(key, "kit-never-taken")
    others = stores[: _THREADS // 2]
    again = [answer for answer in _race(others, key, rule) if answer.runs]
    assert not again, (
        f"with every slot held (and a slot never taken released), {len(again)} of "
        f"{len(others)} takes at once ran"
    )
    stores[-1].limit_release(key, running[0].slot)
    answers = _race(others, key, rule)
    again = [answer for answer in answers if answer.runs]
    assert len(again) == 1, (
        f"after limit_release of one of {_SLOTS} slots held, {len(others)} takes at once: "
        f"{len(again)} ran, not 1 (sorted waits {_waits(answers)})"
    )
    hermes_kit.claim(
        f"{_SLOTS} of {_THREADS} threads ran; a release let exactly one of {len(others)} more in"
    )


_TAKER = """
import json, sys, threading, time, uuid
from hermes.core import connect
from hermes.core.driver import LimitRule
url, key, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
takers, slots, lease = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
store = connect(url)
rule = LimitRule(concurrency=slots)
answers, errors = [], []
def take():
    slot = uuid.uuid4().hex
    while time.time() < start:
        time.sleep(0.001)
    try:
        answers.append([slot, store.limit_take(key, rule, slot, False, lease).wait_s])
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=take) for _ in range(takers)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
if errors:
    sys.exit(f"limit_take raised {errors[0]}")
print(json.dumps(answers))
"""


@pytest.mark.hermes_check("limits", "concurrency: exactly its slots among processes", new=True)
def test_of_four_processes_taking_three_slots_at_once_three_run_in_all(hermes_kit: Kit) -> None:
    store = _limits(hermes_kit.driver())
    hermes_kit.require_cross_process()
    key, rule = "kit:process-slots", LimitRule(concurrency=_SLOTS)
    start = time.time() + scaled(3.0)  # every process imported and connected by then
    args = (key, repr(start), str(_PROCESS_THREADS), str(_SLOTS), str(_HELD_S))
    processes = [hermes_kit.python(_TAKER, hermes_kit.url, *args) for _ in range(_PROCESSES)]
    answers: list[tuple[str, float]] = []
    for process in processes:
        out, err = process.communicate(timeout=scaled(30.0))
        assert process.returncode == 0, f"a taker process failed: {err.strip()[-500:]}"
        answers += [(slot, float(wait_s)) for slot, wait_s in json.loads(out)]
    running = [slot for slot, wait_s in answers if wait_s == 0]
    waits = sorted(round(wait_s, 2) for _, wait_s in answers)
    assert len(running) == _SLOTS, (
        f"{_PROCESSES} processes of {_PROCESS_THREADS} threads each taking one of {_SLOTS} "
        f"slots at once: {len(running)} ran in all, not {_SLOTS} (sorted waits {waits})"
    )
    assert all(wait_s > 0 for _, wait_s in answers if wait_s != 0), f"sorted waits {waits}"
    refused = _take(store, key, rule, "kit-parent")
    assert refused.wait_s > 0, "with every slot held by the processes, another process's take ran"
    store.limit_release(key, running[0])
    freed = _take(store, key, rule, "kit-parent-again")
    assert freed.wait_s == 0, (
        "limit_release of a slot another process took did not free it: the next take "
        f"was told to wait {freed.wait_s:.2f} s"
    )
    hermes_kit.claim(
        f"{_SLOTS} of {_PROCESSES * _PROCESS_THREADS} takes in {_PROCESSES} processes ran; "
        "a slot freed from another process"
    )


@pytest.mark.hermes_check("limits", "a slot not renewed is free after its lease", new=True)
def test_a_slot_not_renewed_is_held_until_its_lease_ends_and_free_after_it(
    hermes_kit: Kit,
) -> None:
    store = _limits(hermes_kit.driver())
    other = _limits(hermes_kit.driver())
    key, rule = "kit:lease", LimitRule(concurrency=1)
    lease = scaled(_LEASE_S)
    taken_at = time.monotonic()
    assert _take(store, key, rule, "kit-held", lease_s=lease).wait_s == 0, (
        "the first take of a new key with one slot did not run"
    )
    tries = itertools.count()

    def runs() -> bool:
        return _take(other, key, rule, f"kit-next-{next(tries)}").wait_s == 0

    # Not free before its lease: ask until shortly before it ends.
    while (elapsed := time.monotonic() - taken_at) < lease * 0.8:
        assert not runs(), (
            f"the slot of a take with a {lease:.2f} s lease was free {elapsed:.2f} s later, "
            "before its lease ran out"
        )
        time.sleep(0.05)
    free = wait_until(runs, _LEASE_S + _PRECISION_S)
    elapsed = time.monotonic() - taken_at
    assert free, (
        f"the slot of a take with a {lease:.2f} s lease, never renewed, was still held "
        f"{elapsed:.1f} s later: a dead worker's slot is free once its lease ran out"
    )
    kept = store.limit_renew(key, "kit-held", lease)
    assert not kept, f"limit_renew of a slot whose lease ran out returned {kept!r}, not False"
    hermes_kit.claim(f"held for its {lease:g} s lease, then free within {scaled(_PRECISION_S):g} s")


@pytest.mark.hermes_check(
    "limits", "a renewed slot is kept; renewing one not held is False", new=True
)
def test_a_renewed_slot_stays_held_and_renewing_a_slot_not_held_says_so(hermes_kit: Kit) -> None:
    store = _limits(hermes_kit.driver())
    other = _limits(hermes_kit.driver())
    key, rule = "kit:renewed", LimitRule(concurrency=1)
    lease, every = scaled(_LEASE_S), scaled(_RENEW_EVERY_S)
    assert _take(store, key, rule, "kit-held", lease_s=lease).wait_s == 0, (
        "the first take of a new key with one slot did not run"
    )
    taken_at = renewed_at = time.monotonic()
    n = 0
    while time.monotonic() - taken_at < scaled(_RENEWED_FOR_S):
        time.sleep(every)
        since = time.monotonic() - renewed_at
        kept = store.limit_renew(key, "kit-held", lease)
        renewed_at = time.monotonic()
        assert kept, (
            f"limit_renew of a slot taken with a {lease:.2f} s lease and renewed every "
            f"{every:.2f} s returned {kept!r} {renewed_at - taken_at:.1f} s after it was "
            f"taken, {since:.2f} s after the renewal before: limit_renew did not extend "
            "its lease"
        )
        n += 1
        refused = _take(other, key, rule, f"kit-other-{n}")
        assert refused.wait_s > 0, (
            f"a slot taken with a {lease:.2f} s lease and renewed every {every:.2f} s was "
            f"free {time.monotonic() - taken_at:.1f} s after it was taken: limit_renew did "
            "not extend its lease"
        )
    store.limit_release(key, "kit-held")
    kept = store.limit_renew(key, "kit-held", lease)
    assert not kept, f"limit_renew of a released slot returned {kept!r}, not False"
    kept = store.limit_renew(key, "kit-never-taken", lease)
    assert not kept, f"limit_renew of a slot never taken returned {kept!r}, not False"
    kept = store.limit_renew("kit:never-used", "kit-held", lease)
    assert not kept, f"limit_renew on a key never used returned {kept!r}, not False"
    assert _take(other, key, rule, "kit-after").wait_s == 0, (
        "after its only slot was released, a take of the key did not run"
    )
    hermes_kit.claim(
        f"held {scaled(_RENEWED_FOR_S):g} s on a {lease:g} s lease renewed every {every:g} s; "
        "False for a slot released, never taken, on a key never used"
    )


def _near(wait_s: float, expected_s: float) -> bool:
    return abs(wait_s - expected_s) <= _FAR_TOLERANCE_S


@pytest.mark.hermes_check(
    "limits",
    "charged: runs at once without moving the rate; a slot's wait is not charged",
    new=True,
)
def test_a_take_already_charged_runs_at_once_and_a_take_waiting_for_a_slot_is_not_charged(
    hermes_kit: Kit,
) -> None:
    store = _limits(hermes_kit.driver())
    key, rule = "kit:charged", LimitRule(interval_s=_FAR_S, concurrency=_SLOTS)
    first = _take(store, key, rule, "kit-first")
    assert _runs_charged(first), f"the first take of a new key answered {_show(first)}"
    reserved = _take(store, key, rule, "kit-reserved")
    assert reserved.charged and _near(reserved.wait_s, _FAR_S), (
        f"a take one start after the first under one start per {_FAR_S:g} s answered "
        f"{_show(reserved)}, not a turn about {_FAR_S:g} s away, charged"
    )
    again = _take(store, key, rule, "kit-charged", charged=True)
    assert _runs_charged(again), (
        f"a take with charged=True and a slot free answered {_show(again)}, not (wait 0, "
        "charged): a job already charged for the rate (at its reserved turn) runs at once"
    )
    after = _take(store, key, rule, "kit-after")
    assert after.charged and _near(after.wait_s, 2 * _FAR_S), (
        f"after a start, one turn reserved and a start already charged, the next take was "
        f"told to wait {after.wait_s:.1f} s, not about {2 * _FAR_S:g} s (two intervals: the "
        "start already charged must not move the rate on, nor the reserved turn be lost)"
    )

    key, rule = "kit:charged-slot", LimitRule(interval_s=_FAR_S, concurrency=1)
    assert _runs_charged(_take(store, key, rule, "kit-held")), "the first take did not run"
    waiting = _take(store, key, rule, "kit-waiting")
    assert waiting.wait_s > 0 and not waiting.charged, (
        f"a take finding its only slot held answered {_show(waiting)}, not a wait, uncharged: a "
        "job waiting for a slot must not use up a turn of the rate"
    )
    kept = _take(store, key, rule, "kit-waiting-charged", charged=True)
    assert kept.wait_s > 0 and kept.charged, (
        f"a take with charged=True finding its only slot held answered {_show(kept)}, not a wait, "
        "still charged"
    )
    store.limit_release(key, "kit-held")
    turn = _take(store, key, rule, "kit-next")
    assert turn.charged and _near(turn.wait_s, _FAR_S), (
        f"after the slot was freed, the next take under one start per {_FAR_S:g} s was told "
        f"to wait {turn.wait_s:.1f} s, not about {_FAR_S:g} s: the takes that waited for "
        "the slot were charged for the rate"
    )
    hermes_kit.claim("a charged take ran at once, the rate unmoved; a slot's wait uncharged")


#: What a state holds that ``limit_state.usage`` reads.
_FIELDS = frozenset({"tat", "ctat", "avg", "slots", "rule"})


def _scan(store: SupportsLimits, limit: int = 100) -> dict[str, limit_state.State]:
    """``limit_scan`` as key -> decoded state, after checking what it returned."""
    scanned = store.limit_scan(limit)
    assert isinstance(scanned, list), f"limit_scan returned {type(scanned).__name__}, not a list"
    states: dict[str, limit_state.State] = {}
    for entry in scanned:
        assert isinstance(entry, tuple) and len(entry) == 2, f"limit_scan listed {entry!r}"
        key, raw = entry
        assert isinstance(key, str) and isinstance(raw, bytes), (
            f"limit_scan listed ({key!r}, {raw!r}), not (str, bytes)"
        )
        assert key not in states, f"limit_scan listed {key!r} twice"
        try:
            state = limit_state.decode(raw)
        except ValueError as exc:
            raise AssertionError(
                f"limit_scan listed {key!r} with a state limit_state cannot read: "
                f"{raw[:200]!r} ({exc})"
            ) from None
        assert isinstance(state, dict) and _FIELDS <= state.keys(), (
            f"limit_scan listed {key!r} with {raw[:200]!r}, not a state of {sorted(_FIELDS)}"
        )
        states[key] = state
    return states


def _running(states: dict[str, limit_state.State]) -> dict[str, int]:
    now = time.time()
    return {key: limit_state.usage(key, state, now).running for key, state in states.items()}


@pytest.mark.hermes_check("limits", "a scan lists the keys in use, of its namespace", new=True)
def test_a_scan_lists_the_keys_in_use_with_their_states_and_forgets_those_that_say_nothing(
    hermes_kit: Kit,
) -> None:
    store = _limits(hermes_kit.driver())
    reader = _limits(hermes_kit.driver())
    pair, one = LimitRule(concurrency=2), LimitRule(concurrency=_SLOTS)
    far, short = LimitRule(interval_s=_FAR_S), LimitRule(interval_s=scaled(_SHORT_S))
    for slot in ("kit-a", "kit-b"):
        assert _take(store, "kit:scan-pair", pair, slot).wait_s == 0, "a take of a free slot waited"
    assert _take(store, "kit:scan-one", one, "kit-a").wait_s == 0, "a take of a free slot waited"
    assert _take(store, "kit:scan-rate", far, "kit-a").wait_s == 0, "a first start waited"
    short_at = time.monotonic()
    assert _take(store, "kit:scan-short", short, "kit-a").wait_s == 0, "a first start waited"
    expected = {"kit:scan-pair": 2, "kit:scan-one": 1, "kit:scan-rate": 0, "kit:scan-short": 0}
    listed = _running(_scan(reader))
    strangers = sorted(listed.keys() - expected.keys())
    assert not strangers, (
        f"limit_scan(100) lists keys this namespace never used: {strangers}; keys must live "
        "in the driver's namespace"
    )
    assert listed == expected, (
        f"limit_scan(100) from another driver object, as running slots per key: {listed}, "
        f"not {expected}"
    )
    assert len(reader.limit_scan(2)) == 2, "limit_scan(2) of 4 keys did not list 2"

    # Another namespace on the same broker: keys of the same name are other keys.
    elsewhere = connect(isolated_url(hermes_kit.target.url, namespace_for("limits-elsewhere")))
    try:
        other = _limits(elsewhere)
        taken = _take(other, "kit:scan-pair", pair, "kit-c")
        assert taken.wait_s == 0, (
            f"a take in another namespace of a key whose 2 slots are held here was told to "
            f"wait {taken.wait_s:.2f} s: keys must live in the driver's namespace"
        )
        assert _take(other, "kit:elsewhere", one, "kit-a").wait_s == 0, "a first take waited"
        there = _running(_scan(other))
        assert there == {"kit:scan-pair": 1, "kit:elsewhere": 1}, (
            f"limit_scan in another namespace lists {there}, not only its own two keys"
        )
        listed = _running(_scan(reader))
        assert listed == expected, (
            f"after takes in another namespace, limit_scan here lists {listed}, not {expected}"
        )
    finally:
        if isinstance(elsewhere, SupportsTeardown):
            call_within("teardown()", elsewhere.teardown, CLOSE_S, repr(elsewhere))
        call_within("close()", elsewhere.close, CLOSE_S, repr(elsewhere))

    # A key that says nothing any more is forgotten; the others are not.
    store.limit_release("kit:scan-one", "kit-a")
    gone = wait_until(
        lambda: not {"kit:scan-one", "kit:scan-short"} & set(_scan(reader)),
        _SHORT_S + 2 * _PRECISION_S,
    )
    elapsed = time.monotonic() - short_at
    listed = _running(_scan(reader))
    assert gone, (
        f"limit_scan still lists {sorted(listed)} {elapsed:.1f} s after a key's only slot was "
        f"released and another's one start per {short.interval_s:g} s was made: a key is "
        "forgotten once its state says nothing any more"
    )
    kept = {"kit:scan-pair": 2, "kit:scan-rate": 0}
    assert listed == kept, (
        f"limit_scan lists {listed}, not {kept}: a key with slots held or a turn to come "
        "was forgotten"
    )
    hermes_kit.claim(
        "keys in use listed with states limit_state reads, forgotten once they say nothing, "
        "another namespace's not"
    )
