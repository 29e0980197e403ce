"""The metrics, and the HTTP server and queue-depth sampler behind ``/metrics``."""

from __future__ import annotations

import logging
import os
import threading
import time

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from hermes.core import connect, redact_url
from hermes.core.driver import SupportsStats
from hermes.core.drivertools import Door

logger = logging.getLogger("hermes.plugins.prometheus")

#: Seconds between two samples of the queue depth.
SAMPLE_INTERVAL_S = 5.0

RECEIVED = Counter("hermes_messages_received", "Messages a worker started handling.", ["type"])
HANDLED = Counter("hermes_messages_handled", "Handler calls that returned True.", ["type"])
FAILED = Counter(
    "hermes_messages_failed",
    "Handler calls that raised or returned False.",
    ["type", "reason"],
)
RETRIED = Counter("hermes_messages_retried", "Retry copies sent.", ["type"])
DEFERRED = Counter(
    "hermes_messages_deferred",
    "Jobs over their type's limit, sent again for their turn (not run, not retried).",
    ["type"],
)
GAVE_UP = Counter(
    "hermes_messages_gave_up", "Messages Hermes stopped retrying.", ["type", "reason"]
)
JOBS_FINISHED = Counter(
    "hermes_jobs_finished",
    "Jobs whose record reached a final state (needs job records: --results-url).",
    ["type", "state"],
)
TICKS = Counter(
    "hermes_ticks",
    "Periodic ticks settled by this process's scheduler: fired (emitted) or skipped "
    "(missed, left out by the entry's catch_up policy). Summed over every scheduler, "
    "each tick is counted once.",
    ["entry", "outcome"],
)
DURATION = Histogram(
    "hermes_handler_duration_seconds",
    "How long one handler took with one message.",
    ["type"],
)
IN_FLIGHT = Gauge(
    "hermes_messages_in_flight",
    "Messages whose handlers are running in this worker.",
    multiprocess_mode="livesum",
)
QUEUE_DEPTH = Gauge(
    "hermes_queue_messages",
    "What a priority queue holds, sampled from the broker; absent where it cannot say.",
    ["priority", "queue", "state"],
    multiprocess_mode="max",
)

_STATES = ("ready", "scheduled", "in_flight", "set_aside")


def sample_queue_depth(url: str) -> None:
    """Sample ``url``'s queue counts into :data:`QUEUE_DEPTH` once."""
    with connect(url) as driver:
        stats = Door(driver).feature(SupportsStats)
        if stats is None:
            return
        for row in stats.queue_stats():
            for state in _STATES:
                value = getattr(row, state)
                if value is not None:
                    QUEUE_DEPTH.labels(str(row.priority), row.name, state).set(value)


def _sample_once(url: str) -> None:
    try:
        sample_queue_depth(url)
    except Exception as exc:
        # A broker away for a moment: the gauges keep their last value until it is back.
        logger.warning("sampling the queue depth of %s failed - %s", redact_url(url), exc)


def _sample_forever(url: str) -> None:
    while True:
        time.sleep(SAMPLE_INTERVAL_S)
        _sample_once(url)


def start_metrics_server(port: int, url: str | None = None, addr: str = "127.0.0.1") -> str:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread; where it is served.

    With ``url``, the queue depth of that broker is sampled every
    :data:`SAMPLE_INTERVAL_S` on a connection of its own. With the environment
    variable ``PROMETHEUS_MULTIPROC_DIR`` set (prometheus_client's multiprocess
    mode), the server adds up every worker process's metrics from that directory:
    ``hermes worker --processes N --metrics-port P`` makes one for its pool and
    serves it from the supervisor.
    """
    registry: CollectorRegistry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    server, _ = start_http_server(port, addr=addr, registry=registry)
    # A process that forks after serving (an application's own pre-fork server):
    # each child closes its copy of the listening socket, so the port is free once
    # the server stops. (A hermes worker pool serves from a helper that never forks.)
    os.register_at_fork(after_in_child=server.socket.close)
    if url is not None:
        # The first sample is taken here, on the caller's thread: a broker that
        # cannot be sampled says so before the server counts as started, and the
        # driver modules it needs are imported before any thread of ours runs.
        _sample_once(url)
        threading.Thread(
            target=_sample_forever, args=(url,), name="hermes-queue-depth", daemon=True
        ).start()
    return f"http://{addr}:{port}/metrics"
