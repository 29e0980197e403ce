"""The kit's tally row has teeth: green on the memory driver and on a sound store shared
by processes, red on each broken tally, for the reason named here."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

TWICE = "test_a_member_added_twice_counts_once_and_keeps_its_first_value"
THREADS = "test_members_added_by_threads_at_once_are_each_counted_once_and_one_sees_them_all"
ONE = "test_one_member_added_by_many_threads_at_once_is_added_once"
PROCESSES = "test_members_added_by_processes_at_once_are_each_counted_once_and_one_sees_them_all"
TTL = "test_a_set_is_kept_for_its_ttl_and_gone_after_it_and_no_namespace_sees_another_s"
ROW = {TWICE, THREADS, ONE, PROCESSES, TTL}

#: URL -> (the tests of the row that must fail, and only they; text the output shows).
BROKEN = {
    "tally-not-atomic://q": ([THREADS, ONE], "at once:"),
    "tally-last-value-wins://q": ([TWICE], "a member's first value stays"),
    "tally-always-added://q": ([TWICE, ONE], "not (False, 1)"),
    "tally-never-expires://q": ([TTL], "still read"),
    "tally-shared-namespace://q": ([TTL], "another namespace"),
    "tally-in-process://q": ([PROCESSES], "processes at once"),
}

#: The sound stores, and the tests each cannot run.
SOUND = {
    "memory://tally": {PROCESSES: "not verified: driver is in-process"},
    "tally-in-sqlite://control": {},
}


@pytest.fixture(scope="module")
def row(make_row: Any) -> Any:
    return make_row("hermes.conformance.test_tally", "broken_tally", ROW, SOUND, BROKEN)


@pytest.fixture(scope="module")
def verdicts(row: Any, kit_runner: Any) -> Iterator[dict[str, Future[Any]]]:
    with row.runs(kit_runner) as runs:
        yield runs


@pytest.mark.parametrize("url", list(SOUND))
def test_the_tally_row_passes_on_a_sound_store(
    row: Any, verdicts: dict[str, Future[Any]], url: str
) -> None:
    row.assert_passes(verdicts[url].result(), url)


@pytest.mark.parametrize("url", list(BROKEN))
def test_the_tally_row_fails_a_broken_store(
    row: Any, verdicts: dict[str, Future[Any]], url: str, broken_module: Any
) -> None:
    bug = broken_module("broken_tally").describe(url.split(":")[0])
    row.assert_fails(verdicts[url].result(), url, bug)


def test_every_test_of_the_tally_row_fails_on_some_broken_store() -> None:
    caught = {test for must_fail, _ in BROKEN.values() for test in must_fail}

    assert caught == ROW, f"no broken store makes {sorted(ROW - caught)} fail"
