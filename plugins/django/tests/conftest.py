"""The test project, a queue of each test's own, and a real ``manage.py hermes_worker``.

Every test gets a Redis key prefix of its own (broker, records, shutdown key),
so no test sees another's messages; the backend is pointed at it with
``override_settings`` and the worker process through the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import hermes_test_services as services
import pytest
import redis

# The test project (hermes_django_tests, manage.py) lives beside this file.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

# A database of the run's own (two runs on one server, the tests session beside
# the Django 6 one, each migrate the admin's tables), unless one is given.
OWN_DATABASE: str | None = None
if not os.environ.get("HERMES_DJANGO_DATABASE_URL"):
    OWN_DATABASE = os.environ["HERMES_DJANGO_DATABASE_URL"] = services.create_database(
        "hermes_django"
    )
os.environ["DJANGO_SETTINGS_MODULE"] = "hermes_django_tests.settings"

import django  # noqa: E402 - after the database exists

django.setup()

from django.core.management import call_command  # noqa: E402

call_command("migrate", verbosity=0)

from django.test import override_settings  # noqa: E402
from hermes_django_tests.harness import DATABASE, HERE, Queue, Worker  # noqa: E402
from hermes_django_tests.settings import tasks_setting  # noqa: E402

from hermes.django import close_connections  # noqa: E402


@pytest.fixture(autouse=True)
def queue() -> Iterator[Queue]:
    """A queue no other test shares; the ``default`` backend sends there and keeps records there."""
    base = services.ensure_redis().rsplit("/", 1)[0]
    prefix = f"hermes-django-{uuid.uuid4().hex[:8]}:"
    client: redis.Redis[bytes] = redis.Redis.from_url(f"{base}/{DATABASE}")
    queue = Queue(f"{base}/{DATABASE}?prefix={prefix}", prefix, client)
    with override_settings(TASKS=tasks_setting(queue.url, queue.url)):
        yield queue
    close_connections()
    keys = queue.keys()
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def start_worker(queue: Queue, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """``start_worker(*args)``: ``manage.py hermes_worker *args`` on the test's queue.

    Stopped with SIGTERM at the end of the test.
    """
    started: list[Worker] = []

    def start(*args: str) -> Worker:
        env = {**os.environ, "HERMES_DJANGO_URL": queue.url, "HERMES_DJANGO_RESULTS_URL": queue.url}
        output = tmp_path / f"worker-{len(started)}.out"
        with output.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "manage.py", "hermes_worker", *args],
                cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        worker = Worker(process, output)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.process.poll() is None:
            worker.process.terminate()
            try:
                worker.process.wait(10)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Drop the run's own database, once Django's connections to it are closed."""
    if OWN_DATABASE is None:
        return
    from django.db import connections

    connections.close_all()
    services.drop_database(OWN_DATABASE)
