"""OpenTelemetry tracing for Hermes.

Installed, it traces every Emitter and Dispatcher of the process through
Hermes's plugin hooks: ``send <queue>`` around each emit, which puts the W3C
trace context in the message's headers, and ``process <queue>`` around each
handler call, a child of that context. It uses the OpenTelemetry API only;
spans go wherever the application's TracerProvider sends them (nowhere until
one is set)::

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes.plugins.opentelemetry._tracing import destination, messaging_system

__all__ = ["destination", "messaging_system"]


def __getattr__(name: str) -> Any:
    # Registering the plugin imports this package: it must not import OpenTelemetry then.
    if name in __all__:
        from hermes.plugins.opentelemetry import _tracing

        return getattr(_tracing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
