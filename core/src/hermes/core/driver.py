"""The driver contract: what a driver author implements and declares.

A driver is one distribution with one entry point in the group ``hermes``
whose plugin (marked with :data:`hookimpl`) returns a :class:`DriverPlugin`:
a factory that builds the driver from a :class:`DriverUrl`, and the
:class:`Capabilities` it promises. The driver implements only what differs
about its broker -- :meth:`Driver.put` (the :class:`Outgoing` bodies core
already serialized) and :meth:`Driver.consumer` (a :class:`Consumer` that
takes, acknowledges, releases and rejects each :class:`Received`) -- and
declares which of its client's exceptions mean what
(:attr:`Driver.refused_errors`, :attr:`~Driver.unavailable_errors`,
:attr:`~Driver.client_errors`); the errors it raises are those of
:mod:`hermes.core`. Optional behaviour is a small protocol of its own
(``Supports*``, :class:`QueueBrowser`) with the types its methods take and
return. Core's :class:`~hermes.core.Worker` owns the run.

The helpers core offers a driver (TLS options, owner ids, leases, batched
acknowledgements, per-process clients, the memory driver) are in
:mod:`hermes.core.drivertools`. ``conformance/README.md`` ("Write a driver")
walks through a whole one.
"""

from typing import TYPE_CHECKING

from hermes.core.spi._browse import BrowsePage
from hermes.core.spi._consumer import IDLE_WAIT_S, Consumer, Received
from hermes.core.spi._driver import (
    DEFAULT_PRIORITY,
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
from hermes.core.spi._lazy import lazy_exports as _lazy_exports
from hermes.core.spi._limits import LimitRule, SupportsLimits, Take
from hermes.core.spi._outgoing import Outgoing
from hermes.core.spi._registry import DriverPlugin, hookimpl
from hermes.core.spi._url import DriverUrl

if TYPE_CHECKING:
    from hermes.core.app._failed import QueueBrowser

__all__ = [
    "DEFAULT_PRIORITY",
    "IDLE_WAIT_S",
    "BrowsePage",
    "Capabilities",
    "Consumer",
    "Delay",
    "Delivery",
    "Driver",
    "DriverPlugin",
    "DriverUrl",
    "LimitRule",
    "Outgoing",
    "QueueBrowser",
    "QueueStats",
    "Received",
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
    "hookimpl",
]

if not TYPE_CHECKING:  # type checkers read the import above
    # Imported when first used: a worker on a real broker does not browse its queues.
    __getattr__, __dir__ = _lazy_exports(__name__, {"QueueBrowser": "hermes.core.app._failed"})
