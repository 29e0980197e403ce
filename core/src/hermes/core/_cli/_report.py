"""What a worker reports: its metrics server and its closing counts."""

from __future__ import annotations

import dataclasses
import errno
import logging
from typing import TYPE_CHECKING

from hermes.core._cli._common import (
    CliError,
)
from hermes.core.app._dispatcher import Dispatcher, DispatcherStats
from hermes.core.run._worker import Worker
from hermes.core.spi._registry import plugin_manager

if TYPE_CHECKING:
    pass


logger = logging.getLogger("hermes")


def counts(worker: Worker) -> dict[str, int]:
    """A child's counts for the pool's summary: the Dispatcher's and the Worker's."""
    counts = {"started": worker.stats.started, "processed": worker.stats.processed}
    if worker.dispatcher is not None:
        counts.update(dataclasses.asdict(worker.dispatcher.stats))
    return counts


def serve_metrics(port: int, url: str, host: str) -> None:
    try:
        served = plugin_manager().hook.hermes_worker_metrics(port=port, url=url, host=host)
    except OSError as exc:
        # Most often a second worker on the same port: separate workers need a port
        # each, a pool (--processes N) serves one for all of them.
        why = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
        raise CliError(
            f"--metrics-port {port}: cannot serve metrics there: {why}; give another port "
            "(each hermes worker needs its own; --processes N runs several on one)"
        ) from None
    if served is None:
        raise CliError("--metrics-port needs a metrics plugin: pip install hermes-prometheus")
    logger.info("Metrics on %s", served)


def summary(dispatcher: Dispatcher | DispatcherStats, elapsed_s: float) -> str:
    stats = dispatcher.stats if isinstance(dispatcher, Dispatcher) else dispatcher
    text = (
        f"Worker stopped after {elapsed_s:.1f} s: received {stats.received}, "
        f"handled {stats.handled}, failed {stats.failed}, retried {stats.retried}, "
        f"gave up {stats.gave_up}"
    )
    # Said only when they happened: most workers never see a cancel or an expiry.
    if stats.skipped:
        text += f", skipped {stats.skipped} (cancelled or expired before they started)"
    if stats.cancelled:
        text += f", cancelled {stats.cancelled} while running"
    if stats.deferred:
        text += f", deferred {stats.deferred} by their limit"
    if stats.stored or (isinstance(dispatcher, Dispatcher) and dispatcher.failed is not None):
        text += f" ({stats.stored} kept in the failed-message store)"
    return text
