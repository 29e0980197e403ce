"""The kit's claim row has teeth: green on the memory driver, red on each broken claim."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
THREADS = "test_one_of_sixteen_threads_claiming_one_key_at_once_wins"
TTL = "test_a_claim_is_not_won_again_before_its_ttl_and_is_after_it"


def run_claim_row(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "--pyargs",
            "hermes.conformance.test_claim",
            "--hermes-url",
            url,
            "--hermes-plugin",
            "broken_claim",
        ],
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": str(HERE)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_claim_row_passes_on_the_memory_driver() -> None:
    run = run_claim_row("memory://claims")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "2 passed, 1 skipped" in run.stdout


@pytest.mark.parametrize(
    ("url", "fails", "says"),
    [
        ("claim-not-atomic://q", THREADS, "won key 0, not 1"),
        ("claim-never-expires://q", TTL, "could not be won again"),
        ("claim-expires-at-once://q", TTL, "was won again"),
    ],
)
def test_the_claim_row_fails_a_broken_claim(url: str, fails: str, says: str) -> None:
    run = run_claim_row(url)
    assert run.returncode == 1, run.stdout[-3000:]
    assert "FAILED" in run.stdout and fails in run.stdout, run.stdout[-3000:]
    assert says in run.stdout, run.stdout[-3000:]
