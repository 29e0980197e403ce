"""Hermes driver for RabbitMQ: ``connect("amqp://guest:guest@localhost:5672/?queue=jobs")``.

Messages are acknowledged after the handler returns (at-least-once), queues
are durable and messages persistent by default, publishes are confirmed, and
a worker reconnects after a broker restart. ``delay=true`` makes
``execute_at`` hold a message back through TTL queues (no plugin needed).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes.drivers.rabbitmq._driver import LazyRabbitMqDriver

__all__ = ["LazyRabbitMqDriver"]

# Loading the plugin imports this package; pika is imported on first use of a
# name instead (PEP 562), so a process that never uses RabbitMQ skips it.
# Hidden from type checkers, which see the import above and still flag typos.
if not TYPE_CHECKING:
    _HOMES = {"LazyRabbitMqDriver": "hermes.drivers.rabbitmq._driver"}

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
