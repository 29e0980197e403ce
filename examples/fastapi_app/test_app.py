"""The FastAPI example: a request emits, a real worker sends the email."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from hermes_test_support import eventually

from examples.conftest import WORKER_S, Queue, running_worker
from examples.fastapi_app.app import app


def test_a_signup_request_queues_a_welcome_email_that_a_worker_sends(
    queue: Queue, tmp_path: Path
) -> None:
    with running_worker("examples.fastapi_app.worker:handlers", queue, tmp_path) as worker:
        with TestClient(app) as client:  # runs the lifespan: connects to $HERMES_URL
            response = client.post("/signup", json={"email": "ana@example.com", "name": "Ana"})

        assert response.status_code == 202, response.text
        job = response.json()["queued"]
        sent = eventually(queue.outbox, "the worker to send the welcome email", WORKER_S)
        assert sent == [{"to": "ana@example.com", "subject": "Welcome, Ana!", "job": job}]
        assert worker.finished().endswith("received 1, handled 1, failed 0, retried 0, gave up 0")
