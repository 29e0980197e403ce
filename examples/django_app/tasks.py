"""The Django example's task: a receipt sent by ``python -m django hermes_worker``.

Sending mail is stood in for by the Redis list the other example worker uses
(``OUTBOX_KEY`` on ``OUTBOX_URL``), so the test can see what was sent.
"""

from __future__ import annotations

import json
import os

import redis

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2, with the django-tasks backport
    from django_tasks import task

outbox = redis.Redis.from_url(os.environ.get("OUTBOX_URL", "redis://localhost:6379/0"))
OUTBOX_KEY = os.environ.get("OUTBOX_KEY", "examples:outbox")


@task
def send_receipt(email: str, order: int) -> dict[str, object]:
    outbox.rpush(OUTBOX_KEY, json.dumps({"to": email, "subject": f"Receipt for order {order}"}))
    return {"sent_to": email, "order": order}
