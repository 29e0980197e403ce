"""The Django example: a request emits, a real worker sends the email."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import django
import pytest
from hermes_test_support import eventually

from examples.conftest import WORKER_S, Queue, running_worker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
django.setup()

from django.test import Client, override_settings  # noqa: E402 - after django.setup()

from examples.django_app.jobs import emitter  # noqa: E402


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
