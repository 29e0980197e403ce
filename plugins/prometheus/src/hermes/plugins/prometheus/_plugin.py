"""The pluggy hooks that feed the metrics from a worker's Dispatcher."""

from __future__ import annotations

import os
import threading
import time

from hermes.core import Message, Outcome, hookimpl
from hermes.core.jobs import JobRecord
from hermes.plugins.prometheus import _metrics
from hermes.plugins.prometheus._ticks import hermes_tick  # noqa: F401 - a hook of this plugin

#: Per handler thread: when the running handler started (the last mark).
_marks = threading.local()


def _since_mark() -> float | None:
    started: float | None = getattr(_marks, "at", None)
    now = time.perf_counter()
    _marks.at = now
    return None if started is None else now - started


@hookimpl
def hermes_message_started(message: Message, priority: int) -> None:
    _metrics.RECEIVED.labels(message.type).inc()
    _metrics.IN_FLIGHT.inc()
    _marks.at = time.perf_counter()


@hookimpl
def hermes_message_succeeded(message: Message) -> None:
    elapsed = _since_mark()
    if elapsed is not None:
        _metrics.DURATION.labels(message.type).observe(elapsed)
    _metrics.HANDLED.labels(message.type).inc()


@hookimpl
def hermes_message_failed(message: Message, exception: BaseException) -> None:
    elapsed = _since_mark()
    if elapsed is not None:
        _metrics.DURATION.labels(message.type).observe(elapsed)
    _metrics.FAILED.labels(message.type, "raised").inc()


@hookimpl
def hermes_message_retried(message: Message) -> None:
    _metrics.RETRIED.labels(message.type).inc()


@hookimpl
def hermes_message_finished(message: Message) -> None:
    _marks.at = None
    _metrics.IN_FLIGHT.dec()


@hookimpl
def hermes_job_finished(record: JobRecord) -> None:
    _metrics.JOBS_FINISHED.labels(record.type, record.state.value).inc()


@hookimpl
def hermes_worker_metrics(port: int, url: str, host: str) -> str:
    return _metrics.start_metrics_server(port, url, addr=host)


@hookimpl
def hermes_worker_process_exited(pid: int) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        # Its counters stay in the pool's sums; its in-flight gauge must not.
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


@hookimpl
def hermes_message_gave_up(message: Message, outcome: Outcome) -> None:
    if outcome is Outcome.RETURNED_FALSE:
        elapsed = _since_mark()
        if elapsed is not None:
            _metrics.DURATION.labels(message.type).observe(elapsed)
        _metrics.FAILED.labels(message.type, "returned False").inc()
    _metrics.GAVE_UP.labels(message.type, _REASONS[outcome]).inc()


#: A short, bounded label per way of giving up (the full sentence is in the log).
_REASONS = {
    Outcome.NO_HANDLER: "no handler",
    Outcome.RETURNED_FALSE: "returned False",
    Outcome.GAVE_UP: "gave up",
    Outcome.NOT_RETRYABLE: "not retryable",
    Outcome.TIME_LIMIT: "time limit",
    Outcome.RETRIED: "other",
    Outcome.SUCCEEDED: "other",
    Outcome.CANCELLED: "other",
}
