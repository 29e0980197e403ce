"""Core's helpers for a driver: what every driver would otherwise write for itself.

The contract a driver implements is in :mod:`hermes.core.driver`; this module
holds what core offers to implement it with, each written once for every
driver:

* URLs: :func:`isolated_url` (a namespace of its own, for tests) and
  :func:`redact_url`; TLS options read and checked from a URL
  (:class:`TlsOptions`) and a certificate the broker refused
  (:class:`CertificateRefusedError`).
* Consumers: owner ids (:func:`owner_id`) for what a worker holds on the
  broker, lease renewal (:class:`LeaseKeeper`), settles handed to the thread
  that owns a client (:class:`Handover`), batched acknowledgements
  (:class:`AckBatch`), clients made per process (:class:`PerProcess`) and the
  message being handled (:func:`current_received`).
* Bodies: :class:`Message`, its :class:`MessageSerializer` (a
  :class:`Serializer`) and :func:`outgoing`, which serializes one for
  :meth:`~hermes.core.driver.Driver.put`.
* Core's side of a driver: :class:`Door`, through which core calls one and
  translates its declared exceptions, and :func:`error_text` for log lines.
* Optional features: :func:`page_of` (one page of a listing),
  ``limit_state`` (the one way a limit's state is decided, for a store with
  :class:`~hermes.core.driver.SupportsLimits`) and
  :data:`SHUTDOWN_CHECK_INTERVAL_S` (how often a shutdown kept on a broker is
  looked at).
* The plugin registry (:func:`plugin_manager`), :func:`lazy_exports` for a
  driver package that imports its client only when used, and
  :class:`MemoryDriver`, the reference driver.

The errors a driver raises are those of :mod:`hermes.core`.
"""

from typing import TYPE_CHECKING

from hermes.core.model._errors import error_text
from hermes.core.model._message import Message
from hermes.core.model._serializer import MessageSerializer, Serializer
from hermes.core.spi import _limits as limit_state
from hermes.core.spi._browse import page_of
from hermes.core.spi._consumer import current_received
from hermes.core.spi._door import Door
from hermes.core.spi._lazy import lazy_exports
from hermes.core.spi._leases import AckBatch, Handover, LeaseKeeper
from hermes.core.spi._outgoing import outgoing
from hermes.core.spi._process import PerProcess, owner_id
from hermes.core.spi._registry import isolated_url, plugin_manager
from hermes.core.spi._shutdown import SHUTDOWN_CHECK_INTERVAL_S
from hermes.core.spi._tls import CertificateRefusedError, TlsOptions
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core.spi._memory import MemoryDriver

__all__ = [
    "SHUTDOWN_CHECK_INTERVAL_S",
    "AckBatch",
    "CertificateRefusedError",
    "Door",
    "Handover",
    "LeaseKeeper",
    "MemoryDriver",
    "Message",
    "MessageSerializer",
    "PerProcess",
    "Serializer",
    "TlsOptions",
    "current_received",
    "error_text",
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
    # Imported when first used: a worker on a real broker does not need it.
    __getattr__, __dir__ = lazy_exports(__name__, {"MemoryDriver": "hermes.core.spi._memory"})
