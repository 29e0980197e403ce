"""From a cold start: ``hermes worker`` against Dramatiq and Celery, start-up included.

A section of ``python -m bench.run`` (``--only startup``). A backlog of I/O-bound
jobs (``bench.jobs``'s ``io``: a 20 ms sleep, then one Redis ``INCR``) waits on
Redis; each system's worker starts as a fresh process with 8 threads and drains
it. Measured from the moment the process is spawned:

* start-up: until the first handler call (imports, connections, logging set
  up, the broker's first answer);
* the rate users see from a cold start: the backlog over the time from the
  spawn to its last job, start-up included.

The systems run in turn, the first rotating per round, each row the median
of its rounds. Before the first round every installed module is compiled to
bytecode, as ``pip install`` does, so no system pays for compiling its own
source (the benchmark's environment may say ``PYTHONDONTWRITEBYTECODE``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.run import (
    ROOT,
    WORKER,
    Env,
    HermesSetting,
    Run,
    clean_peer_queue,
    fill,
    purge_and_close,
    wait_result,
    worker,
    worker_command,
)
from hermes.core import connect

#: Threads in every system: ``hermes worker --concurrency 8``, ``dramatiq --threads 8``,
#: ``celery worker --pool threads --concurrency 8``.
THREADS = 8
#: (system, how it runs): Celery without its start-up chatter (mingle, gossip,
#: heartbeats), its best setting for a quick start; Dramatiq at its defaults
#: but for the threads.
SYSTEMS = [
    (f"{WORKER} --concurrency {THREADS}", "hermes"),
    (f"dramatiq: 1 process x {THREADS} threads", "dramatiq"),
    (f"celery: {THREADS} threads", "celery"),
]
START_UP = "start-up to the first job"
COLD_RATE = "handle I/O job, start-up included"
NOTE = "sleep 20 ms + INCR"


def compile_bytecode() -> None:
    """Compile this environment's site-packages and the repository's sources, once."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    paths = [sysconfig.get_paths()["purelib"], str(ROOT / "bench")]
    paths += [str(p) for p in ROOT.glob("*/src")] + [str(p) for p in ROOT.glob("*/*/src")]
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", *paths],
        env=env,
        check=False,  # a module that does not compile (a test fixture) is not ours to time
        capture_output=True,
    )


def argv_for(system: str, url: str) -> list[str]:
    if system == "hermes":
        argv = [*worker_command(), "worker", "--url", url, "--handlers", "bench.jobs:register"]
        return [*argv, "--concurrency", str(THREADS)]
    if system == "dramatiq":
        argv = [sys.executable, "-m", "dramatiq", "bench.peer_dramatiq"]
        return [*argv, "--processes", "1", "--threads", str(THREADS)]
    return [
        sys.executable, "-m", "celery", "-A", "bench.peer_celery", "worker",
        "--loglevel=WARNING", "--pool=threads", f"--concurrency={THREADS}",
        "--without-mingle", "--without-gossip", "--without-heartbeat",
    ]  # fmt: skip


def one(env: Env, redis_url: str, system: str, n: int) -> dict[str, Any]:
    """Fill a fresh queue with ``n`` jobs, spawn ``system``'s worker; the times of its jobs."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    hermes_url = HermesSetting("").url(redis_url)
    with tempfile.TemporaryDirectory() as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "worker.log"
        extra = {"HERMES_BENCH_BROKER": redis_url, "HERMES_BENCH_QUEUE": queue}
        worker_env = env.make(n, out, "io", **extra)
        worker_env.pop("PYTHONDONTWRITEBYTECODE", None)
        driver = connect(hermes_url) if system == "hermes" else None
        try:
            if driver is not None:
                fill(driver, n)
                argv = [*argv_for(system, hermes_url), "--max-items", str(n)]
            else:
                emitted = subprocess.run(
                    [sys.executable, "-m", "bench.peer_emit", system],
                    env={**worker_env, "HERMES_BENCH_OUT": ""},
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                )
                if emitted.returncode != 0:
                    raise RuntimeError(f"{system} emit failed: {emitted.stderr.strip()[-500:]}")
                argv = argv_for(system, redis_url)
            spawned = time.time()
            with worker(argv, worker_env, log) as proc:
                result = wait_result(out, proc, 600, log)
            return {**result, "spawned": spawned}
        finally:
            if driver is not None:
                purge_and_close(driver)
            else:
                clean_peer_queue(redis_url, queue)


def measure(run: Run, env: Env, redis_url: str) -> None:
    """The start-up rows of ``run``: ``run.rounds`` rounds of every system."""
    n = 100 if run.quick else 2000
    compile_bytecode()
    for round_ in range(run.rounds):
        shift = round_ % len(SYSTEMS)
        for name, system in SYSTEMS[shift:] + SYSTEMS[:shift]:
            result = one(env, redis_url, system, n)
            first_ms = (result["first"] - result["spawned"]) * 1000
            run.add("redis", name, START_UP, first_ms, "ms", "spawn -> first handler call")
            rate = result["count"] / (result["last"] - result["spawned"])
            note = f"{n:,} x {NOTE}, {THREADS} threads, from the spawn"
            run.add("redis", name, COLD_RATE, rate, "msgs/s", note)
