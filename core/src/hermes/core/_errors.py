"""Every error Hermes raises on purpose.

::

    HermesError
    ├── SerializeError          bytes on the broker that are not a Hermes message,
    │                           or a payload that cannot be encoded
    ├── ConfigurationError      (also ValueError) a bad URL, option or handler setup
    │   └── UnknownDriverError  no installed driver handles the URL's scheme
    ├── NotSupportedError       the driver has no such feature (e.g. priorities)
    ├── UnknownPriorityError    (also KeyError-free) a priority no queue was set up for
    ├── HandlerResultError      (also TypeError) a handler function returned something
    │                           other than None, True or False
    └── DriverError             the broker or its client failed; ``__cause__`` is the
        │                       client's own exception
        ├── BrokerUnavailableError  the broker cannot be reached
        └── DeliveryError           the broker refused or lost a ``send()``

Drivers translate their client library's exceptions into ``DriverError``
subclasses at their boundary with :func:`translate_errors`, which chains the
client's exception as ``__cause__``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class HermesError(Exception):
    """Base class of every error Hermes raises on purpose."""


class SerializeError(HermesError):
    """Data could not be turned into a :class:`Message`, or a message into data."""

    def __init__(self, text: str, data: str | bytes | None = None) -> None:
        super().__init__(text)
        #: The offending input, when there was one (never truncated here).
        self.data = data


class ConfigurationError(HermesError, ValueError):
    """A URL, option or registration that cannot work; the text says how to fix it."""


class UnknownDriverError(ConfigurationError):
    """No installed driver handles a URL scheme."""

    def __init__(self, text: str, scheme: str) -> None:
        super().__init__(text)
        #: The scheme nobody handles.
        self.scheme = scheme


class NotSupportedError(HermesError):
    """The driver does not offer this feature."""


class HandlerResultError(HermesError, TypeError):
    """A handler function returned something other than None, True or False.

    It is a mistake in the function, not a passing failure: a retried function
    is not retried for it.
    """


class UnknownPriorityError(HermesError):
    """A priority was used that no queue was set up for."""

    def __init__(self, text: str, priority: int) -> None:
        super().__init__(text)
        #: The priority that has no queue.
        self.priority = priority


class DriverError(HermesError):
    """The broker or its client library failed."""


class BrokerUnavailableError(DriverError):
    """The broker cannot be reached (refused, timed out, restarting)."""


class DeliveryError(DriverError):
    """The broker did not take a message handed to ``send()``."""


@contextlib.contextmanager
def translate_errors(
    doing: str,
    *,
    unavailable: tuple[type[BaseException], ...] = (),
    failed: type[DriverError] = DriverError,
    errors: tuple[type[BaseException], ...] = (Exception,),
) -> Iterator[None]:
    """Turn a client library's exceptions into Hermes errors, at the driver's boundary.

    Inside the block, an exception in ``unavailable`` becomes
    :class:`BrokerUnavailableError` (the worker reconnects with backoff), any
    other in ``errors`` becomes ``failed``; Hermes's own errors pass through.
    The message says what the driver was ``doing``; the client's exception is
    chained as ``__cause__``::

        with translate_errors(f"sending to {queue!r}", unavailable=(redis.ConnectionError,),
                              failed=DeliveryError, errors=(redis.RedisError,)):
            client.sadd(queue, body)
    """
    try:
        yield
    except HermesError:
        raise
    except unavailable as exc:
        raise BrokerUnavailableError(f"unavailable while {doing}: {_text(exc)}") from exc
    except errors as exc:
        raise failed(f"failed while {doing}: {_text(exc)}") from exc


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
