"""Hermes: background jobs that live in your process.

A web request :class:`Emitter`-emits a :class:`Message` to a broker and returns;
a :class:`Worker` takes messages from the broker and its :class:`Dispatcher`
calls the handlers registered for each message type. Brokers are reached
through driver plugins: ``connect("redis://localhost:6379/0")``. Driver
authors import the contract from :mod:`hermes.core.driver` and core's helpers
for it from :mod:`hermes.core.drivertools`.
"""

from typing import TYPE_CHECKING, Any

from hermes.core.app._dispatcher import Dispatcher, Outcome
from hermes.core.app._emitter import Emitter
from hermes.core.app._handler import (
    EchoHandler,
    Handler,
    HandlerRegistry,
    Result,
    RetryableHandler,
    RetryMixin,
)
from hermes.core.app._invoke import TimeLimitExceeded
from hermes.core.app._limits import Limit
from hermes.core.model._errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    ConfigurationError,
    DeliveryError,
    DriverError,
    HermesError,
    NotSupportedError,
    SerializeError,
    UnknownPriorityError,
)
from hermes.core.model._message import Message
from hermes.core.run._worker import Worker
from hermes.core.spi._driver import DEFAULT_PRIORITY
from hermes.core.spi._registry import available_drivers, connect, hookimpl
from hermes.core.spi._shutdown import SharedFileShutdown, Shutdown
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core.app._failed import ExceptionRecord as ExceptionRecord
    from hermes.core.app._failed import FailedMessage, FailedStore

__all__ = [
    "DEFAULT_PRIORITY",
    "BrokerRefusedError",
    "BrokerUnavailableError",
    "ConfigurationError",
    "DeliveryError",
    "Dispatcher",
    "DriverError",
    "EchoHandler",
    "Emitter",
    "FailedMessage",
    "FailedStore",
    "Handler",
    "HandlerRegistry",
    "HermesError",
    "Limit",
    "Message",
    "NotSupportedError",
    "Outcome",
    "Result",
    "RetryMixin",
    "RetryableHandler",
    "SerializeError",
    "SharedFileShutdown",
    "Shutdown",
    "TimeLimitExceeded",
    "UnknownPriorityError",
    "Worker",
    "available_drivers",
    "connect",
    "hookimpl",
    "redact_url",
]

#: Imported when first used: most processes never keep failed messages.
#: ``ExceptionRecord`` is what ``FailedMessage.exceptions`` holds: read, never
#: made by application code, so it stays out of ``__all__``.
_LAZY = {
    "ExceptionRecord": "hermes.core.app._failed",
    "FailedMessage": "hermes.core.app._failed",
    "FailedStore": "hermes.core.app._failed",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hermes.core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
