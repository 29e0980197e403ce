"""Spans on the memory driver: a request, its emit and the handler calls in one trace."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from hermes.core import Dispatcher, Emitter, Message, connect
from hermes.core.driver import Driver
from hermes.core.jobs import Jobs, current_job
from hermes.core.spi._registry import notify, plugin_manager
from hermes.core.testing import drain, scheduled
from hermes.plugins.opentelemetry import _plugin, _tracing

_names = itertools.count()


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Spans of this test only: the plugin's tracer comes from a provider of the test's own.

    No global TracerProvider is set, so other tests in the run see no spans.
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(_tracing, "_tracer", provider.get_tracer("test"))
    return exporter


@pytest.fixture
def driver() -> Iterator[Driver]:
    driver = connect(f"memory://otel-{next(_names)}")
    yield driver
    driver.close()


def by_name(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    """The spans called ``name``; ``memory`` stands for the test's queue (its broker's name)."""
    return [
        span
        for span in exporter.get_finished_spans()
        if span.name.removesuffix(
            " " + str(span.attributes and span.attributes.get("messaging.destination.name"))
        )
        + " memory"
        == name
        or span.name == name
    ]


def in_a_request(message: Message, driver: Driver) -> ReadableSpan:
    """Emit ``message`` inside a span standing for a web request; that span."""
    with _tracing._tracer.start_as_current_span("GET /signup") as request:
        Emitter(driver).emit(message)
    assert isinstance(request, ReadableSpan)
    return request


def test_an_emit_is_a_producer_span_whose_context_the_headers_carry(
    exporter: InMemorySpanExporter, driver: Driver
) -> None:
    request = in_a_request(Message("signup", {"user": 1}), driver)
    [send] = by_name(exporter, "send memory")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.context.span_id
    assert send.attributes is not None
    assert dict(send.attributes) | {"messaging.message.id": "x"} == {
        "messaging.system": "hermes.memory",
        "messaging.destination.name": driver.name,  # type: ignore[attr-defined]
        "messaging.operation.name": "send",
        "messaging.operation.type": "publish",
        "messaging.message.id": "x",
        "hermes.message.type": "signup",
        "hermes.message.retries": 0,
        "hermes.priority": 100,
    }
    dispatcher = Dispatcher(driver)
    got: list[Message] = []
    dispatcher.register_handler("signup", got.append)
    drain(dispatcher)
    trace_id = f"{send.context.trace_id:032x}"
    version, carried_trace, carried_span, _flags = got[0].headers["traceparent"].split("-")
    assert (version, carried_trace, carried_span) == (
        "00",
        trace_id,
        f"{send.context.span_id:016x}",
    )


def test_the_handler_call_is_a_consumer_span_child_of_and_linked_to_the_send(
    exporter: InMemorySpanExporter, driver: Driver
) -> None:
    request = in_a_request(Message("signup", {"user": 1}, id="job-1"), driver)
    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("signup", lambda message: None)
    drain(dispatcher)

    [send] = by_name(exporter, "send memory")
    [process] = by_name(exporter, "process memory")
    assert process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == request.context.trace_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    attributes = dict(process.attributes or {})
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.message.id"] == "job-1"
    assert attributes["hermes.outcome"] == "succeeded"
    assert attributes["hermes.handler"].endswith("<lambda>")


def test_spans_the_handler_opens_are_children_of_the_consumer_span(
    exporter: InMemorySpanExporter, driver: Driver
) -> None:
    in_a_request(Message("signup"), driver)
    dispatcher = Dispatcher(driver)

    def handle(message: Message) -> None:
        with _tracing._tracer.start_as_current_span("INSERT users"):
            pass

    dispatcher.register_handler("signup", handle)
    drain(dispatcher)
    [process] = by_name(exporter, "process memory")
    [insert] = by_name(exporter, "INSERT users")
    assert insert.parent is not None and insert.parent.span_id == process.context.span_id


def test_a_retried_run_is_in_the_same_trace_and_records_the_exception(
    exporter: InMemorySpanExporter, driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = in_a_request(Message("flaky"), driver)
    dispatcher = Dispatcher(driver)
    # Due at once, so that drain() runs the copy too.
    monkeypatch.setattr(dispatcher, "next_retry", lambda message: 0.0)

    @dispatcher.handler("flaky", max_retry=3)
    def flaky(message: Message) -> None:
        if message.retries == 0:
            raise ConnectionError("smtp down")

    drain(dispatcher)
    assert scheduled(driver) == []
    first, second = by_name(exporter, "process memory")
    assert {first.context.trace_id, second.context.trace_id} == {request.context.trace_id}
    assert first.parent == second.parent
    first_attributes = dict(first.attributes or {})
    assert (first_attributes["hermes.outcome"], first_attributes["hermes.retry.retries"]) == (
        "retried",
        1,
    )
    assert first.status.status_code is StatusCode.ERROR
    assert first_attributes["error.type"] == "builtins.ConnectionError"
    [event] = first.events
    assert event.name == "exception"
    assert dict(event.attributes or {})["exception.message"] == "smtp down"
    second_attributes = dict(second.attributes or {})
    assert (second_attributes["hermes.outcome"], second_attributes["hermes.message.retries"]) == (
        "succeeded",
        1,
    )
    assert second.status.status_code is StatusCode.UNSET


def test_a_give_up_and_a_false_return_are_errors_with_their_outcome(
    exporter: InMemorySpanExporter, driver: Driver
) -> None:
    Emitter(driver).emit(Message("broken"))
    Emitter(driver).emit(Message("refused"))
    dispatcher = Dispatcher(driver)

    @dispatcher.handler("broken", max_retry=0)
    def broken(message: Message) -> None:
        raise ValueError("bad data")

    dispatcher.register_handler("refused", lambda message: False)
    drain(dispatcher)
    outcomes = {
        dict(span.attributes or {})["hermes.message.type"]: span
        for span in by_name(exporter, "process memory")
    }
    assert dict(outcomes["broken"].attributes or {})["hermes.outcome"] == "gave_up"
    assert dict(outcomes["refused"].attributes or {})["hermes.outcome"] == "returned_false"
    for span in outcomes.values():
        assert span.status.status_code is StatusCode.ERROR
    # Emitted outside any request: each job's trace starts at its own send span.
    assert outcomes["broken"].context.trace_id != outcomes["refused"].context.trace_id


def test_with_job_records_the_handler_span_carries_the_job_s_final_state(
    exporter: InMemorySpanExporter, driver: Driver
) -> None:
    jobs = Jobs(connect(f"memory://otel-records-{next(_names)}"))
    for kind in ("ok", "broken", "stopped"):
        Emitter(driver, records=jobs).emit(Message(kind))
    dispatcher = Dispatcher(driver, records=jobs)
    dispatcher.register_handler("ok", lambda message: True)

    @dispatcher.handler("broken", max_retry=0)
    def broken(message: Message) -> None:
        raise ValueError("bad data")

    @dispatcher.handler("stopped", max_retry=5)
    def stopped(message: Message) -> None:
        jobs.cancel(message.id)  # a cancel arriving while it runs
        job = current_job()
        assert job is not None and job.cancelled.wait(10)
        job.raise_if_cancelled()

    drain(dispatcher)
    spans = {
        dict(span.attributes or {})["hermes.message.type"]: dict(span.attributes or {})
        for span in by_name(exporter, "process memory")
    }
    assert spans["ok"]["hermes.job.state"] == "succeeded"
    assert spans["ok"]["hermes.outcome"] == "succeeded"
    assert spans["broken"]["hermes.job.state"] == "given_up"
    assert spans["stopped"]["hermes.job.state"] == "cancelled"


def test_a_message_that_carries_a_trace_context_keeps_it_and_the_send_links_to_it(
    exporter: InMemorySpanExporter, driver: Driver
) -> None:
    theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    in_a_request(Message("signup", headers={"traceparent": theirs}), driver)
    [send] = by_name(exporter, "send memory")
    assert [f"{link.context.span_id:016x}" for link in send.links] == ["b7ad6b7169203331"]
    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("signup", lambda message: None)
    drain(dispatcher)
    [process] = by_name(exporter, "process memory")
    assert f"{process.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"


class _BrokenTracer:
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the exporter's disk is full")


def test_a_tracer_that_raises_is_logged_and_changes_nothing_about_the_job(
    driver: Driver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_tracing, "_tracer", _BrokenTracer())
    with caplog.at_level(logging.ERROR, "hermes"):
        Emitter(driver).emit(Message("flaky"))
        dispatcher = Dispatcher(driver)
        calls: list[int] = []

        @dispatcher.handler("flaky", max_retry=3)
        def flaky(message: Message) -> None:
            calls.append(message.retries)
            raise ConnectionError("smtp down")

        drain(dispatcher)
    assert calls == [0]
    [retry] = scheduled(driver)
    assert retry.retries == 1
    assert dispatcher.stats.retried == 1
    failures = [r.getMessage() for r in caplog.records if "raised in hermes_" in r.getMessage()]
    assert any("opentelemetry raised in hermes_emit_call" in text for text in failures)
    assert any("opentelemetry raised in hermes_handler_call" in text for text in failures)


def test_without_a_tracer_provider_nothing_is_added_to_the_headers(driver: Driver) -> None:
    # The plugin's own tracer, a ProxyTracer: no SDK set up in this process.
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    Emitter(driver).emit(Message("plain"))
    dispatcher = Dispatcher(driver)
    got: list[Message] = []
    dispatcher.register_handler("plain", got.append)
    drain(dispatcher)
    assert dict(got[0].headers) == {}


def test_without_a_tracer_provider_the_hooks_step_aside_unless_a_context_travels(
    driver: Driver,
) -> None:
    """Nothing could record a span: no work per emit or job, but a carried context still
    becomes current in the handler (its own instrumented calls pass it on)."""
    assert isinstance(_tracing._tracer, trace.ProxyTracer)
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    plain = Message("plain")
    assert _plugin.hermes_emit_call(message=plain, priority=100, driver=driver) is None
    handler = object()
    assert (
        _plugin.hermes_handler_call(message=plain, priority=100, handler=handler, driver=driver)
        is None
    )
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    carried = Message("traced", headers={"traceparent": parent})
    seen: list[str] = []
    manager = _plugin.hermes_handler_call(
        message=carried, priority=100, handler=handler, driver=driver
    )
    assert manager is not None
    with manager:
        seen.append(format(trace.get_current_span().get_span_context().trace_id, "032x"))
    _plugin.hermes_message_finished()
    assert seen == ["0af7651916cd43dd8448eb211c80319c"]


def test_a_process_exiting_flushes_the_spans_a_batch_processor_still_holds(
    driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    # Exports only when told to: a pool's child leaving through os._exit never runs
    # the SDK's exit-time flush, and without the hook these spans are gone.
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    monkeypatch.setattr(_tracing, "_tracer", provider.get_tracer("test"))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    try:
        in_a_request(Message("signup", {"user": 1}), driver)
        dispatcher = Dispatcher(driver)
        dispatcher.register_handler("signup", lambda message: None)
        drain(dispatcher)
        assert exporter.get_finished_spans() == ()

        notify(plugin_manager().hook.hermes_process_exiting)

        names = sorted(span.name.split()[0] for span in exporter.get_finished_spans())
        assert names == ["GET", "process", "send"]
    finally:
        provider.shutdown()


def test_a_process_exiting_without_a_tracer_provider_does_nothing() -> None:
    _plugin.hermes_process_exiting()  # the API's proxy provider has nothing to flush


def test_async_handlers_keep_the_worker_s_async_path_and_their_spans_their_own_parent(
    exporter: InMemorySpanExporter, driver: Driver
) -> None:
    """Twenty coroutines in flight at once, each with its consumer span, ended in order."""
    import asyncio
    import time

    from hermes.core import Worker
    from hermes.core.run._worker import handler_mix

    running = 0
    most = 0

    async def handle(message: Message) -> None:
        nonlocal running, most
        with _tracing._tracer.start_as_current_span(f"call {message.payload['n']}"):
            running += 1  # only the event loop's thread touches these
            most = max(most, running)
            deadline = time.monotonic() + 20
            while most < 20 and time.monotonic() < deadline:  # every one in flight at once
                await asyncio.sleep(0.01)
            running -= 1

    for n in range(20):
        in_a_request(Message("call", {"n": n}), driver)
    dispatcher = Dispatcher(driver)
    dispatcher.handler("call")(handle)
    assert handler_mix(dispatcher) == "async", "the plugin keeps the async path"
    Worker(driver, dispatcher, handle_signals=False, concurrency=20, max_items=20).run()

    assert most == 20, "the coroutines ran at once"
    processes = {span.context.span_id: span for span in by_name(exporter, "process memory")}
    assert len(processes) == 20
    for n in range(20):
        [call] = by_name(exporter, f"call {n}")
        assert call.parent is not None and call.parent.span_id in processes
        parent = processes[call.parent.span_id]
        assert parent.attributes is not None and parent.attributes["hermes.outcome"] == "succeeded"
    assert len({span.parent.span_id for span in processes.values() if span.parent}) == 20
