"""The Django example's jobs, run by a worker process:

    DJANGO_SETTINGS_MODULE=examples.django_app.settings \
        hermes worker --url redis://localhost:6379/0 --handlers examples.django_app.worker:handlers

Django is set up before the handlers are defined, so they may use the ORM.
Sending mail is stood in for by a Redis list (``OUTBOX_KEY`` on ``OUTBOX_URL``),
so the example runs without a mail server and its test can see what was sent.
"""

from __future__ import annotations

import json
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
django.setup()

import redis  # noqa: E402 - after django.setup(), as models would be

from hermes.core import HandlerRegistry, Message  # noqa: E402

handlers = HandlerRegistry()

outbox = redis.Redis.from_url(os.environ.get("OUTBOX_URL", "redis://localhost:6379/0"))
OUTBOX_KEY = os.environ.get("OUTBOX_KEY", "examples:outbox")


@handlers.handler("send-welcome", max_retry=5)  # a mail server that is down is tried again later
def send_welcome(message: Message) -> None:
    email = {
        "to": message.payload["email"],
        "subject": f"Welcome, {message.payload['name']}!",
        "job": message.id,
    }
    outbox.rpush(OUTBOX_KEY, json.dumps(email))
