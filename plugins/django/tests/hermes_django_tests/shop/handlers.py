"""Plain Hermes handlers, run beside the tasks by ``hermes_worker --handlers``."""

from __future__ import annotations

from hermes.core import HandlerRegistry, Message, Result

handlers = HandlerRegistry()


@handlers.handler("shop.ping")
def ping(message: Message) -> Result:
    return Result(f"pong {message.payload['n']}")
