"""Hermes: background jobs that live in your process.

A web request :class:`Emitter`-emits a :class:`Message` to a broker and returns;
a worker's :class:`Dispatcher` takes messages from the broker and calls the
handlers registered for each message type. Brokers are reached through
:class:`Driver` plugins: ``connect("redis://localhost:6379/0")``.
"""

from typing import TYPE_CHECKING

from hermes.core._consumer import IDLE_WAIT_S, Backoff, Consumer, Received, current_received
from hermes.core._dispatcher import NOTICE, Dispatcher, DispatcherStats
from hermes.core._driver import (
    DEFAULT_PRIORITY,
    Callback,
    Capabilities,
    Delay,
    Delivery,
    Driver,
    QueueStats,
    SupportsBatchSend,
    SupportsClear,
    SupportsPurge,
    SupportsRawSend,
    SupportsStats,
)
from hermes.core._emitter import Emitter
from hermes.core._errors import (
    BrokerUnavailableError,
    ConfigurationError,
    DeliveryError,
    DriverError,
    HandlerResultError,
    HermesError,
    NotSupportedError,
    SerializeError,
    UnknownDriverError,
    UnknownPriorityError,
    translate_errors,
)
from hermes.core._handler import (
    EchoHandler,
    FunctionHandler,
    Handler,
    HandlerFunction,
    HandlerRegistry,
    RetryableFunctionHandler,
)
from hermes.core._invoke import TimeLimitExceeded
from hermes.core._lazy import lazy_exports
from hermes.core._memory import MemoryDriver
from hermes.core._message import Message
from hermes.core._process import PerProcess
from hermes.core._registry import (
    DriverPlugin,
    available_drivers,
    connect,
    hookimpl,
    isolated_url,
    plugin_manager,
)
from hermes.core._retry import RetryableHandler, RetryMixin
from hermes.core._serializer import MessageSerializer, Serializer
from hermes.core._shutdown import SHUTDOWN_CHECK_INTERVAL_S, SharedFileShutdown, Shutdown
from hermes.core._url import DriverUrl, redact_url

if TYPE_CHECKING:
    from hermes.core._failed import (
        FailedMessage,
        FailedMessageSerializer,
        FailedStore,
        QueueBrowser,
    )

__all__ = [
    "DEFAULT_PRIORITY",
    "IDLE_WAIT_S",
    "NOTICE",
    "SHUTDOWN_CHECK_INTERVAL_S",
    "Backoff",
    "BrokerUnavailableError",
    "Callback",
    "Capabilities",
    "ConfigurationError",
    "Consumer",
    "Delay",
    "Delivery",
    "DeliveryError",
    "Dispatcher",
    "DispatcherStats",
    "Driver",
    "DriverError",
    "DriverPlugin",
    "DriverUrl",
    "EchoHandler",
    "Emitter",
    "FailedMessage",
    "FailedMessageSerializer",
    "FailedStore",
    "FunctionHandler",
    "Handler",
    "HandlerFunction",
    "HandlerRegistry",
    "HandlerResultError",
    "HermesError",
    "MemoryDriver",
    "Message",
    "MessageSerializer",
    "NotSupportedError",
    "PerProcess",
    "QueueBrowser",
    "QueueStats",
    "Received",
    "RetryMixin",
    "RetryableFunctionHandler",
    "RetryableHandler",
    "SerializeError",
    "Serializer",
    "SharedFileShutdown",
    "Shutdown",
    "SupportsBatchSend",
    "SupportsClear",
    "SupportsPurge",
    "SupportsRawSend",
    "SupportsStats",
    "TimeLimitExceeded",
    "UnknownDriverError",
    "UnknownPriorityError",
    "available_drivers",
    "connect",
    "current_received",
    "hookimpl",
    "isolated_url",
    "lazy_exports",
    "plugin_manager",
    "redact_url",
    "translate_errors",
]

# The failed-message store is imported when first used: most processes never do.
if not TYPE_CHECKING:  # type checkers read the imports above
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            name: "._failed"
            for name in ("FailedMessage", "FailedMessageSerializer", "FailedStore", "QueueBrowser")
        },
    )
