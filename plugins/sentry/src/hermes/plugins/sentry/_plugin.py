"""The pluggy hooks that report a failing handler to Sentry, once per failure.

Each handler call runs in a Sentry isolation scope of its own, which holds
the message's context; what the handler adds (breadcrumbs, tags) stays
there. The exception is reported when the Dispatcher has decided what
follows it -- a retry (level warning) or the end (level error) -- so the
event carries that outcome as a tag.

Until the application calls ``sentry_sdk.init`` (or after it with no DSN),
nothing would be sent: the hooks then open no scope at all.

Registering the plugin imports no Sentry SDK: ``sentry_sdk.init`` needs the
application to import it, so a process where it is not imported has nothing
to report to, and an installed plugin costs its start-up nothing.

Importing the plugin changes nothing outside it. Once a handler runs with
Sentry initialized, the plugin tells Sentry's logging integration to ignore
the ``hermes`` logger: the Dispatcher logs every handler failure at ERROR
with its traceback, which would make each one a second, context-free event
beside the plugin's own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from hermes.core import Message, Outcome, hookimpl

if TYPE_CHECKING:
    from sentry_sdk.scope import Scope

#: Per message (its context, on whichever thread its hooks run): the scope of
#: the handler call whose outcome is awaited, and the message context it holds.
_pending: ContextVar[tuple[Scope, dict[str, Any]] | None] = ContextVar(
    "hermes_sentry_pending", default=None
)

#: The pending call is per context, not per thread: a worker may run this
#: plugin's hooks for an ``async def`` handler's message on several threads.
hermes_async_safe = True


def _handler_name(handler: object) -> str:
    function = getattr(handler, "function", None)  # a FunctionHandler
    named = function if function is not None else type(handler)
    return f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', repr(named))}"


def message_context(message: Message, priority: int) -> dict[str, Any]:
    """The ``hermes_message`` context of an event: everything but the payload."""
    return {
        "type": message.type,
        "id": message.id,
        "retries": message.retries,
        "priority": priority,
        "created": message.created,
        "execute_at": message.execute_at,
        "headers": dict(message.headers),
    }


@hookimpl
def hermes_handler_call(
    message: Message, priority: int, handler: object
) -> AbstractContextManager[None] | None:
    if not _initialized():
        _pending.set(None)
        return None  # no init(), or one without a DSN: nothing would be sent
    # The plugin reports handler failures itself, with the message: the
    # Dispatcher's ERROR line about the same failure must not be a second event.
    _ignore_for_events("hermes")
    return _call(message, priority, handler)


def _ignore_for_events(name: str) -> None:
    """Tell Sentry's logging integration to make no event of logger ``name``'s lines.

    sentry-sdk 3 split the call: ``ignore_logger`` there only stops Sentry Logs,
    ``ignore_logger_for_events`` stops events and breadcrumbs (what sentry-sdk 2's
    ``ignore_logger`` did). The lines stay Sentry Logs when the application
    enables those.
    """
    from sentry_sdk.integrations import logging as sentry_logging

    ignore = getattr(sentry_logging, "ignore_logger_for_events", None)  # sentry-sdk 3
    (ignore or sentry_logging.ignore_logger)(name)


def _initialized() -> bool:
    """Whether ``sentry_sdk.init`` was called with a DSN in this process."""
    # Not imported: nobody called init(). Imported here it would cost every worker.
    sdk = sys.modules.get("sentry_sdk")
    return sdk is not None and sdk.get_client().transport is not None


@contextmanager
def _call(message: Message, priority: int, handler: object) -> Iterator[None]:
    import sentry_sdk  # imported by the application already: _initialized() said so

    _pending.set(None)
    context = message_context(message, priority)
    with sentry_sdk.isolation_scope() as scope:
        scope.set_context("hermes_message", context)
        scope.set_tag("hermes.message.type", message.type)
        scope.set_tag("hermes.handler", _handler_name(handler))
        try:
            yield
        finally:
            # Kept for the outcome hooks, which run after this exit.
            _pending.set((scope, context))


def _report(
    outcome: str, level: str, exception: BaseException | None, text: str, **extra: Any
) -> None:
    call = _pending.get()
    _pending.set(None)
    if call is None:
        return  # no handler call of ours (no handler for the type)
    import sentry_sdk  # a pending call means the application imported it
    from sentry_sdk.scope import use_isolation_scope

    scope, context = call
    with use_isolation_scope(scope), sentry_sdk.new_scope() as event_scope:
        event_scope.set_level(level)  # type: ignore[arg-type]
        event_scope.set_tag("hermes.outcome", outcome)
        event_scope.set_context("hermes_message", {**context, **extra})
        if exception is not None:
            sentry_sdk.capture_exception(exception)
        else:
            sentry_sdk.capture_message(text)


@hookimpl
def hermes_message_retried(retry: Message, handler: object, exception: BaseException) -> None:
    _report(
        Outcome.RETRIED.value,
        "warning",
        exception,
        "",
        retry_retries=retry.retries,
        retry_execute_at=retry.execute_at,
    )


@hookimpl
def hermes_message_gave_up(
    handler: object | None, reason: str, exception: BaseException | None, outcome: Outcome
) -> None:
    if handler is None:
        return
    _report(
        outcome.value,
        "error",
        exception,
        f"Hermes handler {_handler_name(handler)} failed: {reason}",
        gave_up_reason=reason,
    )


@hookimpl
def hermes_message_succeeded() -> None:
    _pending.set(None)


@hookimpl
def hermes_message_finished() -> None:
    _pending.set(None)


#: The longest a leaving process waits for its events to be sent.
FLUSH_TIMEOUT_S = 5.0


@hookimpl
def hermes_process_exiting() -> None:
    # A pool's child leaves through os._exit: the SDK's atexit flush never runs there.
    if not _initialized():
        return  # no init(), or one without a DSN: nothing is held
    import sentry_sdk

    sentry_sdk.flush(timeout=FLUSH_TIMEOUT_S)
