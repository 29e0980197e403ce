"""What a driver author needs: the Driver and Consumer contracts and core's helpers for them.

A driver is one distribution with one entry point in the group ``hermes``
whose plugin returns a :class:`DriverPlugin`. The driver implements only what
differs about its broker -- :meth:`Driver.put` (bodies core already
serialized) and :meth:`Driver.consumer` (take, acknowledge, release, reject)
-- and declares which of its client's exceptions mean what
(:attr:`Driver.refused_errors`, :attr:`~Driver.unavailable_errors`,
:attr:`~Driver.client_errors`). Core's :class:`~hermes.core.Worker` owns the
run. TLS options (:class:`TlsOptions`), a refused certificate
(:class:`CertificateRefusedError`), owner ids (:func:`owner_id`) and batched
acknowledgements (:class:`AckBatch`) are written here once for every driver.
``conformance/README.md`` ("Write a driver") walks through a whole one.
"""

from typing import TYPE_CHECKING

from hermes.core.model._errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    ConfigurationError,
    DeliveryError,
    DriverError,
    NotSupportedError,
    SerializeError,
    UnknownPriorityError,
    error_text,
)
from hermes.core.model._message import Message
from hermes.core.model._serializer import MessageSerializer, Serializer
from hermes.core.spi import _limits as limit_state
from hermes.core.spi._browse import BrowsePage, page_of
from hermes.core.spi._consumer import IDLE_WAIT_S, Consumer, Received, current_received
from hermes.core.spi._door import Door
from hermes.core.spi._driver import (
    DEFAULT_PRIORITY,
    Callback,
    Capabilities,
    Delay,
    Delivery,
    Driver,
    QueueStats,
    SupportsClaim,
    SupportsHeartbeats,
    SupportsPurge,
    SupportsRecordPages,
    SupportsRecords,
    SupportsRecordWatch,
    SupportsStats,
    SupportsTally,
    SupportsTeardown,
)
from hermes.core.spi._lazy import lazy_exports
from hermes.core.spi._leases import AckBatch, Handover, LeaseKeeper
from hermes.core.spi._limits import LimitRule, SupportsLimits, Take
from hermes.core.spi._outgoing import Outgoing, outgoing
from hermes.core.spi._process import PerProcess, owner_id
from hermes.core.spi._registry import DriverPlugin, hookimpl, isolated_url, plugin_manager
from hermes.core.spi._shutdown import SHUTDOWN_CHECK_INTERVAL_S
from hermes.core.spi._tls import CertificateRefusedError, TlsOptions
from hermes.core.spi._url import DriverUrl, redact_url

if TYPE_CHECKING:
    from hermes.core.app._failed import QueueBrowser
    from hermes.core.spi._memory import MemoryDriver

__all__ = [
    "DEFAULT_PRIORITY",
    "IDLE_WAIT_S",
    "SHUTDOWN_CHECK_INTERVAL_S",
    "AckBatch",
    "BrokerRefusedError",
    "BrokerUnavailableError",
    "BrowsePage",
    "Callback",
    "Capabilities",
    "CertificateRefusedError",
    "ConfigurationError",
    "Consumer",
    "Delay",
    "Delivery",
    "DeliveryError",
    "Door",
    "Driver",
    "DriverError",
    "DriverPlugin",
    "DriverUrl",
    "Handover",
    "LeaseKeeper",
    "LimitRule",
    "MemoryDriver",
    "Message",
    "MessageSerializer",
    "NotSupportedError",
    "Outgoing",
    "PerProcess",
    "QueueBrowser",
    "QueueStats",
    "Received",
    "SerializeError",
    "Serializer",
    "SupportsClaim",
    "SupportsHeartbeats",
    "SupportsLimits",
    "SupportsPurge",
    "SupportsRecordPages",
    "SupportsRecordWatch",
    "SupportsRecords",
    "SupportsStats",
    "SupportsTally",
    "SupportsTeardown",
    "Take",
    "TlsOptions",
    "UnknownPriorityError",
    "current_received",
    "error_text",
    "hookimpl",
    "isolated_url",
    "lazy_exports",
    "limit_state",
    "outgoing",
    "owner_id",
    "page_of",
    "plugin_manager",
    "redact_url",
]

if not TYPE_CHECKING:  # type checkers read the import above
    # Imported when first used: a worker on a real broker needs neither.
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "QueueBrowser": "hermes.core.app._failed",
            "MemoryDriver": "hermes.core.spi._memory",
        },
    )
