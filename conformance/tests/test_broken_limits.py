"""The kit's limits row has teeth: green on the memory driver and on a sound store shared
by processes, red on each broken store, for the reason named here."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from hermes import conformance

RATE = "test_takes_racing_under_a_rate_get_one_start_and_turns_one_interval_apart"
BURST = "test_takes_racing_under_a_rate_with_a_burst_get_that_many_starts_at_once"
RESERVE = "test_takes_refused_under_a_rate_each_reserve_their_turns_one_interval_apart"
SLOTS = "test_of_sixteen_threads_taking_three_slots_at_once_three_run_and_a_release_lets_one_in"
PROCESSES = "test_of_four_processes_taking_three_slots_at_once_three_run_in_all"
LEASE = "test_a_slot_not_renewed_is_held_until_its_lease_ends_and_free_after_it"
RENEW = "test_a_renewed_slot_stays_held_and_renewing_a_slot_not_held_says_so"
CHARGED = "test_a_take_already_charged_runs_at_once_and_a_take_waiting_for_a_slot_is_not_charged"
SCAN = "test_a_scan_lists_the_keys_in_use_with_their_states_and_forgets_those_that_say_nothing"

#: URL -> (the tests of the row that must fail, and only they; text the output shows).
BROKEN = {
    "limits-not-atomic://q": ([RATE, BURST, RESERVE, SLOTS], "ran, not 3"),
    "limits-lease-forever://q": ([LEASE], "never renewed, was still held"),
    "limits-renew-does-nothing://q": ([RENEW], "limit_renew did not extend its lease"),
    "limits-charges-twice://q": ([CHARGED], "a job already charged for the rate"),
    "limits-no-reservation://q": (
        [RATE, BURST, RESERVE, CHARGED],
        "each turn given must be a turn of its own",
    ),
    "limits-more-not-reserved://q": ([RESERVE], "each turn given must be a turn of its own"),
    "limits-charges-slot-waiters://q": ([CHARGED], "must not use up a turn of the rate"),
    "limits-expire-by-rate://q": (
        [SLOTS, LEASE, RENEW, SCAN],
        "before its lease ran out",
    ),
    "limits-scan-never-forgets://q": ([SCAN], "a key is forgotten once its state says nothing"),
    "limits-shared-namespace://q": ([SCAN], "keys this namespace never used"),
    "limits-in-process://q": ([PROCESSES], "ran in all, not 3"),
}

#: The sound stores, and the tests each cannot run.
SOUND = {
    "memory://limits": {PROCESSES: "not verified: driver is in-process"},
    "limits-in-sqlite://control": {},
}

_MODULE = "hermes.conformance.test_fleet_limits"


def _row() -> set[str]:
    """Every test function of the kit's limits module."""
    path = Path(conformance.__file__).parent / "test_fleet_limits.py"
    return {
        node.name
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


@pytest.fixture(scope="module")
def row(make_row: Any) -> Any:
    return make_row(_MODULE, "broken_limits", _row(), SOUND, BROKEN)


@pytest.fixture(scope="module")
def verdicts(row: Any, kit_runner: Any) -> Iterator[dict[str, Future[Any]]]:
    with row.runs(kit_runner) as runs:
        yield runs


@pytest.mark.parametrize("url", list(SOUND))
def test_the_limits_row_passes_on_a_sound_store(
    row: Any, verdicts: dict[str, Future[Any]], url: str
) -> None:
    row.assert_passes(verdicts[url].result(), url)


@pytest.mark.parametrize("url", list(BROKEN))
def test_the_limits_row_fails_a_broken_store(
    row: Any, verdicts: dict[str, Future[Any]], url: str, broken_module: Any
) -> None:
    bug = broken_module("broken_limits").describe(url.split(":")[0])
    row.assert_fails(verdicts[url].result(), url, bug)


def test_every_test_of_the_limits_row_fails_on_some_broken_store() -> None:
    caught = {test for must_fail, _ in BROKEN.values() for test in must_fail}

    assert _row() - caught == set(), "no broken store makes these fail"
    assert caught - _row() == set(), "the table names tests the row does not have"


def test_the_sound_store_without_limits_says_the_row_is_not_verified(kit_runner: Any) -> None:
    run = kit_runner.run(
        "--pyargs",
        _MODULE,
        "--hermes-url",
        f"sqlite://{kit_runner.base / 'no-limits.db'}",
        "--hermes-plugin",
        "sqlite_driver",
    )

    assert run.returncode == 0, run.describe()
    assert set(run.with_outcome("skipped")) == _row(), run.describe()
    assert set(run.reasons.values()) == {
        "not verified: the driver has no limit_take()/limit_release(); "
        "it cannot keep fleet-wide limits (--limits-url)"
    }
    assert "9 checks: 0 verified, 9 not verified" in run.output, run.describe()
