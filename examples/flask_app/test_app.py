"""The Flask example: a request emits, a real worker sends the email."""

from __future__ import annotations

from pathlib import Path

from hermes_test_support import eventually

from examples.conftest import WORKER_S, Queue, running_worker
from examples.flask_app.app import create_app


def test_a_signup_request_queues_a_welcome_email_that_a_worker_sends(
    queue: Queue, tmp_path: Path
) -> None:
    app = create_app()  # connects to $HERMES_URL
    try:
        with running_worker("examples.flask_app.worker:handlers", queue, tmp_path) as worker:
            response = app.test_client().post(
                "/signup", json={"email": "bo@example.com", "name": "Bo"}
            )

            assert response.status_code == 202, response.text
            job = response.get_json()["queued"]
            sent = eventually(queue.outbox, "the worker to send the welcome email", WORKER_S)
            assert sent == [{"to": "bo@example.com", "subject": "Welcome, Bo!", "job": job}]
            assert worker.finished().endswith(
                "received 1, handled 1, failed 0, retried 0, gave up 0"
            )
    finally:
        app.extensions["hermes"].driver.close()
