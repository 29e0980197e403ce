"""The jobs every system under test runs, and the counter that times them.

``HERMES_BENCH_JOB`` picks the job, the same for Hermes, Celery, RQ and Dramatiq:

- ``noop``: nothing;
- ``incr``: one Redis ``INCR`` of ``HERMES_BENCH_INCR_KEY`` on a connection of
  the worker's own to ``HERMES_BENCH_REDIS`` (a tiny realistic job: one round
  trip to a service that is not the broker);
- ``sleep``: ``time.sleep(0.02)``, an I/O-bound job;
- ``io``: the 20 ms sleep, then the ``INCR``: an I/O-bound job that also
  talks to a service (the start-up rows of ``bench/startup.py``);
- ``cpu``: a pure-Python loop of ``CPU_ITERATIONS`` (about 5 ms on the
  benchmark machine), a CPU-bound job that threads cannot spread over cores.

Each worker process counts the jobs it ran. When it reaches ``HERMES_BENCH_N``
it writes the time of the first and the last job (and, for latency runs, each
job's emit-to-start delay) as JSON to ``HERMES_BENCH_OUT``. A worker that
forks a process per job (RQ's default) cannot count in memory: with
``HERMES_BENCH_TALLY`` set, each job appends its start time to that file
instead, and the benchmark counts the lines.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

#: How long the I/O-bound job waits.
SLEEP_S = 0.02
#: The CPU-bound job's loop: a fixed amount of work, the same for every system.
CPU_ITERATIONS = 40_000

_N = int(os.environ.get("HERMES_BENCH_N", "0"))
_OUT = os.environ.get("HERMES_BENCH_OUT", "")
_TALLY = os.environ.get("HERMES_BENCH_TALLY", "")
_lock = threading.Lock()
_count = 0
_first = 0.0
#: ``time.process_time()`` at the first job: CPU per message, which a busy shared
#: machine distorts far less than messages per second.
_first_cpu = 0.0
_latencies: list[float] = []


def _work_for(name: str) -> Callable[[], object]:
    if name == "noop":
        return lambda: None
    if name == "sleep":
        return lambda: time.sleep(SLEEP_S)
    if name == "cpu":
        return _compute
    if name in ("incr", "io"):
        import redis

        client = redis.Redis.from_url(os.environ["HERMES_BENCH_REDIS"])
        client.ping()  # connected before the first job, in every system alike
        key = os.environ["HERMES_BENCH_INCR_KEY"]
        if name == "io":
            return lambda: (time.sleep(SLEEP_S), client.incr(key))
        return lambda: client.incr(key)
    raise ValueError(f"HERMES_BENCH_JOB must be noop, incr, sleep, io or cpu, not {name!r}")


def _compute() -> int:
    total = 0
    for i in range(CPU_ITERATIONS):
        total += i * i % 7
    return total


_work = _work_for(os.environ.get("HERMES_BENCH_JOB", "noop"))


def job(sent: float | None = None) -> None:
    """Run the job, and count it (``sent``: when it was emitted, for latency runs)."""
    global _count, _first, _first_cpu
    now = time.time()
    _work()
    if _TALLY:
        with open(_TALLY, "a") as fh:  # one short append: atomic between processes
            fh.write(f"{now!r}\n")
        return
    with _lock:
        _count += 1
        if _count == 1:
            _first, _first_cpu = now, time.process_time()
        if sent is not None:
            _latencies.append(now - sent)
        if _count == _N and _OUT:
            result = {
                "first": _first,
                "last": now,
                "count": _count,
                "cpu_s": time.process_time() - _first_cpu,
                "latencies": _latencies,
            }
            tmp = _OUT + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(result, fh)
            os.replace(tmp, _OUT)


class BenchHandler:
    """The Hermes handler: the same job."""

    def handle(self, message: Any) -> bool:
        payload = message.payload
        job(payload.get("sent") if isinstance(payload, dict) else None)
        return True


def register(dispatcher: Any) -> None:
    """``hermes worker --handlers bench.jobs:register``."""
    dispatcher.register_handler("bench", BenchHandler())
