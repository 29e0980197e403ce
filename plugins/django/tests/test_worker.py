"""``manage.py hermes_worker`` runs the tasks; their results come back through the records."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from hermes_django_tests.harness import WORKER_S, Queue, Worker, on_commit_backend
from hermes_django_tests.shop.signals import SIGNALS_ENV
from hermes_django_tests.shop.tasks import (
    add,
    async_add,
    attempt,
    backend_pid,
    fail,
    label,
    zero,
)
from hermes_test_support import eventually

from hermes.core import Emitter, Message, connect
from hermes.core.jobs import Jobs
from hermes.django._compat import (
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
)


def finished(result: TaskResult, worker: Worker, timeout_s: float = WORKER_S) -> TaskResult:
    """``result`` refreshed until it is finished; fails showing the worker's log."""

    def refreshed() -> bool:
        result.refresh()
        return result.is_finished

    eventually(refreshed, f"task {result.id} to finish", timeout_s, 0.05, worker.log)
    return result


def test_a_task_runs_in_the_worker_and_its_return_value_comes_back(
    start_worker: Callable[..., Worker],
) -> None:
    worker = start_worker()
    result = add.enqueue(2, 3)
    falsy = zero.enqueue()

    finished(result, worker)
    finished(falsy, worker)

    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == 5
    assert falsy.status == TaskResultStatus.SUCCESSFUL and falsy.return_value == 0
    assert result.worker_ids == [worker.name]
    assert result.errors == []
    assert result.enqueued_at is not None and result.started_at is not None
    assert result.finished_at is not None and result.last_attempted_at == result.started_at
    assert result.enqueued_at <= result.started_at <= result.finished_at


def test_a_failing_task_is_failed_with_its_exception_class_and_traceback(
    start_worker: Callable[..., Worker],
) -> None:
    worker = start_worker()
    result = fail.enqueue("the printer is on fire")

    finished(result, worker)

    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "in fail" in error.traceback
    assert "ValueError: the printer is on fire" in error.traceback
    assert result.worker_ids == [worker.name]
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018 - the property raises


def test_a_deferred_task_does_not_run_before_its_time(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    run_after = timezone.now() + datetime.timedelta(seconds=2)
    result = label.using(run_after=run_after).enqueue("later")

    result.refresh()
    assert result.status == TaskResultStatus.READY
    finished(result, worker)

    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "later"
    assert result.started_at is not None and result.started_at >= run_after


def test_higher_priorities_run_first(start_worker: Callable[..., Worker]) -> None:
    low = label.using(priority=-10).enqueue("low")
    default = label.enqueue("default")
    high = label.using(priority=10).enqueue("high")
    worker = start_worker("--concurrency", "1")

    for result in (low, default, high):
        finished(result, worker)

    assert [r.status for r in (low, default, high)] == [TaskResultStatus.SUCCESSFUL] * 3
    assert high.task.priority == 10 and low.task.priority == -10
    assert high.started_at and default.started_at and low.started_at
    assert high.started_at < default.started_at < low.started_at


@pytest.mark.parametrize("enqueue_on_commit", [True, False], ids=["option", "on_commit"])
def test_a_task_enqueued_in_a_transaction_that_rolls_back_never_runs(
    queue: Queue, start_worker: Callable[..., Worker], enqueue_on_commit: bool
) -> None:
    class Rollback(Exception):
        pass

    with on_commit_backend(queue, enqueue_on_commit):
        with pytest.raises(Rollback), transaction.atomic():
            if enqueue_on_commit:
                rolled_back = label.enqueue("rolled back").id
            else:
                transaction.on_commit(lambda: label.enqueue("rolled back"))
            raise Rollback
        with transaction.atomic():
            committed = label.enqueue("committed") if enqueue_on_commit else None
            if not enqueue_on_commit:
                sent: list[TaskResult] = []
                transaction.on_commit(lambda: sent.append(label.enqueue("committed")))
        committed = committed or sent[0]
        worker = start_worker("--concurrency", "1")
        finished(committed, worker)

    assert committed.status == TaskResultStatus.SUCCESSFUL
    assert committed.return_value == "committed"
    if enqueue_on_commit:
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(rolled_back)
    # Nothing else was ever sent: the queue is empty and one job was recorded.
    assert queue.client.scard(f"{queue.prefix}hermes") == 0
    assert [r.id for r in Jobs(queue.url).scan()] == [committed.id]


def test_a_job_after_the_workers_database_connection_was_killed_still_succeeds(
    start_worker: Callable[..., Worker],
) -> None:
    worker = start_worker("--concurrency", "1")
    first = finished(backend_pid.enqueue(), worker)
    assert first.status == TaskResultStatus.SUCCESSFUL, first.errors
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [first.return_value])
        assert cursor.fetchone() == (True,)

    second = finished(backend_pid.enqueue(), worker)

    assert second.status == TaskResultStatus.SUCCESSFUL, second.errors
    assert second.return_value != first.return_value


