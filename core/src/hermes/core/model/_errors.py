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
    │                           other than None, True, False or a Result
    ├── JobResultError          a job ended without a result (given up, cancelled,
    │   │                       expired, lost); ``record`` says how
    │   └── UnknownJobError     (also KeyError) the records store has no such job
    ├── JobTimeoutError         (also TimeoutError) a job's result did not come in time
    ├── JobCancelled            raised in a handler to stop the job it runs, which
    │                           was cancelled meanwhile (``current_job()``)
    └── DriverError             the broker or its client failed; ``__cause__`` is the
        │                       client's own exception
        ├── BrokerUnavailableError  the broker cannot be reached now: retried
        ├── BrokerRefusedError      the broker refused this client (credentials, a
        │                           missing database or vhost, a permission): not retried
        └── DeliveryError           the broker refused or lost a ``send()``

A driver declares which of its client library's exceptions mean what
(``Driver.refused_errors``, ``unavailable_errors``, ``client_errors``); core
translates them at the boundary and chains the client's exception as ``__cause__``.
"""

from __future__ import annotations


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


class BrokerRefusedError(DriverError):
    """The broker refused this client: credentials, a missing database or vhost, a permission.

    Trying again cannot help: a worker stops, and ``hermes`` exits 2.
    """


class DeliveryError(DriverError):
    """The broker did not take a message handed to ``send()``."""


def error_text(exc: BaseException) -> str:
    """``Type: text`` of a client's exception, or the type alone when it has no text.

    Notes added to it (``exc.add_note()``: what a driver knew when it failed) follow in brackets.
    """
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    notes = getattr(exc, "__notes__", None)
    if notes:
        text += f" ({'; '.join(map(str, notes))})"
    return text


class JobResultError(HermesError):
    """The job ended without a result: it failed for good, was cancelled, expired or was lost.

    :attr:`record` is the job's record (a ``JobRecord``); its ``error`` says why.
    """

    def __init__(self, text: str, record: object | None) -> None:
        super().__init__(text)
        #: The job's record (None: the store has none for that id).
        self.record = record


class UnknownJobError(JobResultError, KeyError):
    """The records store has no record of that id: emitted without records, or forgotten."""

    def __str__(self) -> str:  # KeyError's would quote the text
        return str(self.args[0])


class JobTimeoutError(HermesError, TimeoutError):
    """A job's result was waited for until the timeout, and the job had not ended."""


class JobCancelled(HermesError):
    """The job a handler runs was cancelled while it ran; the handler stops.

    Raised by ``current_job().raise_if_cancelled()`` in a handler, and in
    the worker thread when an ``async`` handler's task was cancelled. The
    Dispatcher records the job ``cancelled``: no retry, no failed-message store.
    """
