"""The kit's machinery on its own: names, counts, time, hung calls, failure texts."""

from __future__ import annotations

import ast
import re
import threading
from pathlib import Path

import pytest

from hermes import conformance
from hermes.conformance._harness import (
    Ledger,
    TotalQueue,
    Worker,
    call_within,
    namespace_for,
    scaled,
    time_scale,
    wait_until,
)
from hermes.conformance._worker import JOB, Record, read_records
from hermes.conformance.plugin import cause
from hermes.core import Emitter, Message
from hermes.core.testing import MemoryDriver


@pytest.mark.parametrize(
    "test_name",
    [
        "test_a_handled_message_is_never_delivered_again",
        "test_every_message_field_survives_the_broker[UPPER case & ünïcode]",
        "test_" + "x" * 200,
        "test___",
    ],
)
def test_a_namespace_is_lowercase_letters_digits_and_dashes_of_at_most_48(test_name: str) -> None:
    namespace = namespace_for(test_name)

    assert re.fullmatch(r"[a-z0-9][a-z0-9-]*[a-z0-9]", namespace), namespace
    assert len(namespace) <= 48


def test_two_namespaces_for_one_test_differ() -> None:
    assert namespace_for("test_x") != namespace_for("test_x")


def test_the_total_queue_check_counts_lost_duplicated_and_unexpected_like_jepsen() -> None:
    check = TotalQueue.of(["a", "b", "c"], ["a", "a", "a", "b", "z"])

    assert check.lost == {"c"}
    assert check.duplicated == {"a": 3}
    assert check.unexpected == {"z"}
    assert check.summary() == "attempted=3 delivered=5 lost=1 duplicated=1 unexpected=1"


def test_the_time_scale_multiplies_every_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_KIT_TIME_SCALE", "2.5")

    assert time_scale() == 2.5
    assert scaled(2.0) == 5.0


@pytest.mark.parametrize("value", ["0", "-1", "fast", "inf", "nan"])
def test_a_time_scale_that_is_not_a_positive_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("HERMES_KIT_TIME_SCALE", value)

    with pytest.raises(ValueError, match="must be a number > 0"):
        time_scale()


def test_wait_until_returns_the_predicate_truth_at_the_deadline() -> None:
    calls = []

    assert wait_until(lambda: calls.append(1) or len(calls) >= 3, 5.0) is True
    assert wait_until(lambda: False, 0.05) is False


def test_a_record_file_keeps_only_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "records.tsv"
    path.write_text("id-1\t42\t7\n#ready\t43\t-\nid-2\t4")

    assert read_records(path) == [Record("id-1", 42, "7"), Record("#ready", 43, "-")]
    assert read_records(tmp_path / "missing.tsv") == []


def _hang() -> None:
    threading.Event().wait()


def test_a_call_that_hangs_fails_naming_the_call_and_the_line_it_is_stuck_on() -> None:
    with pytest.raises(AssertionError) as caught:
        call_within("close()", _hang, 0.05, "a driver")

    text = str(caught.value)
    assert text.startswith("close() did not return within 0.1 s (scaled); it is stuck in "), text
    assert re.search(r"test_harness\.py:\d+ _hang\(\), waiting in threading\.py:\d+ wait\(\)", text)
    assert text.endswith(" (a driver)"), text


class _Stuck:
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.leave = threading.Event()

    def handle(self, message: Message) -> bool:
        self.entered.set()
        self.leave.wait(30)
        return True


def test_a_worker_that_does_not_stop_fails_naming_the_line_it_is_stuck_on() -> None:
    driver = MemoryDriver(namespace_for("test_stuck_worker"))
    stuck = _Stuck()
    worker = Worker(driver, Ledger(), name="worker-1", handlers={JOB: [stuck]}).start()
    Emitter(driver).emit(Message(JOB, {"n": 1}))
    assert stuck.entered.wait(5), "the handler never started"
    try:
        with pytest.raises(AssertionError) as caught:
            worker.stop(0.05)
    finally:
        stuck.leave.set()
        worker.stop()

    text = str(caught.value)
    assert re.match(r"handle\(\) still runs 0\.\d s after a shutdown request; ", text), text
    assert re.search(r"stuck in .*test_harness\.py:\d+ handle\(\), waiting in threading", text)


def test_a_call_that_raises_raises_on_the_callers_thread() -> None:
    def fail() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        call_within("purge()", fail, 5.0)


def test_a_summary_quotes_the_reason_and_cuts_it_at_a_word_boundary() -> None:
    crash = "AssertionError: a busy worker started 190 more " + "messages " * 40 + "END\nassert 1"

    quoted = cause(crash)

    assert quoted.startswith("a busy worker started 190 more messages messages"), quoted
    assert quoted.endswith(" messages ..."), quoted
    assert len(quoted) <= 210 and "END" not in quoted, quoted


def test_a_summary_keeps_the_type_of_an_error_that_is_not_an_assertion() -> None:
    assert cause("UnknownPriorityError: no queue for priority 7\nmore") == (
        "UnknownPriorityError: no queue for priority 7"
    )
    assert cause("") == "see the report above"


def test_every_assertion_of_the_kit_says_what_failed() -> None:
    """A bare assert reads "assert False" in the summary: each one carries a message."""
    bare = []
    for path in sorted(Path(conformance.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assert) and node.msg is None:
                bare.append(f"{path.name}:{node.lineno}: assert {ast.unparse(node.test)}")

    assert bare == [], "asserts without a message"


def _kit_rows() -> set[str]:
    """The row of every ``hermes_check`` mark in the kit's test modules."""
    rows = set()
    for path in Path(conformance.__file__).parent.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func).endswith("hermes_check")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                rows.add(str(node.args[0].value))
    return rows


def test_the_readme_table_lists_every_row_the_kit_runs() -> None:
    readme = (Path(conformance.__file__).parents[3] / "README.md").read_text()
    section = readme.split("## What the kit checks", 1)[1].split("\n## ", 1)[0]
    listed = {line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")}

    missing = {row for row in _kit_rows() if not any(name.startswith(row) for name in listed)}

    assert len(_kit_rows()) > 20, "the kit's rows were not found"
    assert missing == set(), "rows the kit runs that the README's table does not list"
