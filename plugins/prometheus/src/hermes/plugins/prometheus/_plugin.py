"""The pluggy hooks that feed the metrics from a worker's Dispatcher.

Registering the plugin imports no Prometheus client: a worker that has it
installed and never serves or reads metrics starts as fast as one without
it. The hooks count once something in the process can read the counts:
``prometheus_client`` is imported (by the application's own ``/metrics``,
or by ``hermes worker --metrics-port``, whose server this plugin starts),
or a pool's children write them for the supervisor's server
(``PROMETHEUS_MULTIPROC_DIR``). An application that first imports
``prometheus_client`` after some jobs ran counts from then on.
"""

from __future__ import annotations

import os
import sys
import time
from contextvars import ContextVar
from types import ModuleType
from typing import TYPE_CHECKING

from hermes.core import Message, Outcome, hookimpl

if TYPE_CHECKING:  # annotations only: the scheduler's modules are not a worker's start-up
    from hermes.core.jobs import JobRecord
    from hermes.core.schedule import Entry, Tick

#: Per message (its context, on whichever thread its hooks run): when the
#: running handler started (the last mark), and whether its start was counted
#: (so in flight is decreased only if it was).
_mark_at: ContextVar[float | None] = ContextVar("hermes_prometheus_mark_at", default=None)
_counted: ContextVar[bool] = ContextVar("hermes_prometheus_counted", default=False)

#: The marks are per context, not per thread: a worker may run this plugin's
#: hooks for an ``async def`` handler's message on several threads.
hermes_async_safe = True


def metrics() -> ModuleType | None:
    """The metrics module once something can read the counts, else None (nothing is counted)."""
    loaded = sys.modules.get("hermes.plugins.prometheus._metrics")
    if loaded is not None:
        return loaded
    if "prometheus_client" not in sys.modules and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    # Imported here, not at registration: the client costs start-up only where it is used.
    from hermes.plugins.prometheus import _metrics

    return _metrics


def _since_mark() -> float | None:
    started = _mark_at.get()
    now = time.perf_counter()
    _mark_at.set(now)
    return None if started is None else now - started


@hookimpl
def hermes_message_started(message: Message, priority: int) -> None:
    counted = metrics()
    _counted.set(counted is not None)
    if counted is None:
        return
    counted.RECEIVED.labels(message.type).inc()
    counted.IN_FLIGHT.inc()
    _mark_at.set(time.perf_counter())


@hookimpl
def hermes_message_succeeded(message: Message) -> None:
    if (counted := metrics()) is None:
        return
    elapsed = _since_mark()
    if elapsed is not None:
        counted.DURATION.labels(message.type).observe(elapsed)
    counted.HANDLED.labels(message.type).inc()


@hookimpl
def hermes_message_failed(message: Message, exception: BaseException) -> None:
    if (counted := metrics()) is None:
        return
    elapsed = _since_mark()
    if elapsed is not None:
        counted.DURATION.labels(message.type).observe(elapsed)
    counted.FAILED.labels(message.type, "raised").inc()


@hookimpl
def hermes_message_retried(message: Message) -> None:
    if (counted := metrics()) is not None:
        counted.RETRIED.labels(message.type).inc()


@hookimpl
def hermes_message_deferred(message: Message) -> None:
    if (counted := metrics()) is not None:
        counted.DEFERRED.labels(message.type).inc()


@hookimpl
def hermes_message_finished(message: Message) -> None:
    _mark_at.set(None)
    if _counted.get() and (counted := metrics()) is not None:
        counted.IN_FLIGHT.dec()
    _counted.set(False)


@hookimpl
def hermes_job_finished(record: JobRecord) -> None:
    if (counted := metrics()) is not None:
        counted.JOBS_FINISHED.labels(record.type, record.state.value).inc()


@hookimpl
def hermes_tick(entry: Entry, tick: Tick, fired: bool) -> None:
    if (counted := metrics()) is not None:
        counted.TICKS.labels(entry.name, "fired" if fired else "skipped").inc()


@hookimpl
def hermes_worker_metrics(port: int, url: str, host: str) -> str:
    from hermes.plugins.prometheus import _metrics  # the server: the client is used now

    return _metrics.start_metrics_server(port, url, addr=host)


@hookimpl
def hermes_worker_process_exited(pid: int) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        # Its counters stay in the pool's sums; its in-flight gauge must not.
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


@hookimpl
def hermes_message_gave_up(message: Message, outcome: Outcome) -> None:
    if (counted := metrics()) is None:
        return
    if outcome is Outcome.RETURNED_FALSE:
        elapsed = _since_mark()
        if elapsed is not None:
            counted.DURATION.labels(message.type).observe(elapsed)
        counted.FAILED.labels(message.type, "returned False").inc()
    counted.GAVE_UP.labels(message.type, _REASONS[outcome]).inc()


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
