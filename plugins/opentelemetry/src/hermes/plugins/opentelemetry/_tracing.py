"""Tracing Hermes: a producer span per emit, a consumer span per handler call.

Spans follow the OpenTelemetry messaging semantic conventions: ``send
<queue>`` (PRODUCER, operation type ``publish``) around the broker send, whose
context is injected into the message headers as the creation context, and
``process <queue>`` (CONSUMER, operation type ``process``) around each handler
call. The consumer span is a child of that creation context, so a job shows
up in the trace of the request that emitted it, and it also links to it, as
the conventions ask of a process span. A retry copy keeps the headers: each
run of a job is a child of the same ``send`` span.

The consumer span stays open past the handler call until the Dispatcher is
done with the message (the next handler call, or the message finished), on
the same thread, so the handler's outcome (succeeded, retried, gave up) and,
with job records on, the job's final state (``hermes.job.state``:
succeeded, given_up, cancelled) are attributes of the span they belong to.

Installed in an application that never sets a TracerProvider (or disables
the SDK), nothing would record a span: the hooks then do nothing unless
there is a trace context to pass on (a current span of the emitting request,
headers on the message), so an untraced worker pays next to nothing per job.

The hooks (the ``_plugin`` module) import this module, and with it the
OpenTelemetry API, only once the process could trace; the functions here
are theirs, named after them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
from opentelemetry.trace import (
    Link,
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
)

from hermes.core import DEFAULT_PRIORITY, Message, Outcome
from hermes.core.driver import Driver
from hermes.core.jobs import JobRecord

# A ProxyTracer until the application sets a TracerProvider, then that one's:
# taking it at import is right even when the SDK is set up later.
_tracer = trace.get_tracer("hermes.plugins.opentelemetry")

#: Hermes driver names whose ``messaging.system`` has a well-known value of its own.
_SYSTEMS = {"sqs": "aws_sqs", "rabbitmq": "rabbitmq", "kafka": "kafka", "redis": "redis"}
_system_of: dict[type, str] = {}

#: Per message (its context, on whichever thread its hooks run): the consumer
#: span waiting for its handler's outcome.
_pending: ContextVar[Span | None] = ContextVar("hermes_otel_pending", default=None)
#: Set once this process has left a consumer span pending: until then the
#: outcome hooks, called for every message, have nothing to look up.
_any_pending = False
#: Stands for "the API has no ``_TRACER_PROVIDER``" (another version's layout).
_UNKNOWN = object()
#: The environment names a TracerProvider to load on first use.
_PROVIDER_FROM_ENV = OTEL_PYTHON_TRACER_PROVIDER in os.environ


def _recording() -> bool:
    """Whether a span started now could be recorded: a TracerProvider (the SDK's) is set.

    The module's tracer is a ProxyTracer that follows the global provider; one
    put in its place (a test's, an application's own) is taken to record.
    """
    if not isinstance(_tracer, trace.ProxyTracer):
        return True
    # Asked for every message: the global provider itself when the API keeps it
    # where it always has, since get_tracer_provider() looks up an environment
    # variable on each call until one is set (about a microsecond a message).
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None and not _PROVIDER_FROM_ENV:
        return False
    if provider is _UNKNOWN or provider is None:
        provider = trace.get_tracer_provider()  # loads one the environment names
    return not isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider))


def messaging_system(driver: Driver) -> str:
    """``messaging.system`` for ``driver``: the conventions' value, else ``hermes.<driver>``."""
    kind = type(driver)
    system = _system_of.get(kind)
    if system is None:
        parts = kind.__module__.split(".")
        if parts[:2] == ["hermes", "drivers"] and len(parts) > 2:
            name = parts[2]
        elif parts[:2] == ["hermes", "core"]:
            name = "memory"
        else:
            name = parts[0]
        system = _SYSTEMS.get(name, f"hermes.{name}")
        _system_of[kind] = system
    return system


def destination(driver: Driver, priority: int) -> str:
    """``messaging.destination.name``: the queue (set, topic) of ``priority`` on ``driver``.

    Drivers do not share an attribute for their queue names; the ones Hermes
    ships keep them as a ``priority -> name`` mapping (``_queues``, ``topics``)
    or one name (``key``, ``queue``, ``topic``; ``name`` for ``memory://``).
    Anything else is named by its priority.
    """
    for attribute in ("_queues", "topics"):
        names = getattr(driver, attribute, None)
        if isinstance(names, Mapping):
            name = names.get(priority)
            if isinstance(name, str) and name:
                return name
    if priority == DEFAULT_PRIORITY:
        for attribute in ("key", "queue", "topic", "name"):
            name = getattr(driver, attribute, None)
            if isinstance(name, str) and name:
                return name
    return f"hermes priority {priority}"


def _handler_name(handler: object) -> str:
    function = getattr(handler, "function", None)  # a FunctionHandler
    named = function if function is not None else type(handler)
    return f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', repr(named))}"


def _record_failure(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.set_attribute("error.type", f"{type(exc).__module__}.{type(exc).__qualname__}")


def _creation_context(headers: Mapping[str, str]) -> otel_context.Context | None:
    """The trace context the message carries, if it carries a valid one."""
    if not headers:
        return None
    context = propagate.extract(headers)
    if trace.get_current_span(context).get_span_context().is_valid:
        return context
    return None


def _attributes(message: Message, priority: int, driver: Driver, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": messaging_system(driver),
        "messaging.destination.name": destination(driver, priority),
        "messaging.operation.name": operation,
        "messaging.operation.type": "publish" if operation == "send" else operation,
        "messaging.message.id": message.id,
        "hermes.message.type": message.type,
        "hermes.message.retries": message.retries,
        "hermes.priority": priority,
    }


# Producer -------------------------------------------------------------------------


def hermes_emit_call(
    message: Message, priority: int, driver: Driver
) -> AbstractContextManager[Mapping[str, str] | None] | None:
    if not _recording() and not trace.get_current_span().get_span_context().is_valid:
        return None  # no span would be recorded and no context passed on
    return _send(message, priority, driver)


@contextmanager
def _send(message: Message, priority: int, driver: Driver) -> Iterator[Mapping[str, str] | None]:
    attributes = _attributes(message, priority, driver, "send")
    if message.execute_at is not None:
        attributes["hermes.message.execute_at"] = message.execute_at
    # A message that already carries a creation context (one re-emitted from
    # a handler, or traced by the application itself) keeps it, as the
    # conventions ask; the send span links to it instead.
    custom = _creation_context(message.headers)
    links = [Link(trace.get_current_span(custom).get_span_context())] if custom else None
    span = _tracer.start_span(
        f"send {attributes['messaging.destination.name']}",
        kind=SpanKind.PRODUCER,
        attributes=attributes,
        links=links,
    )
    headers: dict[str, str] = {}
    if custom is None:
        propagate.inject(headers, context=trace.set_span_in_context(span))
    try:
        yield headers or None
    except BaseException as exc:
        _record_failure(span, exc)
        raise
    finally:
        span.end()


# Consumer -------------------------------------------------------------------------


def hermes_handler_call(
    message: Message, priority: int, handler: object, driver: Driver
) -> AbstractContextManager[None] | None:
    if not message.headers and not _recording():
        return None  # no span would be recorded and no context passed on
    return _process(message, priority, handler, driver)


@contextmanager
def _process(message: Message, priority: int, handler: object, driver: Driver) -> Iterator[None]:
    global _any_pending
    _end_pending(None)  # one no outcome hook ended (the Dispatcher always sends one)
    attributes = _attributes(message, priority, driver, "process")
    attributes["hermes.handler"] = _handler_name(handler)
    creation = _creation_context(message.headers)
    links = [Link(trace.get_current_span(creation).get_span_context())] if creation else None
    span = _tracer.start_span(
        f"process {attributes['messaging.destination.name']}",
        # The parent: the job belongs to the trace of the request that emitted it.
        context=creation,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
    )
    # Current while the handler runs: its own spans (HTTP, SQL) are children.
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    except BaseException as exc:
        _record_failure(span, exc)
        raise
    finally:
        otel_context.detach(token)
        _any_pending = True
        _pending.set(span)


def _note(outcome: Outcome | None, **attributes: Any) -> Span | None:
    """Set ``outcome`` and ``attributes`` on the pending span, which stays open."""
    if not _any_pending:
        return None
    span = _pending.get()
    if span is None:
        return None
    if outcome is not None:
        span.set_attribute("hermes.outcome", outcome.value)
    for name, value in attributes.items():
        if value is not None:
            span.set_attribute(name, value)
    return span


def _end_pending(outcome: Outcome | None, **attributes: Any) -> Span | None:
    span = _note(outcome, **attributes)
    if span is not None:
        _pending.set(None)
        span.end()
    return span


def hermes_message_succeeded() -> None:
    _note(Outcome.SUCCEEDED)


def hermes_message_retried(retry: Message) -> None:
    _note(
        Outcome.RETRIED,
        **{"hermes.retry.retries": retry.retries, "hermes.retry.execute_at": retry.execute_at},
    )


def hermes_message_gave_up(handler: object | None, reason: str, outcome: Outcome) -> None:
    if handler is None:
        return  # no handler, so no handler call and no span
    span = _pending.get()
    if span is not None and outcome is Outcome.RETURNED_FALSE:
        span.set_status(Status(StatusCode.ERROR, "the handler returned False"))
        span.set_attribute("error.type", "returned_false")
    _note(outcome, **{"hermes.gave_up.reason": reason})


def hermes_job_finished(record: JobRecord, message: Message | None) -> None:
    if message is None:
        return  # lost, found by a sweep: its handler span died with its worker
    _note(None, **{"hermes.job.state": record.state.value})


def hermes_message_finished() -> None:
    # After every handler's outcome and the job's final state: the last span ends.
    _end_pending(None)


# Leaving -----------------------------------------------------------------------------

#: The longest a leaving process waits for its spans to be exported.
FLUSH_TIMEOUT_MS = 5000


def hermes_process_exiting() -> None:
    # A pool's child leaves through os._exit: the SDK's atexit shutdown, which
    # exports what a BatchSpanProcessor holds, never runs there.
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)  # the SDK's; the API's has none
    if callable(force_flush):
        force_flush(FLUSH_TIMEOUT_MS)
