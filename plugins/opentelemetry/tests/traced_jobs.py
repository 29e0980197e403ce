"""Handlers for a real ``hermes worker`` in the tests, with the OpenTelemetry SDK set up.

What an application's handlers module does, with a test's exporter: every
finished span is one JSON line in the file ``HERMES_TEST_SPANS`` names (no
``OTEL_*`` variables, no collector). Spans are written as they end, so the
file is complete when the worker exits (``HERMES_TEST_BATCH``: in batches,
written when the provider is flushed).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from hermes.core import Dispatcher, Message


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.lock, open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(as_dict(span)) + "\n")
        return SpanExportResult.SUCCESS


def as_dict(span: ReadableSpan) -> dict[str, object]:
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [event.name for event in span.events],
    }


provider = TracerProvider()
_exporter = JsonLinesExporter(os.environ["HERMES_TEST_SPANS"])
if os.environ.get("HERMES_TEST_BATCH"):
    # What most applications run: spans exported in batches, so some are held
    # until the process flushes them as it leaves.
    provider.add_span_processor(BatchSpanProcessor(_exporter, schedule_delay_millis=600_000))
else:
    provider.add_span_processor(SimpleSpanProcessor(_exporter))
trace.set_tracer_provider(provider)


def register(dispatcher: Dispatcher) -> None:
    # A retry copy due in a moment rather than in 16 s or more.
    dispatcher.next_retry = lambda message: time.time() + 0.2  # type: ignore[method-assign]

    @dispatcher.handler("signup")
    def signup(message: Message) -> None:
        pass

    @dispatcher.handler("flaky", max_retry=3)
    def flaky(message: Message) -> None:
        if message.retries == 0:
            raise ConnectionError("smtp down")
