"""``hermes dashboard``'s checks before it binds: a user's mistake is one line and exit 2."""

from __future__ import annotations

import os
import subprocess

import pytest
from dash_support import HERMES


def dashboard(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HERMES_DASHBOARD_AUTH"}
    return subprocess.run(
        [HERMES, "dashboard", "--url", "memory://dash-cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::"])
def test_read_only_on_a_non_loopback_address_without_auth_is_refused(host: str) -> None:
    run = dashboard("--host", host, "--read-only")
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "not a loopback address" in run.stderr
    assert "Traceback" not in run.stderr


def test_an_allowed_host_that_is_not_a_host_name_is_refused() -> None:
    run = dashboard("--allowed-host", "https://dash.example.com/")
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "--allowed-host" in run.stderr


def test_a_results_url_whose_driver_cannot_keep_records_is_refused_without_its_password() -> None:
    run = dashboard("--results-url", "amqp://guest:s3cret@127.0.0.1:5672/")
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "--results-url" in run.stderr and "cannot keep job records" in run.stderr
    assert "redis://" in run.stderr and "s3cret" not in run.stderr


@pytest.mark.parametrize(
    ("option", "keeps"), [("--limits-url", "limits"), ("--registry-url", "heartbeats")]
)
def test_a_store_whose_driver_cannot_keep_what_it_is_named_for_is_refused(
    option: str, keeps: str
) -> None:
    run = dashboard(option, "amqp://guest:s3cret@127.0.0.1:5672/")
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert f"{option} amqp://guest:***@" in run.stderr and f"keeps no {keeps}" in run.stderr
    assert "s3cret" not in run.stderr
