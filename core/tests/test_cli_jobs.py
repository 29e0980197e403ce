"""``hermes job``, ``hermes jobs``, ``hermes cancel`` and ``--results-url`` on emit and worker."""

from __future__ import annotations

import itertools
import json
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes.core import Message
from hermes.core.cli import main
from hermes.core.jobs import Jobs, JobState

_modules = itertools.count()


@pytest.fixture
def names() -> tuple[str, str]:
    """A queue URL and a records URL of the test's own (memory://, so in this process)."""
    tag = uuid.uuid4().hex
    return f"memory://queue-{tag}", f"memory://records-{tag}"


@pytest.fixture
def handlers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A handlers module in the current directory: ``total`` returns a Result, ``boom`` raises."""
    monkeypatch.chdir(tmp_path)
    name = f"cli_jobs_{next(_modules)}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from hermes.core import Result

            def total(message):
                return Result(sum(message.payload["items"]))

            def boom(message):
                raise RuntimeError("card declined")

            HANDLERS = {"total": total, "boom": boom}
            """
        )
    )
    yield f"{name}:HANDLERS"
    sys.modules.pop(name, None)


def emit(capsys: pytest.CaptureFixture[str], queue: str, records: str, *argv: str) -> str:
    assert main(["emit", "--url", queue, "--results-url", records, *argv]) == 0
    out = capsys.readouterr().out
    return out.strip()


