"""The FastAPI example's jobs, run by a worker process:

    hermes worker --url redis://localhost:6379/0 --handlers examples.fastapi_app.worker:handlers

Sending mail is stood in for by a Redis list (``OUTBOX_KEY`` on ``OUTBOX_URL``),
so the example runs without a mail server and its test can see what was sent.
"""

from __future__ import annotations

import json
import os

import redis

from hermes.core import HandlerRegistry, Message

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
