"""Hermes: background jobs that live in your process.

A web request :class:`Emitter`-emits a :class:`Message` to a broker and returns;
a worker's :class:`Dispatcher` takes messages from the broker and calls the
handlers registered for each message type. Brokers are reached through
:class:`Driver` plugins: ``connect("redis://localhost:6379/0")``.
"""

from hermes.core._dispatcher import NOTICE, Dispatcher, DispatcherStats
from hermes.core._driver import (
    DEFAULT_PRIORITY,
    Callback,
    Capabilities,
    Delay,
    Delivery,
    Driver,
    SupportsBatchSend,
    SupportsPurge,
    SupportsRawSend,
)
from hermes.core._emitter import Emitter
from hermes.core._errors import (
    BrokerUnavailableError,
    ConfigurationError,
    DeliveryError,
    DriverError,
    HermesError,
    NotSupportedError,
    SerializeError,
    UnknownDriverError,
    UnknownPriorityError,
)
from hermes.core._handler import EchoHandler, Handler
from hermes.core._lazy import lazy_exports
from hermes.core._memory import MemoryDriver
from hermes.core._message import Message
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

__all__ = [
    "DEFAULT_PRIORITY",
    "NOTICE",
    "SHUTDOWN_CHECK_INTERVAL_S",
    "BrokerUnavailableError",
    "Callback",
    "Capabilities",
    "ConfigurationError",
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
    "Handler",
    "HermesError",
    "MemoryDriver",
    "Message",
    "MessageSerializer",
    "NotSupportedError",
    "RetryMixin",
    "RetryableHandler",
    "SerializeError",
    "Serializer",
    "SharedFileShutdown",
    "Shutdown",
    "SupportsBatchSend",
    "SupportsPurge",
    "SupportsRawSend",
    "UnknownDriverError",
    "UnknownPriorityError",
    "available_drivers",
    "connect",
    "hookimpl",
    "isolated_url",
    "lazy_exports",
    "plugin_manager",
    "redact_url",
]
