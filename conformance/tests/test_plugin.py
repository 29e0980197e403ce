"""The pytest plugin: inert without --hermes-url, clear about bad input, honest in its summary."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

UNRELATED_TESTS = """
def test_something_else(tmp_path):
    assert tmp_path.exists()
"""

NEW_CHECK_TESTS = """
import pytest


@pytest.mark.hermes_check("retry", "a check new in this release", new=True)
def test_a_new_check_the_driver_does_not_pass_yet(hermes_kit):
    assert hermes_kit.capabilities.priorities is False


@pytest.mark.hermes_check("retry", "another new check the driver passes", new=True)
def test_a_new_check_the_driver_passes(hermes_driver):
    assert hermes_driver.capabilities.priorities is True
"""


LONG_FAILURE_TESTS = """
import pytest


@pytest.mark.hermes_check("retry", "a check with a long reason")
def test_a_check_that_fails_with_a_long_reason(hermes_kit):
    words = " ".join(f"word{n}" for n in range(60))
    assert hermes_kit.capabilities.priorities is False, f"the reason comes first: {words} END"
"""


def test_without_hermes_url_every_kit_test_skips_and_says_why(kit_runner: Any) -> None:
    run = kit_runner.run("--pyargs", "hermes.conformance")

    assert run.returncode == 0, run.describe()
    assert run.outcomes and set(run.outcomes.values()) == {"skipped"}, run.describe()
    assert set(run.reasons.values()) == {"--hermes-url not given"}
    assert "hermes conformance summary" not in run.output


def test_the_plugin_leaves_an_unrelated_test_run_alone(kit_runner: Any) -> None:
    run = kit_runner.run("test_unrelated.py", files={"test_unrelated.py": UNRELATED_TESTS})

    assert run.returncode == 0, run.describe()
    assert run.outcomes == {"test_something_else": "passed"}
    assert "hermes conformance summary" not in run.output
    assert "warning" not in run.output.lower()


def test_a_new_check_the_driver_fails_fails_the_run_as_any_other(kit_runner: Any) -> None:
    run = kit_runner.run(
        "test_new_checks.py",
        "--hermes-url",
        "memory://selftest",
        files={"test_new_checks.py": NEW_CHECK_TESTS},
    )

    assert run.returncode == 1, run.describe()
    assert run.outcomes == {
        "test_a_new_check_the_driver_does_not_pass_yet": "failed",
        "test_a_new_check_the_driver_passes": "passed",
    }, run.describe()
    assert "retry: a check new in this release failed (" in run.output, run.describe()
    assert "another new check the driver passes verified" in run.output, run.describe()
    assert "2 checks: 1 verified, 0 not verified, 0 not applicable, 1 failed" in run.output
    assert "provisional" not in run.output, run.describe()


def test_python_m_hermes_conformance_runs_the_kit_on_a_url(kit_runner: Any) -> None:
    run = kit_runner.run(
        "memory://selftest", "-k", "sending_to_a_priority_without", module="hermes.conformance"
    )

    assert run.returncode == 0, run.describe()
    assert run.outcomes == {
        "test_sending_to_a_priority_without_a_queue_raises_unknown_priority_error": "passed"
    }
    assert "unknown priority raises UnknownPriorityError verified" in run.output


def test_a_url_no_installed_driver_handles_stops_the_run_naming_the_installed_ones(
    kit_runner: Any,
) -> None:
    run = kit_runner.run("--pyargs", "hermes.conformance", "--hermes-url", "nope://host/queue")

    assert run.returncode == 4, run.describe()  # pytest's usage error
    assert "--hermes-url: no installed Hermes driver handles nope://" in run.output
    assert "memory://" in run.output


def test_a_bad_time_scale_stops_the_run_saying_what_is_expected(kit_runner: Any) -> None:
    run = kit_runner.run(
        "--pyargs", "hermes.conformance", "--hermes-url", "memory://x", scale=float("nan")
    )

    assert run.returncode == 4, run.describe()
    assert "HERMES_KIT_TIME_SCALE='nan' must be a number > 0" in run.output


def test_a_plugin_module_that_does_not_import_stops_the_run(kit_runner: Any) -> None:
    run = kit_runner.run(
        "--pyargs",
        "hermes.conformance",
        "--hermes-url",
        "memory://x",
        "--hermes-plugin",
        "no_such_module_here",
    )

    assert run.returncode == 4, run.describe()
    assert "--hermes-plugin: No module named 'no_such_module_here'" in run.output


def test_the_summary_counts_a_driver_error_as_a_failure_not_a_pass(kit_runner: Any) -> None:
    run = kit_runner.run(
        "--pyargs",
        "hermes.conformance.test_concurrency",
        "--hermes-url",
        "fork-unsafe://x",
        "--hermes-plugin",
        "broken_drivers",
        "-k",
        "used_before_fork",
    )

    assert run.returncode == 1, run.describe()
    assert "fork: a driver used before fork() failed (in the forked child:" in run.output, (
        run.describe()
    )
    assert "1 checks: 0 verified, 0 not verified, 0 not applicable, 1 failed" in run.output


def test_a_summary_line_keeps_the_reason_cut_at_a_word_and_the_report_has_all_of_it(
    kit_runner: Any,
) -> None:
    run = kit_runner.run(
        "test_long.py",
        "--hermes-url",
        "memory://selftest",
        files={"test_long.py": LONG_FAILURE_TESTS},
    )

    assert run.returncode == 1, run.describe()
    line = next(line for line in run.output.splitlines() if line.startswith("retry: "))
    assert line.startswith(
        "retry: a check with a long reason failed (the reason comes first: word0 word1"
    ), line
    assert re.search(r" word\d+ \.\.\.\)$", line), line
    assert "END" not in line, line
    assert "E       AssertionError: the reason comes first: word0" in run.output
    assert "word59 END" in run.output, run.describe()


DROPPED = "test_a_message_whose_connection_dropped_before_its_settle_is_delivered_again"


def _dropped_row(*options: str) -> tuple[str, ...]:
    """The kit's arguments for its dropped-connection row alone, on the memory driver."""
    return (
        "--pyargs",
        "hermes.conformance.test_settles",
        "--hermes-url",
        "memory://selftest",
        "-k",
        "connection_dropped",
        *options,
    )


