"""The no-op job every system under test runs, and the counter that times it.

Each worker process counts the jobs it ran. When it reaches ``HERMES_BENCH_N``
it writes the time of the first and the last job (and, for latency runs, each
job's emit-to-start delay) as JSON to ``HERMES_BENCH_OUT``. Every system --
Hermes, Celery, RQ, Dramatiq -- runs this same function, so the cost of
counting is the same for all.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

_N = int(os.environ.get("HERMES_BENCH_N", "0"))
_OUT = os.environ.get("HERMES_BENCH_OUT", "")
_lock = threading.Lock()
_count = 0
_first = 0.0
_latencies: list[float] = []


def noop(sent: float | None = None) -> None:
    global _count, _first
    now = time.time()
    with _lock:
        _count += 1
        if _count == 1:
            _first = now
        if sent is not None:
            _latencies.append(now - sent)
        if _count == _N and _OUT:
            result = {"first": _first, "last": now, "count": _count, "latencies": _latencies}
            tmp = _OUT + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(result, fh)
            os.replace(tmp, _OUT)


class NoopHandler:
    """The Hermes handler: the same no-op job."""

    def handle(self, message: Any) -> bool:
        payload = message.payload
        noop(payload.get("sent") if isinstance(payload, dict) else None)
        return True
