"""The Django example: a request emits, a real worker sends the email."""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import django
import hermes_test_services as services
import pytest
from hermes_test_support import eventually

from examples.conftest import WORKER_S, Queue, running, running_worker

# The orders table in a database of this run's own, which the worker uses too.
OWN_DATABASE = None
if not os.environ.get("DATABASE_URL"):
    OWN_DATABASE = os.environ["DATABASE_URL"] = services.create_database("hermes_example")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
django.setup()

from django.core.management import call_command  # noqa: E402 - after django.setup()
from django.db import connection, connections  # noqa: E402

call_command("migrate", verbosity=0)

from django.test import Client, override_settings  # noqa: E402 - after django.setup()

from examples.django_app.jobs import emitter  # noqa: E402
from examples.django_app.settings import tasks_setting  # noqa: E402
from hermes.django import close_connections  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def own_database() -> Iterator[None]:
    """Drops the run's own database after the module's tests."""
    yield
    connections.close_all()
    if OWN_DATABASE is not None:
        services.drop_database(OWN_DATABASE)


@pytest.fixture
def hermes_url(queue: Queue) -> Iterator[str]:
    """``settings.HERMES_URL`` pointed at the test's queue, and a fresh Emitter for it."""
    with override_settings(HERMES_URL=queue.url):
        emitter.cache_clear()
        yield queue.url
        if emitter.cache_info().currsize:
            emitter().driver.close()
        emitter.cache_clear()


def test_a_signup_request_queues_a_welcome_email_that_a_worker_sends(
    queue: Queue, hermes_url: str, tmp_path: Path
) -> None:
    with running_worker("examples.django_app.worker:handlers", queue, tmp_path) as worker:
        response = Client().post(
            "/signup", {"email": "cy@example.com", "name": "Cy"}, content_type="application/json"
        )

        assert response.status_code == 202, response.content
        job = response.json()["queued"]
        sent = eventually(queue.outbox, "the worker to send the welcome email", WORKER_S)
        assert sent == [{"to": "cy@example.com", "subject": "Welcome, Cy!", "job": job}]
        assert worker.finished().endswith("received 1, handled 1, failed 0, retried 0, gave up 0")


@pytest.fixture
def tasks_on_queue(queue: Queue) -> Iterator[str]:
    """Django's TASKS setting pointed at the test's queue."""
    with override_settings(TASKS=tasks_setting(queue.url)):
        yield queue.url
    close_connections()


def test_an_order_enqueues_a_task_that_hermes_worker_runs_and_whose_result_reads_back(
    queue: Queue, tasks_on_queue: str, tmp_path: Path
) -> None:
    client = Client()
    first = client.post("/orders", {"email": "cy@example.com", "order": 7}, "application/json")
    second = client.post(
        "/orders-async", {"email": "di@example.com", "order": 8}, "application/json"
    )
    again = client.post("/orders", {"email": "eve@example.com", "order": 7}, "application/json")
    assert again.status_code == 409, "order 7 exists: the transaction rolled back"
    assert (first.status_code, second.status_code) == (202, 202), (first.content, second.content)
    waiting = client.get(f"/receipts/{first.json()['task']}").json()
    assert waiting == {"status": "READY"}

    command = [sys.executable, "-m", "django", "hermes_worker",
               "--settings", "examples.django_app.settings", "--max-items", "2"]  # fmt: skip
    with running(command, queue, tmp_path) as worker:
        sent = eventually(
            lambda: len(queue.outbox()) == 2 and queue.outbox(), "two receipts", WORKER_S
        )
        assert sorted(m["to"] for m in sent) == ["cy@example.com", "di@example.com"]
        assert worker.finished().endswith("received 2, handled 2, failed 0, retried 0, gave up 0")

    receipt = client.get(f"/receipts/{first.json()['task']}").json()
    assert receipt["status"] == "SUCCESSFUL"
    assert receipt["return_value"] == {"sent_to": "cy@example.com", "order": 7}
    assert client.get("/receipts/no-such-task").status_code == 404
    # The rolled-back enqueue was never sent: the two receipts were all the worker got.
    prefix = queue.outbox_key.removesuffix("outbox")
    assert queue.client.scard(f"{prefix}hermes") == 0


def worker_command(items: int) -> list[str]:
    return [sys.executable, "-m", "django", "hermes_worker",
            "--settings", "examples.django_app.settings", "--max-items", str(items)]  # fmt: skip


def test_a_failed_task_reads_back_with_its_exception_class_and_traceback(
    queue: Queue, tasks_on_queue: str, tmp_path: Path
) -> None:
    client = Client()
    task = client.post(
        "/orders", {"email": "cy@example.invalid", "order": 21}, "application/json"
    ).json()["task"]

    with running(worker_command(1), queue, tmp_path) as worker:
        assert worker.finished().endswith("received 1, handled 0, failed 1, retried 0, gave up 1")

    receipt = client.get(f"/receipts/{task}").json()
    assert receipt["status"] == "FAILED"
    [error] = receipt["errors"]
    assert error["exception"] == "builtins.ValueError"
    assert "in send_receipt" in error["traceback"]
    assert "no mail server takes cy@example.invalid" in error["traceback"]


def test_a_job_after_the_worker_s_database_connection_was_killed_still_succeeds(
    queue: Queue, tasks_on_queue: str, tmp_path: Path
) -> None:
    client = Client()
    first = client.post("/orders", {"email": "fi@example.com", "order": 31}, "application/json")
    with running(worker_command(2), queue, tmp_path) as worker:
        eventually(lambda: len(queue.outbox()) == 1, "the first receipt", WORKER_S)
        # As a PostgreSQL restart does: every other connection to the database is cut.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] >= 1, "the worker's connection was there to cut"
        second = client.post(
            "/orders", {"email": "se@example.com", "order": 32}, "application/json"
        )
        assert worker.finished().endswith("received 2, handled 2, failed 0, retried 0, gave up 0")

    for response in (first, second):
        receipt = client.get(f"/receipts/{response.json()['task']}").json()
        assert receipt["status"] == "SUCCESSFUL", receipt


def test_an_express_receipt_goes_first_and_a_deferred_one_not_before_its_time(
    queue: Queue, tasks_on_queue: str, tmp_path: Path
) -> None:
    client = Client()
    ordered = datetime.datetime.now(datetime.UTC)
    later = client.post(
        "/orders", {"email": "la@example.com", "order": 43, "send_after_s": 3}, "application/json"
    ).json()["task"]
    client.post("/orders", {"email": "no@example.com", "order": 41}, "application/json")
    client.post(
        "/orders", {"email": "ex@example.com", "order": 42, "express": True}, "application/json"
    )

    with running(worker_command(3), queue, tmp_path) as worker:
        assert worker.finished().endswith("received 3, handled 3, failed 0, retried 0, gave up 0")

    sent = [m["to"] for m in queue.outbox()]
    # The express receipt is first whenever the worker starts; whether the deferred one comes
    # before or after the plain one depends on whether the worker started within its 3 s.
    assert sent[0] == "ex@example.com", sent
    assert sorted(sent[1:]) == ["la@example.com", "no@example.com"], sent
    started = datetime.datetime.fromisoformat(client.get(f"/receipts/{later}").json()["started_at"])
    assert started >= ordered + datetime.timedelta(seconds=3)
