"""Claims in claims/: one winner among processes, expiry by mtime, an expired file replaced once."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from hermes.drivers.filesystem import _claim


def _claim_at(queue: str, key: str, ttl_s: float, start: float, results: object) -> None:
    while time.time() < start:
        time.sleep(0.0005)
    results.put(_claim.claim(queue, key, ttl_s))  # type: ignore[attr-defined]


def race(queue: Path, key: str, ttl_s: float, processes: int = 6) -> int:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    start = time.time() + 0.3
    workers = [
        context.Process(target=_claim_at, args=(str(queue), key, ttl_s, start, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(10)
    return sum(results.get(timeout=5) for _ in workers)


def test_one_of_six_processes_wins_a_new_key_and_one_wins_it_again_once_expired(
    tmp_path: Path,
) -> None:
    # The ttl outlasts the race itself (six processes starting on a busy machine), so a
    # second winner in one race would be a broken claim, not an expiry during the race.
    for _ in range(4):
        assert race(tmp_path, "tick:ping@2025-01-01T00:00:00Z", 1.5) == 1
        time.sleep(1.6)  # expired: the next race replaces an expired claim
    assert os.listdir(tmp_path / "claims" / ".tomb") == []
    assert os.listdir(tmp_path / "claims" / ".tmp") == []


def test_a_claim_is_held_until_its_mtime_and_free_after(tmp_path: Path) -> None:
    assert _claim.claim(str(tmp_path), "unique:sync:u7", 0.3)
    assert not _claim.claim(str(tmp_path), "unique:sync:u7", 0.3)
    [name] = [n for n in os.listdir(tmp_path / "claims") if not n.startswith(".")]
    expiry = os.stat(tmp_path / "claims" / name).st_mtime
    assert time.time() < expiry <= time.time() + 0.3
    time.sleep(0.35)
    assert _claim.claim(str(tmp_path), "unique:sync:u7", 0.3)


def test_a_tomb_left_by_a_claimer_that_died_is_cleared_after_a_while(tmp_path: Path) -> None:
    assert _claim.claim(str(tmp_path), "k", 0.01)
    time.sleep(0.02)
    path = tmp_path / "claims" / "k=k"
    found = os.stat(path)
    tomb = tmp_path / "claims" / ".tomb" / f"k=k.{found.st_ino}.{found.st_mtime_ns}"
    os.link(path, tomb)  # as if its remover was killed right after linking
    assert not _claim.claim(str(tmp_path), "k", 1)  # someone is replacing it
    # A tomb's age is its ctime, which cannot be set back: make every tomb count as stale.
    stale = _claim.STALE_TOMB_S
    _claim.STALE_TOMB_S = 0.0
    try:
        assert _claim.claim(str(tmp_path), "k", 1)
    finally:
        _claim.STALE_TOMB_S = stale


def test_keys_with_slashes_and_long_keys_are_safe_file_names(tmp_path: Path) -> None:
    assert _claim.claim(str(tmp_path), "unique:a/../b", 10)
    assert _claim.claim(str(tmp_path), "x" * 1000, 10)
    assert not _claim.claim(str(tmp_path), "x" * 1000, 10)
    names = [n for n in os.listdir(tmp_path / "claims") if not n.startswith(".")]
    assert len(names) == 2 and all("/" not in n and len(n) <= 200 for n in names)