def test_a_driver_declared_without_a_connection_has_the_drop_row_not_applicable(
    kit_runner: Any,
) -> None:
    run = kit_runner.run(*_dropped_row("--hermes-no-connection"))

    assert run.returncode == 0, run.describe()
    assert run.outcomes == {DROPPED: "skipped"}, run.describe()
    assert run.reasons[DROPPED] == (
        "n/a: the driver holds no broker connection (--hermes-no-connection)"
    )
    assert "1 checks: 0 verified, 0 not verified, 1 not applicable, 0 failed" in run.output


def test_the_drop_command_runs_in_a_shell_whose_parent_is_the_kit_process(
    kit_runner: Any, tmp_path: Path
) -> None:
    parent = tmp_path / "parent-cmdline"
    # Records the command line of $PPID; the memory driver has nothing to drop.
    command = f"tr '\\0' ' ' < /proc/$PPID/cmdline > {parent}; echo recorded its parent"

    run = kit_runner.run(*_dropped_row("--hermes-drop-connection", command))

    assert run.returncode == 0, run.describe()
    assert run.outcomes == {DROPPED: "passed"}, run.describe()
    assert "-p kit_outcomes" in parent.read_text(), parent.read_text()
    assert "(--hermes-drop-connection): delivered again verified" in run.output, run.describe()
    # What the command printed is a figure under the row.
    assert "    --hermes-drop-connection: recorded its parent" in run.output, run.describe()


def test_a_drop_command_that_fails_fails_the_row_naming_its_exit_and_output(
    kit_runner: Any,
) -> None:
    command = "echo cannot abort the sockets >&2; exit 3"

    run = kit_runner.run(*_dropped_row("--hermes-drop-connection", command))

    assert run.returncode == 1, run.describe()
    assert run.outcomes == {DROPPED: "failed"}, run.describe()
    assert "exited 3: cannot abort the sockets" in run.output, run.describe()


def test_a_drop_command_and_no_connection_together_stop_the_run(kit_runner: Any) -> None:
    run = kit_runner.run(
        *_dropped_row("--hermes-drop-connection", "true", "--hermes-no-connection")
    )

    assert run.returncode == 4, run.describe()
    assert "--hermes-drop-connection and --hermes-no-connection" in run.output
