"""The pluggy hooks of the OpenTelemetry plugin: a cheap check, then :mod:`._tracing`.

Registering the plugin imports no OpenTelemetry. A process can trace only
once the API is imported -- the application sets a TracerProvider, or
``opentelemetry-instrument`` runs it -- or the environment names a provider
(``OTEL_PYTHON_TRACER_PROVIDER``); a message whose headers may carry a trace
context from a traced emitter is passed on too. Until then every hook
returns at once, and an installed plugin costs a worker's start-up nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import ModuleType
from typing import TYPE_CHECKING

from hermes.core import Message, Outcome, hookimpl

if TYPE_CHECKING:  # annotations only: nothing more to import at registration
    from hermes.core.driver import Driver
    from hermes.core.jobs import JobRecord

_MODULE = "hermes.plugins.opentelemetry._tracing"
#: Where OpenTelemetry's API is once anything in the process has imported it.
_API = "opentelemetry.trace"
#: The environment names a TracerProvider, which the API loads on first use.
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _tracing(load: bool = False) -> ModuleType | None:
    """The tracing module if the process could trace (or ``load``), else None."""
    loaded = sys.modules.get(_MODULE)
    if loaded is not None:
        return loaded
    if not (load or _PROVIDER_FROM_ENV or _API in sys.modules):
        return None
    # Imported here, not at registration: OpenTelemetry costs start-up only where used.
    from hermes.plugins.opentelemetry import _tracing as tracing

    return tracing


#: The pending span is per context, not per thread (see ``_tracing``): a worker
#: may run these hooks for an ``async def`` handler's message on several threads.
hermes_async_safe = True


@hookimpl
def hermes_emit_call(
    message: Message, priority: int, driver: Driver
) -> AbstractContextManager[Mapping[str, str] | None] | None:
    tracing = _tracing()
    if tracing is None:
        return None
    return tracing.hermes_emit_call(message, priority, driver)  # type: ignore[no-any-return]


@hookimpl
def hermes_handler_call(
    message: Message, priority: int, handler: object, driver: Driver
) -> AbstractContextManager[None] | None:
    # Headers may hold a creation context to pass on, even with nothing traced here.
    tracing = _tracing(load=bool(message.headers))
    if tracing is None:
        return None
    return tracing.hermes_handler_call(message, priority, handler, driver)  # type: ignore[no-any-return]


# The outcome hooks: a span is pending only once the tracing module is loaded.


@hookimpl
def hermes_message_succeeded() -> None:
    if (tracing := sys.modules.get(_MODULE)) is not None:
        tracing.hermes_message_succeeded()


@hookimpl
def hermes_message_retried(retry: Message) -> None:
    if (tracing := sys.modules.get(_MODULE)) is not None:
        tracing.hermes_message_retried(retry)


@hookimpl
def hermes_message_gave_up(handler: object | None, reason: str, outcome: Outcome) -> None:
    if (tracing := sys.modules.get(_MODULE)) is not None:
        tracing.hermes_message_gave_up(handler, reason, outcome)


@hookimpl
def hermes_job_finished(record: JobRecord, message: Message | None) -> None:
    if (tracing := sys.modules.get(_MODULE)) is not None:
        tracing.hermes_job_finished(record, message)


@hookimpl
def hermes_message_finished() -> None:
    if (tracing := sys.modules.get(_MODULE)) is not None:
        tracing.hermes_message_finished()


@hookimpl
def hermes_process_exiting() -> None:
    if (tracing := _tracing()) is not None:
        tracing.hermes_process_exiting()
