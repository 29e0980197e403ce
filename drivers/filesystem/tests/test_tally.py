"""Tallies in tallies/: a member added once across threads and processes, counts, expiry."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import TypeVar

import pytest
from hermes_test_support import concurrently, eventually

from hermes.core.driver import SupportsTally
from hermes.drivers.filesystem import FileSystemDriver, _records, _tallies

T = TypeVar("T")


@pytest.fixture
def store(tmp_path: Path) -> FileSystemDriver:
    return FileSystemDriver(tmp_path / "store", fsync=False)


def tally_dirs(store: FileSystemDriver) -> list[str]:
    directory = Path(store.path) / "tallies"
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def test_the_driver_keeps_tallies(store: FileSystemDriver) -> None:
    assert isinstance(store, SupportsTally)


def test_a_member_added_twice_is_counted_once_and_keeps_its_first_value(
    store: FileSystemDriver,
) -> None:
    assert store.tally_add("group:1", "0", b"first", 60) == (True, 1)
    assert store.tally_add("group:1", "0", b"second", 60) == (False, 1)
    assert store.tally_read("group:1") == {"0": b"first"}
    assert store.tally_add("group:1", "1", b"other", 60) == (True, 2)
    assert store.tally_add("group:1", "0", b"third", 60) == (False, 2)
    assert store.tally_read("group:1") == {"0": b"first", "1": b"other"}


def test_a_read_returns_every_member_and_value_and_nothing_for_an_unknown_key(
    store: FileSystemDriver,
) -> None:
    assert store.tally_read("group:unknown") == {}
    assert tally_dirs(store) == []  # a read of nothing writes nothing
    values = {
        "0": b"",
        "1": b"line one\nline two\n\x00\xff",
        "2": b"x" * 200_000,  # larger than one read
        "a member/with:odd..chars \u00e9": b"odd",
        "m" * 1000: b"long",  # its file name is a hash; the member is read from the file
    }
    for member, value in values.items():
        assert store.tally_add("group:1", member, value, 60)[0]
    assert store.tally_read("group:1") == values
    assert store.tally_read("group:2") == {}


def test_a_ttl_that_is_not_positive_is_refused(store: FileSystemDriver) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        store.tally_add("group:1", "0", b"v", 0)
    with pytest.raises(ValueError, match="ttl_s"):
        store.tally_add("group:1", "0", b"v", -1)
    assert store.tally_read("group:1") == {}


def test_threads_adding_distinct_members_lose_none_and_the_last_sees_them_all(
    store: FileSystemDriver,
) -> None:
    def add(index: int) -> list[tuple[bool, int]]:
        return [store.tally_add("group:threads", f"{index}.{n}", b"v", 60) for n in range(50)]

    answers = [answer for run in concurrently(8, add)[0] for answer in run]
    assert len(answers) == 400
    assert sum(added for added, _ in answers) == 400
    assert max(count for _, count in answers) == 400
    assert len(store.tally_read("group:threads")) == 400


def test_in_every_group_whose_members_end_at_once_one_add_sees_them_all(
    store: FileSystemDriver,
) -> None:
    # A workflow's group: each member added once, by a thread of its own, all at once.
    for group in range(30):
        key = f"group:at-once-{group}"

        def add(index: int, key: str = key) -> tuple[bool, int]:
            return store.tally_add(key, str(index), b"v", 60)

        answers = concurrently(8, add)[0]
        assert sorted(answers)[-1] == (True, 8), f"{key}: no add saw every member: {answers}"


def _add_members(path: str, key: str, prefix: str, times: int) -> list[tuple[bool, int]]:
    driver = FileSystemDriver(path, fsync=False)
    return [driver.tally_add(key, f"{prefix}.{n}", prefix.encode(), 60) for n in range(times)]


def test_four_processes_adding_members_lose_none_and_one_sees_them_all(
    store: FileSystemDriver,
) -> None:
    context = multiprocessing.get_context("fork")
    with context.Pool(4) as pool:
        runs = pool.starmap(
            _add_members, [(store.path, "group:processes", f"p{i}", 50) for i in range(4)]
        )
    answers = [answer for run in runs for answer in run]
    assert sum(added for added, _ in answers) == 200
    assert max(count for _, count in answers) == 200
    members = store.tally_read("group:processes")
    assert len(members) == 200
    assert members["p3.49"] == b"p3"


def test_one_member_added_by_threads_at_once_is_added_by_exactly_one(
    store: FileSystemDriver,
) -> None:
    answers = concurrently(8, lambda i: store.tally_add("group:once", "0", b"%d" % i, 60))[0]
    assert sorted(answers) == [(False, 1)] * 7 + [(True, 1)]
    assert list(store.tally_read("group:once")) == ["0"]


def test_an_expired_set_reads_as_empty_and_starts_afresh(store: FileSystemDriver) -> None:
    assert store.tally_add("group:short", "0", b"v", 1) == (True, 1)
    assert store.tally_add("group:short", "1", b"v", 1) == (True, 2)
    assert store.tally_add("group:long", "0", b"v", 600) == (True, 1)

    assert eventually(lambda: store.tally_read("group:short") == {}, "group:short to expire")

    assert store.tally_read("group:long") == {"0": b"v"}
    assert store.tally_add("group:short", "1", b"again", 60) == (True, 1)
    assert store.tally_read("group:short") == {"1": b"again"}


def test_an_add_keeps_the_set_for_its_ttl_again(store: FileSystemDriver) -> None:
    assert store.tally_add("group:1", "0", b"v", 0.05)
    assert store.tally_add("group:1", "0", b"w", 600) == (False, 1)  # renews, adds nothing
    time.sleep(0.2)  # past the first ttl
    assert store.tally_read("group:1") == {"0": b"v"}


def test_a_sweep_removes_expired_sets_and_keeps_live_ones(store: FileSystemDriver) -> None:
    assert store.tally_add("group:short", "0", b"v", 1)
    assert store.tally_add("group:long", "0", b"v", 600)
    assert eventually(lambda: store.tally_read("group:short") == {}, "group:short to expire")
    _tallies.sweep(store.path)
    assert tally_dirs(store) == ["k=group:long"]


def test_adds_sweep_out_expired_sets_nobody_adds_to_again(
    store: FileSystemDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_records, "SWEEP_INTERVAL_S", 0.0)  # a sweep is due at every add
    assert store.tally_add("group:short", "0", b"v", 1)
    adds = iter(range(1_000_000))

    def added_and_swept() -> bool:
        assert store.tally_add(f"group:{next(adds)}", "0", b"v", 60)[0]
        return "k=group:short" not in tally_dirs(store)

    assert eventually(added_and_swept, "an add to sweep group:short out")


@pytest.mark.parametrize(
    "key",
    [
        "workflow-members:root/1.2",
        "group:../../etc/passwd",
        "a:b:c",
        ".",
        "..",
        ".hidden",
        "",
        "group:" + "x" * 1000,
    ],
)
def test_keys_unsafe_as_file_names_get_a_directory_of_their_own_in_tallies(
    store: FileSystemDriver, key: str
) -> None:
    assert store.tally_add(key, "0", b"value", 60) == (True, 1)
    assert store.tally_add(key, "../1", b"other", 60) == (True, 2)
    assert store.tally_read(key) == {"0": b"value", "../1": b"other"}
    (name,) = tally_dirs(store)
    assert "/" not in name and not name.startswith(".") and len(name) <= 200
    assert (Path(store.path) / "tallies" / name).is_dir()
    assert sorted(os.listdir(store.path)) == ["tallies"]  # nothing written outside it
    assert store.tally_read(key + "x") == {}


def test_a_key_of_a_simple_id_is_readable_in_its_directory_name(store: FileSystemDriver) -> None:
    assert store.tally_add("workflow-members:4f1c.0", "3", b"v", 60)
    assert tally_dirs(store) == ["k=workflow-members:4f1c.0"]
    directory = Path(store.path) / "tallies" / "k=workflow-members:4f1c.0"
    assert sorted(p.name for p in directory.iterdir()) == [".expires", "k=3"]


def test_a_tally_survives_with_fsync(tmp_path: Path) -> None:
    store = FileSystemDriver(tmp_path / "store", fsync=True)
    assert store.tally_add("group:1", "0", b"v", 60) == (True, 1)
    assert store.tally_add("group:1", "1", b"w", 60) == (True, 2)
    assert store.tally_read("group:1") == {"0": b"v", "1": b"w"}


def test_teardown_deletes_the_tallies(store: FileSystemDriver) -> None:
    assert store.tally_add("group:1", "0", b"v", 60)
    store.teardown()
    assert not os.path.exists(store.path)
    assert store.tally_read("group:1") == {}
    assert store.tally_add("group:1", "0", b"v", 60) == (True, 1)  # made again on first use
