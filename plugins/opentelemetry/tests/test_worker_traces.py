"""A request, its emit, and a real ``hermes worker`` on Redis and RabbitMQ: one trace.

The test process emits inside a "request" span (spans in memory); the worker
is the ``hermes`` command with the handlers module ``traced_jobs``, which
sets up the SDK with a file exporter, as an application's module would. The
plugin is found through its entry point in both processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hermes.core import Emitter, Message, connect
from hermes.core.drivertools import isolated_url
from hermes.plugins.opentelemetry import _tracing

HERE = Path(__file__).parent


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(_tracing, "_tracer", provider.get_tracer("test"))
    return exporter


@pytest.fixture(params=["redis", "rabbitmq"])
def url(request: pytest.FixtureRequest) -> str:
    base = request.getfixturevalue("redis_url" if request.param == "redis" else "amqp_url")
    return isolated_url(base, f"otel-{uuid.uuid4().hex[:10]}")


def run_worker(url: str, spans: Path, max_items: int) -> list[dict[str, Any]]:
    env = dict(os.environ, HERMES_TEST_SPANS=str(spans))
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    hermes = str(Path(sys.executable).with_name("hermes"))
    command = [hermes, "worker", "--url", url, "--handlers", "traced_jobs:register"]
    done = subprocess.run(
        [*command, "--max-items", str(max_items)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in spans.read_text().splitlines()]


def emit_in_a_request(url: str, message: Message) -> str:
    """Emit ``message`` in a "request" span; the request's trace id."""
    driver = connect(url)
    try:
        with _tracing._tracer.start_as_current_span("POST /signup") as request:
            Emitter(driver).emit(message)
    finally:
        driver.close()
    context = request.get_span_context()
    return f"{context.trace_id:032x}"


def test_the_worker_s_consumer_span_is_in_the_request_s_trace(
    exporter: InMemorySpanExporter, url: str, tmp_path: Path
) -> None:
    message = Message("signup", {"user": 7})
    trace_id = emit_in_a_request(url, message)
    [send] = [span for span in exporter.get_finished_spans() if span.name.startswith("send ")]

    [process] = run_worker(url, tmp_path / "spans.jsonl", max_items=1)
    assert process["kind"] == "CONSUMER"
    assert process["name"] == f"process {send.attributes['messaging.destination.name']}"
    assert process["trace_id"] == trace_id
    assert process["parent_id"] == f"{send.context.span_id:016x}"
    assert process["links"] == [process["parent_id"]]
    attributes = process["attributes"]
    assert attributes["messaging.system"] == send.attributes["messaging.system"]
    assert attributes["messaging.system"] in ("redis", "rabbitmq")
    assert attributes["messaging.operation.name"] == "process"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.message.id"] == message.id
    assert (attributes["hermes.message.retries"], attributes["hermes.outcome"]) == (0, "succeeded")


def test_a_retried_message_s_second_run_is_in_the_same_trace(
    exporter: InMemorySpanExporter, url: str, tmp_path: Path
) -> None:
    trace_id = emit_in_a_request(url, Message("flaky"))
    first, second = run_worker(url, tmp_path / "spans.jsonl", max_items=2)
    assert (first["trace_id"], second["trace_id"]) == (trace_id, trace_id)
    assert first["parent_id"] == second["parent_id"]
    assert (first["attributes"]["hermes.outcome"], first["status"]) == ("retried", "ERROR")
    assert first["events"] == ["exception"]
    assert (second["attributes"]["hermes.message.retries"], second["status"]) == (1, "UNSET")
    assert second["attributes"]["hermes.outcome"] == "succeeded"


def test_a_pool_s_children_export_the_spans_a_batch_processor_held_when_they_leave(
    exporter: InMemorySpanExporter, url: str, tmp_path: Path
) -> None:
    ids = [Message("signup", {"user": n}) for n in range(4)]
    for message in ids:
        emit_in_a_request(url, message)
    spans = tmp_path / "spans.jsonl"
    env = dict(os.environ, HERMES_TEST_SPANS=str(spans), HERMES_TEST_BATCH="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    hermes = str(Path(sys.executable).with_name("hermes"))
    command = [hermes, "worker", "--url", url, "--handlers", "traced_jobs:register"]
    # Each child leaves (through os._exit) after one message: only a flush as it
    # leaves exports its span.
    pool = subprocess.Popen(
        [*command, "--processes", "2", "--max-jobs-per-child", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def exported() -> set[str]:
            text = spans.read_text() if spans.exists() else ""
            return {
                json.loads(line)["attributes"]["messaging.message.id"] for line in text.splitlines()
            }

        deadline = time.monotonic() + 60
        while exported() != {m.id for m in ids} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exported() == {m.id for m in ids}
    finally:
        pool.send_signal(signal.SIGTERM)
        _, err = pool.communicate(timeout=60)
    assert pool.returncode == 0, err
