"""``manage.py hermes_worker``: which arguments are its own and which go to ``hermes worker``."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hermes_django_tests.harness import HERE, WORKER_S, Worker
from hermes_test_support import eventually

from hermes.django.management.commands.hermes_worker import split_arguments


def test_its_own_and_djangos_options_are_kept_and_the_rest_goes_to_hermes() -> None:
    own, hermes = split_arguments(
        ["--backend", "jobs", "-v", "--concurrency", "4", "--handlers=app.jobs:handlers",
         "--settings", "proj.settings", "-vv", "--", "--backend", "x"]
    )  # fmt: skip

    assert own == [
        "--backend",
        "jobs",
        "--handlers=app.jobs:handlers",
        "--settings",
        "proj.settings",
    ]
    assert hermes == ["-v", "--concurrency", "4", "-vv", "--backend", "x"]


def test_a_queue_name_not_in_queues_is_refused_naming_the_queues() -> None:
    run = subprocess.run(
        [sys.executable, "manage.py", "hermes_worker", "--queue-name", "nowhere"],
        cwd=HERE, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert run.returncode == 1
    assert "--queue-name nowhere: not in TASKS[\"default\"][\"QUEUES\"] ['default', 'reports']" in (
        run.stderr
    )


def test_a_misspelt_backend_option_stops_the_command_with_one_line_naming_it() -> None:
    run = subprocess.run(
        [sys.executable, "manage.py", "hermes_worker",
         "--settings", "hermes_django_tests.settings_misspelt"],
        cwd=HERE, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert run.returncode == 1, run.stderr
    assert "hermes_django.E001" in run.stderr
    assert "unknown OPTIONS ['result_url']" in run.stderr
    assert "Traceback" not in run.stderr


def test_reload_restarts_the_worker_when_the_project_s_code_changes(
    start_worker: Callable[..., Worker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.setenv("HERMES_DJANGO_BASE_DIR", str(project))
    worker = start_worker("--reload")
    eventually(lambda: "Started worker-1" in worker.log(), "the first worker", WORKER_S)
    assert f"restarted when a .py file changes under {project}" in worker.log()
    edits = iter(range(1000))

    def edited() -> bool:
        # Written again until seen: the watcher may start watching after the first worker.
        (project / "views.py").write_text(f"VALUE = {next(edits)}\n")
        time.sleep(0.2)
        return "views.py changed" in worker.log()

    eventually(edited, "the change seen", WORKER_S, 0.1, worker.log)
    eventually(lambda: worker.log().count("Started worker-1") >= 2, "a new worker", WORKER_S)
