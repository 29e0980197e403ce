from __future__ import annotations

import json
from typing import Protocol, runtime_checkable

from hermes.core._message import Message
from hermes.core._retry import RetryableHandler, RetryMixin


@runtime_checkable
class Handler(Protocol):
    """Anything with ``handle(message) -> bool``.

    Raise to fail (a :class:`RetryableHandler` is then retried); returning
    False marks the message failed without a retry.
    """

    def handle(self, message: Message) -> bool: ...


class EchoHandler(RetryMixin, RetryableHandler):
    """Prints each message it receives; handy to see a queue work."""

    def handle(self, message: Message) -> bool:
        payload = json.dumps(message.payload, ensure_ascii=False, sort_keys=True)
        print(f"Received message: #{message.id} (type {message.type})", flush=True)
        print(f"Payload: {payload}", flush=True)
        return True
