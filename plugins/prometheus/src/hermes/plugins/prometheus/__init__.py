"""Prometheus metrics for Hermes workers.

Installed, it observes every Dispatcher of the process through Hermes's
plugin hooks. ``hermes worker --metrics-port 9100`` serves ``/metrics``; in
your own process, one line does::

    from hermes.plugins.prometheus import start_metrics_server

    start_metrics_server(9100, url="redis://localhost:6379/0")

The metrics (and ``prometheus_client``) are loaded when one of these names is
first used, never by installing the plugin: see the ``_plugin`` module for
when a worker counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    # The hooks module is what Hermes registers; it imports this package first, and
    # nothing here may import the client then.
    if name in __all__:
        from hermes.plugins.prometheus import _metrics

        return getattr(_metrics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