def test_an_emitted_job_is_waiting_then_its_result_shows_after_the_worker(
    capsys: pytest.CaptureFixture[str], names: tuple[str, str], handlers: str
) -> None:
    queue, records = names
    job_id = emit(capsys, queue, records, "total", '{"items": [1, 2, 3]}')

    assert main(["job", job_id, "--results-url", records]) == 0
    assert "state      waiting" in capsys.readouterr().out

    argv = ["worker", "--url", queue, "--handlers", handlers, "--max-items", "1", "-q"]
    assert main([*argv, "--results-url", records]) == 0
    capsys.readouterr()
    assert main(["job", job_id, "--results-url", records, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["state"], record["result"], len(record["attempts"])) == ("succeeded", 6, 1)


def test_a_failed_job_shows_its_exception_class_and_message(
    capsys: pytest.CaptureFixture[str], names: tuple[str, str], handlers: str
) -> None:
    queue, records = names
    job_id = emit(capsys, queue, records, "boom", "{}")
    argv = ["worker", "--url", queue, "--handlers", handlers, "--max-items", "1", "-q"]
    assert main([*argv, "--results-url", records]) == 0
    capsys.readouterr()

    assert main(["job", job_id, "--results-url", records]) == 0
    shown = capsys.readouterr().out
    assert "state      given_up" in shown
    assert "builtins.RuntimeError: card declined" in shown
    assert "Traceback (most recent call last)" in shown

    assert main(["jobs", "--results-url", records, "--state", "given_up"]) == 0
    listed = capsys.readouterr()
    assert job_id in listed.out and "card declined" in listed.out
    assert "1 job" in listed.err


def test_a_cancelled_job_is_acknowledged_unrun_and_listed_as_cancelled(
    capsys: pytest.CaptureFixture[str], names: tuple[str, str], handlers: str
) -> None:
    queue, records = names
    job_id = emit(capsys, queue, records, "boom", "{}")

    assert main(["cancel", job_id, "--results-url", records]) == 0
    assert "cancelled: no handler will start it" in capsys.readouterr().out
    argv = ["worker", "--url", queue, "--handlers", handlers, "--max-items", "1"]
    assert main([*argv, "--results-url", records]) == 0
    worker = capsys.readouterr()
    assert "card declined" not in worker.err
    assert "was cancelled: acknowledged without running a handler" in worker.err
    assert worker.out.rstrip().endswith(
        "handled 0, failed 0, retried 0, gave up 0, "
        "skipped 1 (cancelled or expired before they started)"
    ), worker.out

    assert main(["jobs", "--results-url", records, "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["state"] == "cancelled"


def test_an_unknown_id_and_a_store_that_cannot_keep_records_are_one_line_mistakes(
    capsys: pytest.CaptureFixture[str], names: tuple[str, str]
) -> None:
    _, records = names

    assert main(["job", "nope", "--results-url", records]) == 2
    unknown = capsys.readouterr().err
    assert unknown.startswith("hermes: error: no record of job #nope") and unknown.count("\n") == 1

    assert main(["cancel", "nope", "--results-url", records]) == 2
    assert "no record of job #nope" in capsys.readouterr().err

    rabbit = "amqp://guest:secret@127.0.0.1:5672/?queue=jobs"
    assert main(["jobs", "--results-url", rabbit]) == 2
    refused = capsys.readouterr().err
    assert "cannot keep job records; name a store that can" in refused
    assert "secret" not in refused and refused.count("\n") == 1


def test_a_records_command_without_a_store_says_where_to_name_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HERMES_RESULTS_URL", raising=False)

    assert main(["jobs"]) == 2
    assert "--results-url URL (or $HERMES_RESULTS_URL)" in capsys.readouterr().err


def test_emit_prints_the_id_alone_so_a_script_can_keep_it(
    capsys: pytest.CaptureFixture[str], names: tuple[str, str]
) -> None:
    queue, _ = names
    assert main(["emit", "--url", queue, "job", "-q"]) == 0
    quiet = capsys.readouterr()
    assert len(quiet.out.strip()) == 36 and quiet.err == ""

    assert main(["emit", "--url", queue, "job", "--count", "3"]) == 0
    many = capsys.readouterr()
    assert len(set(many.out.split())) == 3
    assert "Emitted 3 messages" in many.err


def test_cancelling_a_running_job_says_its_worker_is_told(
    capsys: pytest.CaptureFixture[str], names: tuple[str, str]
) -> None:
    _, records = names
    jobs = Jobs(records)
    message = Message("total", {"items": [1]})
    try:
        jobs.emitted(message, 100)
        jobs.start(message, 100)
        assert main(["cancel", message.id, "--results-url", records]) == 0
        out = capsys.readouterr().out
        assert f"Job #{message.id} (total) is running: its worker is told" in out
        record = jobs.get(message.id)
        assert record is not None
        assert record.state is JobState.RUNNING and record.cancel_requested
    finally:
        jobs.close()


def test_a_job_cancelled_while_it_runs_is_counted_in_the_worker_s_summary(
    capsys: pytest.CaptureFixture[str],
    names: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue, records = names
    monkeypatch.chdir(tmp_path)
    module = f"cli_jobs_{next(_modules)}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """
            import time

            from hermes.core.jobs import current_job

            def export(message):
                job = current_job()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    job.raise_if_cancelled()
                    time.sleep(0.01)

            HANDLERS = {"export": export}
            """
        )
    )
    job_id = emit(capsys, queue, records, "export", "{}")
    jobs = Jobs(records)
    argv = ["worker", "--url", queue, "--handlers", f"{module}:HANDLERS", "--max-items", "1"]
    codes: list[int] = []
    worker = threading.Thread(target=lambda: codes.append(main([*argv, "--results-url", records])))
    try:
        worker.start()
        deadline = time.monotonic() + 30
        while (record := jobs.get(job_id)) is None or record.state is not JobState.RUNNING:
            assert time.monotonic() < deadline, f"the job never started: {record}"
            time.sleep(0.01)
        jobs.cancel(job_id)
        worker.join(60)
        assert codes == [0]
        assert worker.is_alive() is False
        summary = capsys.readouterr().out.splitlines()[-1]
        assert summary.endswith("gave up 0, cancelled 1 while running"), summary
        final = jobs.get(job_id)
        assert final is not None and final.state is JobState.CANCELLED
    finally:
        jobs.close()
        sys.modules.pop(module, None)


def test_hermes_job_shows_a_workflow_s_tree_and_a_step_its_workflow(
    capsys: pytest.CaptureFixture[str], names: tuple[str, str], handlers: str
) -> None:
    from hermes.core import connect
    from hermes.core.workflows import Workflows, chain, group, job

    queue, records = names
    driver = connect(queue)
    flow = chain(group(job("total", {"items": [1]}), job("boom")), job("total", {"items": [2]}))
    handle = Workflows(driver, Jobs(records)).start(flow)
    argv = ["worker", "--url", queue, "--handlers", handlers, "--max-items", "2", "-q"]
    assert main([*argv, "--results-url", records]) == 0
    capsys.readouterr()

    assert main(["job", handle.id, "--results-url", records]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"chain  {handle.id}  failed",
        f"  group  {handle.id}.0  failed",
        f"    job    {handle.id}.0.0  (total)  succeeded",
        f"    job    {handle.id}.0.1  (boom)  given_up",
        f"  job    {handle.id}.1  not sent",
    ]
    assert main(["job", handle.id, "--results-url", records, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["children"][0]["kind"] == "group"
    assert main(["job", f"{handle.id}.0.1", "--results-url", records]) == 0
    step = capsys.readouterr().out
    assert "RuntimeError: card declined" in step
    assert f"workflow   step 1 of {handle.id}.0 (hermes job {handle.id})" in step


def test_hermes_jobs_pages_newest_or_oldest_first_and_a_foreign_cursor_is_one_line(
    capsys: pytest.CaptureFixture[str], names: tuple[str, str]
) -> None:
    queue, records = names
    ids = [emit(capsys, queue, records, "job", "-q") for _ in range(5)]

    def listed(*argv: str) -> tuple[list[str], str | None]:
        assert main(["jobs", "--results-url", records, "--json", "--limit", "2", *argv]) == 0
        out = capsys.readouterr()
        following = [x.split("--after ")[1] for x in out.err.splitlines() if "--after" in x]
        return [json.loads(x)["id"] for x in out.out.splitlines()], (following or [None])[0]

    newest, after = listed()
    while after is not None:
        emit(capsys, queue, records, "job", "-q")  # newer than every page: none shifts
        page, after = listed("--after", after)
        newest += page
    assert newest == ids[::-1]

    oldest, after = listed("--oldest")
    while after is not None:
        page, after = listed("--oldest", "--after", after)
        oldest += page
    assert oldest[:5] == ids and len(oldest) == 5 + 2  # and the two emitted meanwhile

    assert main(["jobs", "--results-url", records, "--after", "not-a-cursor"]) == 2
    refused = capsys.readouterr().err
    assert refused.startswith("hermes: error: --after 'not-a-cursor'") and refused.count("\n") == 1
