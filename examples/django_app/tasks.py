"""The Django example's task: a receipt sent by ``python -m django hermes_worker``.

It reads the order from PostgreSQL, on the worker's own connection, which
``hermes_worker`` checks (``close_old_connections()``) around every job.

Sending mail is stood in for by the Redis list the other example worker uses
(``OUTBOX_KEY`` on ``OUTBOX_URL``), so the test can see what was sent.
"""

from __future__ import annotations

import json
import os

import redis

from examples.django_app.models import Order

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2, with the django-tasks backport
    from django_tasks import task

outbox = redis.Redis.from_url(os.environ.get("OUTBOX_URL", "redis://localhost:6379/0"))
OUTBOX_KEY = os.environ.get("OUTBOX_KEY", "examples:outbox")


@task
def send_receipt(order: int) -> dict[str, object]:
    """Mail the receipt of order ``order``, read from the database the view wrote it to."""
    row = Order.objects.get(number=order)
    if row.email.endswith(".invalid"):
        raise ValueError(f"no mail server takes {row.email}")
    outbox.rpush(OUTBOX_KEY, json.dumps({"to": row.email, "subject": f"Receipt for order {order}"}))
    return {"sent_to": row.email, "order": order}
