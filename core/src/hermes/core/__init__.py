"""Hermes: background jobs that live in your process.

A web request :class:`Emitter`-emits a :class:`Message` to a broker and returns;
a :class:`Worker` takes messages from the broker and its :class:`Dispatcher`
calls the handlers registered for each message type. Brokers are reached
through driver plugins: ``connect("redis://localhost:6379/0")``. Driver
authors import from :mod:`hermes.core.driver`.
"""

import warnings
from typing import TYPE_CHECKING, Any

from hermes.core._dispatcher import Dispatcher, Outcome
from hermes.core._driver import DEFAULT_PRIORITY
from hermes.core._emitter import Emitter
from hermes.core._errors import (
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
from hermes.core._handler import EchoHandler, Handler, HandlerRegistry
from hermes.core._invoke import TimeLimitExceeded
from hermes.core._message import Message
from hermes.core._registry import available_drivers, connect, hookimpl
from hermes.core._retry import RetryableHandler, RetryMixin
from hermes.core._shutdown import SharedFileShutdown, Shutdown
from hermes.core._url import redact_url
from hermes.core._worker import Worker

if TYPE_CHECKING:
    from hermes.core._failed import FailedMessage, FailedStore

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
    "Message",
    "NotSupportedError",
    "Outcome",
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
_LAZY = {"FailedMessage": "hermes.core._failed", "FailedStore": "hermes.core._failed"}

#: Names that moved out of ``hermes.core``: where they live now.
_MOVED = {
    **dict.fromkeys(
        [
            "IDLE_WAIT_S",
            "SHUTDOWN_CHECK_INTERVAL_S",
            "Callback",
            "Capabilities",
            "Consumer",
            "Delay",
            "Delivery",
            "Driver",
            "DriverPlugin",
            "DriverUrl",
            "MessageSerializer",
            "PerProcess",
            "QueueBrowser",
            "QueueStats",
            "Received",
            "Serializer",
            "SupportsStats",
            "current_received",
            "isolated_url",
            "lazy_exports",
            "MemoryDriver",
            "SupportsPurge",
            "SupportsTeardown",
        ],
        "hermes.core.driver",
    ),
    **dict.fromkeys(
        ["FunctionHandler", "HandlerFunction", "RetryableFunctionHandler"], "hermes.core._handler"
    ),
    "DispatcherStats": "hermes.core._dispatcher",
    "NOTICE": "hermes.core._worker",
    "FailedMessageSerializer": "hermes.core._failed",
    "UnknownDriverError": "hermes.core._errors",
    "HandlerResultError": "hermes.core._errors",
    "plugin_manager": "hermes.core._registry",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'hermes.core' has no attribute {name!r}")
    public = home if not home.split(".")[-1].startswith("_") else "its own module"
    warnings.warn(
        f"hermes.core.{name} moved: import it from {public}"
        if public != "its own module"
        else f"hermes.core.{name} is internal and will go from hermes.core",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
