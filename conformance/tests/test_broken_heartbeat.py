"""The kit's heartbeat row has teeth: green on the memory driver, red on a store without expiry."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
EXPIRY = "test_a_record_not_renewed_is_listed_until_its_ttl_and_gone_after_it"
LISTED = "test_a_beat_is_listed_as_written_replaced_by_the_next_and_forgotten_alone"
#: Every test of the heartbeat row, each failed by one of the broken stores here.
CAUGHT = {EXPIRY, LISTED}


def run_heartbeat_row(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "--pyargs",
            "hermes.conformance.test_heartbeat",
            "--hermes-url",
            url,
            "--hermes-plugin",
            "broken_heartbeat",
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


def test_the_heartbeat_row_passes_on_the_memory_driver() -> None:
    run = run_heartbeat_row("memory://heartbeats")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "2 passed" in run.stdout


def test_the_heartbeat_row_fails_a_store_that_ignores_the_ttl() -> None:
    run = run_heartbeat_row("heartbeat-never-expires://q")
    assert run.returncode == 1, run.stdout[-3000:]
    assert "FAILED" in run.stdout and EXPIRY in run.stdout, run.stdout[-3000:]
    assert "was still listed" in run.stdout, run.stdout[-3000:]


def test_the_heartbeat_row_fails_a_store_whose_forget_drops_every_record() -> None:
    run = run_heartbeat_row("heartbeat-forgets-everyone://q")
    assert run.returncode == 1, run.stdout[-3000:]
    assert "FAILED" in run.stdout and LISTED in run.stdout, run.stdout[-3000:]
    assert "removed another's record" in run.stdout, run.stdout[-3000:]
