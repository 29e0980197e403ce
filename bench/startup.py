"""From a cold start: ``hermes worker`` against Dramatiq and Celery, start-up included.

A section of ``python -m bench.run`` (``--only startup``). A backlog of I/O-bound
jobs (``bench.jobs``'s ``io``: a 20 ms sleep, then one Redis ``INCR``) waits on
Redis; each system's worker starts as a fresh process with 8 threads and drains
it. Measured from the moment the process is spawned:

* start-up: until the first handler call (imports, connections, logging set
  up, the broker's first answer);
* the rate users see from a cold start: the backlog over the time from the
  spawn to its last job, start-up included.

Each system runs from an environment holding what its users install and
nothing else (``bench/envs.py``): hermes-core and hermes-redis; ``dramatiq[redis]``;
``celery[redis]``, its modules compiled to bytecode as ``pip install`` does;
and Hermes once more with hermes-prometheus, hermes-opentelemetry,
hermes-sentry and hermes-dashboard installed beside it, none configured. Hermes
runs as the ``hermes`` console script of its environment. The systems run in
turn, the first rotating per round, each row the median of its rounds.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import envs
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
)
from hermes.core import connect

#: Threads in every system: ``hermes worker --concurrency 8``, ``dramatiq --threads 8``,
#: ``celery worker --pool threads --concurrency 8``.
THREADS = 8
#: (system, how it runs): Celery without its start-up chatter (mingle, gossip,
#: heartbeats), its best setting for a quick start; Dramatiq at its defaults
#: but for the threads.
#: The row of a worker with every plugin installed and none configured.
WITH_PLUGINS = f"{WORKER} --concurrency {THREADS}, 4 plugins installed"
SYSTEMS = [
    (f"{WORKER} --concurrency {THREADS}", "hermes"),
    (WITH_PLUGINS, "hermes-plugins"),
    (f"dramatiq: 1 process x {THREADS} threads", "dramatiq"),
    (f"celery: {THREADS} threads", "celery"),
]
START_UP = "start-up to the first job"
COLD_RATE = "handle I/O job, start-up included"
NOTE = "sleep 20 ms + INCR"


#: The environment each system runs from.
ENV_OF = {
    "hermes": "hermes-redis",
    "hermes-plugins": "hermes-redis-plugins",
    "dramatiq": "dramatiq-redis",
    "celery": "celery-redis",
}


def argv_for(system: str, url: str, python: str) -> list[str]:
    if system.startswith("hermes"):
        # The console script users run, in both rows: each environment holds the
        # plugins its row names, or none, so there is nothing for the bench's
        # launcher (bench.hermes_cli) to block, and its own imports are not a user's.
        hermes = str(Path(python).with_name("hermes"))
        argv = [hermes, "worker", "--url", url, "--handlers", "bench.jobs:register"]
        return [*argv, "--concurrency", str(THREADS)]
    if system == "dramatiq":
        argv = [python, "-m", "dramatiq", "bench.peer_dramatiq"]
        return [*argv, "--processes", "1", "--threads", str(THREADS)]
    return [
        python, "-m", "celery", "-A", "bench.peer_celery", "worker",
        "-n", f"bench-{uuid.uuid4().hex[:8]}@%h",  # not celery@HOST: another run may hold it
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
        worker_env = envs.environ(env.make(n, out, "io", **extra))
        python = envs.python(ENV_OF[system])
        driver = connect(hermes_url) if system.startswith("hermes") else None
        try:
            if driver is not None:
                fill(driver, n)
                argv = [*argv_for(system, hermes_url, python), "--max-items", str(n)]
            else:
                emitted = subprocess.run(
                    [python, "-m", "bench.peer_emit", system],
                    env={**worker_env, "HERMES_BENCH_OUT": ""},
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                )
                if emitted.returncode != 0:
                    raise RuntimeError(f"{system} emit failed: {emitted.stderr.strip()[-500:]}")
                argv = argv_for(system, redis_url, python)
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
    """The start-up rows of ``run``: three times ``run.rounds`` rounds of every system.

    Three times: a start-up lasts a fifth of a second, and the machine's noise is
    a large share of that.
    """
    n = 100 if run.quick else 2000
    for round_ in range(3 * run.rounds):
        shift = round_ % len(SYSTEMS)
        for name, system in SYSTEMS[shift:] + SYSTEMS[:shift]:
            result = one(env, redis_url, system, n)
            first_ms = (result["first"] - result["spawned"]) * 1000
            run.add("redis", name, START_UP, first_ms, "ms", "spawn -> first handler call")
            rate = result["count"] / (result["last"] - result["spawned"])
            note = f"{n:,} x {NOTE}, {THREADS} threads, from the spawn"
            run.add("redis", name, COLD_RATE, rate, "msgs/s", note)


def table(run: Run) -> str:
    """The start-up rows as a README table."""
    lines = [
        "| system (as installed alone) | spawn to first job | I/O job from a cold start |",
        "|---|---:|---:|",
    ]
    for name, _ in SYSTEMS:
        first = run.value("redis", name, START_UP)
        rate = run.value("redis", name, COLD_RATE)
        if first is None and rate is None:
            continue
        lines.append(
            f"| {name} | {'-' if first is None else f'{first:,.0f} ms'} "
            f"| {'-' if rate is None else f'{rate:,.0f} jobs/s'} |"
        )
    return "\n".join(lines)
