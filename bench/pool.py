"""A CPU-bound job across worker processes: ``hermes worker --processes 2`` against 1, and peers.

    python -m bench.pool [--quick] [-n N] [--rounds R]

The job (``bench/jobs.py``, ``cpu``) is a pure-Python loop of about 5 ms:
threads cannot spread it over cores, processes can. Every system drains the
same number of jobs from the same Redis, two worker processes with one job
at a time each: ``hermes worker --processes 2``, ``dramatiq -p 2 -t 1``,
``celery worker`` prefork ``-c 2``; and ``hermes worker --processes 1`` for
the ratio. Each job appends its start time to a tally file (several processes
cannot count in one memory), and a row's rate is jobs between the first and
the last start, so start-up is not counted; each row is the median of its
rounds, the systems taking turns. The full run writes bench/results/pool.md.
Nothing here asserts a time: ``--quick`` proves every row can be measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench.run import (
    _NO_CHATTER,
    ROOT,
    Env,
    clean_peer_queue,
    fill,
    hermes_command,
    load_average,
    machine,
    purge_and_close,
    rate,
    services,
    wait_tally,
    worker,
)
from hermes.core import connect
from hermes.core.drivertools import isolated_url

HERMES_1 = "hermes worker --processes 1"
HERMES_2 = "hermes worker --processes 2"
DRAMATIQ = "dramatiq -p 2 -t 1"
CELERY = "celery prefork -c 2"
SYSTEMS = (HERMES_1, HERMES_2, DRAMATIQ, CELERY)


def hermes_row(env: Env, redis_url: str, n: int, processes: int) -> float:
    url = isolated_url(redis_url, f"bench-pool-{uuid.uuid4().hex[:8]}")
    driver = connect(url)
    try:
        fill(driver, n)
        with tempfile.TemporaryDirectory() as tmp:
            tally, log = Path(tmp) / "tally", Path(tmp) / "worker.log"
            argv = [*hermes_command(), "worker", "--url", url]
            argv += ["--handlers", "bench.jobs:register", "--processes", str(processes)]
            worker_env = env.make(n, Path(tmp) / "unused", "cpu", HERMES_BENCH_TALLY=str(tally))
            with worker(argv, worker_env, log) as proc:
                return rate(wait_tally(tally, n, proc, 600))
    finally:
        purge_and_close(driver)


def peer_row(env: Env, redis_url: str, n: int, system: str) -> float:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    peer = "dramatiq" if system == DRAMATIQ else "celery"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tally, log = Path(tmp) / "tally", Path(tmp) / "worker.log"
            worker_env = env.make(
                n,
                Path(tmp) / "unused",
                "cpu",
                HERMES_BENCH_BROKER=redis_url,
                HERMES_BENCH_QUEUE=queue,
                HERMES_BENCH_TALLY=str(tally),
            )
            subprocess.run(
                [sys.executable, "-m", "bench.peer_emit", peer],
                env={**worker_env, "HERMES_BENCH_TALLY": ""},
                capture_output=True,
                check=True,
                cwd=ROOT,
            )
            if peer == "dramatiq":
                argv = [sys.executable, "-m", "dramatiq", "bench.peer_dramatiq"]
                argv += ["--processes", "2", "--threads", "1"]
            else:
                argv = [sys.executable, "-m", "celery", "-A", "bench.peer_celery", "worker"]
                argv += ["-Q", queue, "-n", f"{queue}@%h", "--loglevel=WARNING"]
                argv += ["--pool=prefork", "--concurrency=2"]
                argv += list(_NO_CHATTER)
            with worker(argv, worker_env, log) as proc:
                return rate(wait_tally(tally, n, proc, 600))
    finally:
        clean_peer_queue(redis_url, queue)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("-n", type=int, default=0, help="jobs per row")
    parser.add_argument("--rounds", type=int, default=0)
    args = parser.parse_args()
    n = args.n or (200 if args.quick else 2_000)
    rounds = args.rounds or (1 if args.quick else 3)
    redis_url = services.ensure_redis()
    env = Env(redis_url, f"bench-incr-{uuid.uuid4().hex[:8]}")
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load = [load_average()]
    rows: dict[str, Callable[[], float]] = {
        HERMES_1: lambda: hermes_row(env, redis_url, n, 1),
        HERMES_2: lambda: hermes_row(env, redis_url, n, 2),
        DRAMATIQ: lambda: peer_row(env, redis_url, n, DRAMATIQ),
        CELERY: lambda: peer_row(env, redis_url, n, CELERY),
    }
    samples: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    for _ in range(rounds):
        for system, measure in rows.items():
            value = measure()
            samples[system].append(value)
            print(f"  {system:<32} {value:>8,.1f} jobs/s", flush=True)
    load.append(load_average())
    median = {system: statistics.median(values) for system, values in samples.items()}
    ratio = median[HERMES_2] / median[HERMES_1]
    lines = [
        f"| system (2 worker processes, 1 job at a time each) | CPU-bound jobs/s | vs {HERMES_1} |",
        "|---|---:|---:|",
    ]
    for system in SYSTEMS:
        lines.append(
            f"| {system} | {median[system]:,.1f} | {median[system] / median[HERMES_1]:.2f}x |"
        )
    table = "\n".join(lines)
    print()
    print(table)
    print(f"\n{HERMES_2} / {HERMES_1} = {ratio:.2f}x")
    if not args.quick:
        intro = (
            f"`python -m bench.pool` ({started}; {machine()}; load {load[0]} before, "
            f"{load[-1]} after): {n:,} CPU-bound jobs (a pure-Python loop of about 5 ms) "
            f"per row on Redis, median of {rounds} rounds, rate between the first and the "
            "last job's start.\n\n"
        )
        out = ROOT / "bench" / "results" / "pool.md"
        out.write_text(f"{intro}{table}\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
