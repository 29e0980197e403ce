"""Prometheus metrics for Hermes workers.

Installed, it observes every Dispatcher of the process through Hermes's
plugin hooks. ``hermes worker --metrics-port 9100`` serves ``/metrics``; in
your own process, one line does::

    from hermes.plugins.prometheus import start_metrics_server

    start_metrics_server(9100, url="redis://localhost:6379/0")
"""

from hermes.plugins.prometheus._metrics import (
    DURATION,
    FAILED,
    GAVE_UP,
    HANDLED,
    IN_FLIGHT,
    QUEUE_DEPTH,
    RECEIVED,
    RETRIED,
    sample_queue_depth,
    start_metrics_server,
)

__all__ = [
    "DURATION",
    "FAILED",
    "GAVE_UP",
    "HANDLED",
    "IN_FLIGHT",
    "QUEUE_DEPTH",
    "RECEIVED",
    "RETRIED",
    "sample_queue_depth",
    "start_metrics_server",
]
