"""The kit's claim row has teeth: green on the memory driver, red on each broken claim."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
THREADS = "test_one_of_sixteen_threads_claiming_one_key_at_once_wins"
PROCESSES = "test_one_of_four_processes_claiming_the_same_keys_at_once_wins_each"
TTL = "test_a_claim_is_not_won_again_before_its_ttl_and_is_after_it"
#: URL -> (the test of the claims row it must fail, what the output shows).
BROKEN = {
    "claim-not-atomic://q": (THREADS, "won key 0, not 1"),
    "claim-never-expires://q": (TTL, "could not be won again"),
    "claim-expires-at-once://q": (TTL, "was won again"),
    "claims-in-process://q": (PROCESSES, "winners per key [4, 4, 4, 4, 4], not one each"),
}


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
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_claim_row_passes_on_the_memory_driver() -> None:
    run = run_claim_row("memory://claims")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "2 passed, 1 skipped" in run.stdout


def test_the_claim_row_passes_on_claims_every_process_shares_through_the_plugin() -> None:
    # The claimer processes know the scheme only from the --hermes-plugin module.
    run = run_claim_row("claims-in-sqlite://control")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "3 passed" in run.stdout, run.stdout[-3000:]


@pytest.mark.parametrize("url", list(BROKEN))
def test_the_claim_row_fails_a_broken_claim(url: str) -> None:
    fails, says = BROKEN[url]
    run = run_claim_row(url)
    assert run.returncode == 1, run.stdout[-3000:]
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and fails in failed[0], run.stdout[-3000:]
    assert says in run.stdout, run.stdout[-3000:]


def test_every_test_of_the_claim_row_fails_on_some_broken_claim() -> None:
    assert {fails for fails, _ in BROKEN.values()} == {THREADS, PROCESSES, TTL}