def test_an_async_task_runs_as_a_coroutine(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()

    result = finished(async_add.enqueue(20, 22), worker)

    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == 42


def test_a_task_that_takes_context_gets_its_result_id_and_attempt(
    start_worker: Callable[..., Worker],
) -> None:
    worker = start_worker()

    result = finished(attempt.enqueue(), worker)

    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == {"id": result.id, "attempt": 1}


def test_hermes_handlers_given_with_handlers_run_beside_the_tasks(
    queue: Queue, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker("--handlers", "hermes_django_tests.shop.handlers:handlers")
    message = Message("shop.ping", {"n": 7})
    driver, jobs = connect(queue.url), Jobs(queue.url)
    try:
        emitter = Emitter(driver, records=jobs)
        emitter.emit(message)
        task = finished(add.enqueue(1, 1), worker)
        assert emitter.job(message).result(timeout=WORKER_S) == "pong 7"
    finally:
        jobs.close()
        driver.close()
    assert task.return_value == 2


def test_a_worker_with_scheduler_sends_the_periodic_tasks_of_the_task_and_of_settings(
    start_worker: Callable[..., Worker], queue: Queue
) -> None:
    worker = start_worker("--scheduler")
    jobs = Jobs(queue.url)

    def ran(type_: str) -> list[Any]:
        return [r.result for r in jobs.scan(type=type_, state="succeeded", limit=10)]

    eventually(
        lambda: (
            ran("hermes_django_tests.shop.tasks.tick")
            and ran("hermes_django_tests.shop.tasks.label")
        ),
        "both periodic tasks to run",
        WORKER_S,
        0.1,
        worker.log,
    )
    assert set(ran("hermes_django_tests.shop.tasks.tick")) == {"tick"}
    assert set(ran("hermes_django_tests.shop.tasks.label")) == {"from settings"}
    jobs.close()


def _signals(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_the_worker_sends_task_started_and_task_finished_around_each_task(
    start_worker: Callable[..., Worker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    received = tmp_path / "signals.log"
    monkeypatch.setenv(SIGNALS_ENV, str(received))
    worker = start_worker()
    succeeding = add.enqueue(2, 3)
    failing = fail.enqueue("no paper")
    finished(succeeding, worker)
    finished(failing, worker)
    ended = {
        f"finished {succeeding.id} SUCCESSFUL -",
        f"finished {failing.id} FAILED builtins.ValueError",
    }
    eventually(lambda: ended <= set(_signals(received)), "both task_finished lines", WORKER_S)

    lines = _signals(received)
    for result in (succeeding, failing):
        mine = [line for line in lines if f" {result.id} " in line]
        assert mine[0] == f"enqueued {result.id} READY -", lines
        assert mine[1] == f"started {result.id} RUNNING -", lines
        assert len(mine) == 3, lines


def test_a_signal_receiver_that_raises_is_logged_and_the_task_still_succeeds(
    start_worker: Callable[..., Worker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SIGNALS_ENV, str(tmp_path / "signals.log"))
    worker = start_worker()
    result = label.enqueue("raise-in-receiver")

    finished(result, worker)

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "raise-in-receiver"
    assert "Error calling on_started in Signal.send_robust()" in worker.log()
    assert "a receiver's own mistake" in worker.log()
