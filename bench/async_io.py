"""Async I/O jobs: ``hermes worker`` with ``async def`` handlers against arq.

    python -m bench.async_io [--quick] [--baseline REF] [--rounds R] [--out DIR]

Every row is measured in the same run, on the machine's Redis, each worker
one process started by this script, its start-up included (the rate is the
jobs over the time from the spawn to the end of the last job):

* async I/O at 1,000 in flight: 4,000 x bench.async_jobs's job (``await
  asyncio.sleep(0.5)`` then an ``INCR`` with ``redis.asyncio``) from a backlog
  on Redis, ``hermes worker --concurrency 1000`` against arq with
  ``max_jobs=1000`` (arq's own defaults otherwise, in an environment of its
  own: bench.envs ``arq-redis``). The ideal is 1,000 / 0.5 s = 2,000 jobs/s;
* async I/O at 100 in flight: 2,000 of the same job, ``--concurrency 100``
  and ``max_jobs=100`` (ideal 200 jobs/s);
* the footprint at 1,000 in flight: threads (``/proc/PID/task``) and RSS of
  the worker idle on an empty queue, then at their most while 4,000 jobs
  run at 1,000 in flight (sampled every 50 ms), for Hermes and arq;
* sync I/O, before and after: bench.jobs's ``io`` job (``time.sleep(0.02)`` +
  ``INCR``), 2,000 at ``--concurrency 8``, with this Hermes and with the
  ``hermes worker`` of ``--baseline REF`` (default: the tag ``known-good``),
  built from a ``git worktree`` as bench.records does. Skipped with
  ``--quick`` or without a baseline.

taskiq and saq are not measured: neither is in the bench's environments yet.
A full run measures this checkout's HEAD commit, built as the baseline is
(hermes-core and hermes-redis, editable from a worktree, in a virtual
environment of their own: no observer plugin, nothing uncommitted); with
``--quick``, this environment with the observer plugins blocked
(bench.hermes_cli). Every worker starts from bytecode, as an installed
package does: each Hermes environment is compiled first, as arq's is.
With Prometheus, OpenTelemetry or Sentry registered, as they stand, a
worker keeps a thread per message (see docs, Concurrency).

The rows take turns within each round; each figure is the median of its
rounds. A full run (3 rounds) writes ``bench/results/async-io.md`` and
``async-io.json``. ``--quick`` (200 jobs of 0.1 s at 100 in flight, one
round, no baseline) is a smoke run for CI; nothing here asserts a time, the
targets are reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import envs
from bench.records import previous_hermes, resolve_baseline
from bench.run import (
    ROOT,
    Env,
    load_average,
    machine,
    purge_and_close,
    wait_result,
    worker,
    worker_command,
)

sys.path.insert(0, str(ROOT / "tools"))
import services

from hermes.core import Emitter, Message, connect
from hermes.core.drivertools import isolated_url

HERMES = "hermes worker"
ARQ = "arq"
#: The stated targets (the issue's "done when").
AT_1000_JOBS_S = 1200.0
OVER_ARQ = 1.5
AT_100_OF_IDEAL = 0.9
RSS_GROWTH_MB = 50.0
SYNC_OVER_BASELINE = 0.97


@dataclass
class Setting:
    """One async row: jobs, in flight, each job's wait."""

    n: int
    in_flight: int
    sleep_s: float

    @property
    def ideal(self) -> float:
        return self.in_flight / self.sleep_s

    def label(self) -> str:
        return f"{self.n:,} x (await {self.sleep_s:g} s + INCR), {self.in_flight:,} in flight"


@dataclass
class Report:
    quick: bool
    rounds: int
    samples: dict[str, list[float]] = field(default_factory=dict)
    footprint: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    started: str = field(
        default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    )
    load_before: str = field(default_factory=load_average)

    def add(self, row: str, value: float) -> None:
        self.samples.setdefault(row, []).append(value)
        print(f"  {row}: {value:,.1f}", flush=True)

    def median(self, row: str) -> float | None:
        values = self.samples.get(row)
        return statistics.median(values) if values else None


def namespace(what: str) -> str:
    return f"bench-{what}-{uuid.uuid4().hex[:8]}"


class Sampler:
    """Threads and RSS of one process, every 50 ms, at their most."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.threads = 0
        self.rss_mb = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> tuple[int, float]:
        try:
            threads = len(os.listdir(f"/proc/{self.pid}/task"))
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return 0, 0.0
        rss = next(
            (int(x.split()[1]) / 1024 for x in status.splitlines() if x.startswith("VmRSS:")), 0.0
        )
        return threads, rss

    def _run(self) -> None:
        while not self._done.wait(0.05):
            threads, rss = self.sample()
            self.threads, self.rss_mb = max(self.threads, threads), max(self.rss_mb, rss)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


# The systems ------------------------------------------------------------------------


def hermes_fill(url: str, n: int, type_: str) -> None:
    driver = connect(url)
    try:
        emitter = Emitter(driver)
        batch = [Message(type_, {"i": i}) for i in range(n)]
        for i in range(0, n, 500):
            emitter.emit_batch(batch[i : i + 500])
    finally:
        driver.close()


def hermes_argv(command: list[str], url: str, handlers: str, concurrency: int, n: int) -> list[str]:
    return [
        *command, "worker", "--url", url, "--handlers", handlers,
        "--concurrency", str(concurrency), "--max-items", str(n),
    ]  # fmt: skip


def arq_fill(python: str, redis_url: str, queue: str, n: int) -> None:
    code = (
        "import asyncio, sys\n"
        "from arq import create_pool\n"
        "from arq.connections import RedisSettings\n"
        "async def main():\n"
        "    pool = await create_pool(RedisSettings.from_dsn(sys.argv[1]))\n"
        "    for i in range(int(sys.argv[3])):\n"
        "        await pool.enqueue_job('bench_job', _queue_name=sys.argv[2])\n"
        "    await pool.aclose()\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([python, "-c", code, redis_url, queue, str(n)], check=True)


def arq_clean(redis_url: str, queue: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = [queue, *client.scan_iter("arq:job:*", count=1000)]
    keys += list(client.scan_iter("arq:in-progress:*", count=1000))
    keys += list(client.scan_iter("arq:retry:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


def run_async(
    system: str,
    setting: Setting,
    env: Env,
    redis_url: str,
    arq_python: str | None,
    footprint: bool = False,
    hermes: list[str] | None = None,
) -> tuple[float, dict[str, float]]:
    """One drain: the rate from the spawn (or, with ``footprint``, from the emit into
    an idle worker) to the last job, and the worker's threads and RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "worker.log"
        extra = {"HERMES_BENCH_SLEEP_S": str(setting.sleep_s)}
        if system == HERMES:
            url = isolated_url(redis_url, namespace("async"))
            argv = hermes_argv(
                hermes or worker_command(),
                url,
                "bench.async_jobs:register",
                setting.in_flight,
                setting.n,
            )
            fill: Callable[[], None] = lambda: hermes_fill(url, setting.n, "bench-async")  # noqa: E731
            clean: Callable[[], None] = lambda: purge_and_close(connect(url))  # noqa: E731
        else:
            assert arq_python is not None
            queue = namespace("arq")
            arq = str(Path(arq_python).parent / "arq")
            argv = [arq, "bench.peer_arq.WorkerSettings"]
            extra |= {
                "HERMES_BENCH_BROKER": redis_url, "HERMES_BENCH_QUEUE": queue,
                "HERMES_BENCH_MAX_JOBS": str(setting.in_flight),
            }  # fmt: skip
            fill = lambda: arq_fill(arq_python, redis_url, queue, setting.n)  # noqa: E731
            clean = lambda: arq_clean(redis_url, queue)  # noqa: E731
        if not footprint:
            fill()
        try:
            began = time.time()
            process_env = envs.environ(env.make(setting.n, out, "async", **extra))
            with worker(argv, process_env, log) as proc:
                facts: dict[str, float] = {}
                if footprint:
                    time.sleep(3.0)  # started, connected, waiting on an empty queue
                    idle_threads, idle_rss = Sampler(proc.pid).sample()
                    facts = {"idle_threads": idle_threads, "idle_rss_mb": idle_rss}
                    began = time.time()
                    fill()
                with Sampler(proc.pid) as sampler:
                    result = wait_result(out, proc, 600, log)
                facts |= {"peak_threads": sampler.threads, "peak_rss_mb": sampler.rss_mb}
            return setting.n / (result["last"] - began), facts
        finally:
            clean()


def run_sync_io(command: list[str], env: Env, redis_url: str, n: int) -> float:
    """``n`` x (sleep 20 ms + INCR) at ``--concurrency 8``, from the spawn to the last job."""
    url = isolated_url(redis_url, namespace("sync-io"))
    hermes_fill(url, n, "bench")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out, log = Path(tmp) / "result.json", Path(tmp) / "worker.log"
            argv = hermes_argv(command, url, "bench.jobs:register", 8, n)
            began = time.time()
            with worker(argv, envs.environ(env.make(n, out, "io")), log) as proc:
                result = wait_result(out, proc, 600, log)
            return n / (result["last"] - began)
    finally:
        purge_and_close(connect(url))


def compile_bytecode(python: str) -> None:
    """Compile the environment of ``python`` and the Hermes it imports to bytecode.

    As an installed Hermes runs: pip compiles what it installs, and an editable
    checkout is compiled on its first import. arq's environment is compiled
    too (bench.envs); a worker started without bytecode would compile
    redis-py and Hermes again at each spawn, most of a second of start-up
    that a user never pays.
    """
    env = envs.environ(dict(os.environ))
    envs.compile_bytecode(python)
    where = subprocess.run(
        [python, "-c", "import hermes.core, hermes.drivers.redis as r; "
         "print(hermes.core.__path__[0]); print(r.__path__[0])"],
        capture_output=True, text=True, check=True, env=env,
    ).stdout.split()  # fmt: skip
    subprocess.run([python, "-m", "compileall", "-q", *where], capture_output=True, env=env)


# Report -----------------------------------------------------------------------------


#: "A few" threads: main, two receivers, the event loop, four settlers, the heartbeat,
#: and what a driver may add; nowhere near one per job in flight.
FEW_THREADS = 12


def targets(report: Report, big: Setting, small: Setting, baseline: str | None) -> list[str]:
    lines = []

    def row(what: str, value: float | None, wanted: str, ok: bool | None) -> None:
        said = "-" if value is None else f"{value:,.2f}"
        verdict = "not measured" if ok is None else ("met" if ok else "NOT met")
        lines.append(f"| {what} | {said} | {wanted} | {verdict} |")

    h_big, a_big = (
        report.median(f"{HERMES} | {big.label()}"),
        report.median(f"{ARQ} | {big.label()}"),
    )
    h_small = report.median(f"{HERMES} | {small.label()}")
    row("hermes at 1,000 in flight, jobs/s", h_big, f">= {AT_1000_JOBS_S:,.0f}",
        None if h_big is None else h_big >= AT_1000_JOBS_S)  # fmt: skip
    ratio = h_big / a_big if h_big and a_big else None
    row("hermes / arq at 1,000 in flight", ratio, f">= {OVER_ARQ}x",
        None if ratio is None else ratio >= OVER_ARQ)  # fmt: skip
    of_ideal = h_small / small.ideal if h_small else None
    row("hermes at 100 in flight / ideal", of_ideal, f">= {AT_100_OF_IDEAL}",
        None if of_ideal is None else of_ideal >= AT_100_OF_IDEAL)  # fmt: skip
    fp = report.footprint.get(HERMES)
    growth = fp["peak_rss_mb"] - fp["idle_rss_mb"] if fp else None
    row("hermes RSS growth at 1,000 in flight, MB", growth, f"<= {RSS_GROWTH_MB:g}",
        None if growth is None else growth <= RSS_GROWTH_MB)  # fmt: skip
    threads = fp["peak_threads"] if fp else None
    row("hermes threads at 1,000 in flight", threads, f"<= {FEW_THREADS} (a few)",
        None if threads is None else threads <= FEW_THREADS)  # fmt: skip
    if baseline is not None:
        now = report.median(f"{HERMES} | sync I/O")
        before = report.median(f"{HERMES}, previous Hermes ({baseline}) | sync I/O")
        ratio = now / before if now and before else None
        row("sync I/O, this Hermes / previous", ratio, f">= {SYNC_OVER_BASELINE}",
            None if ratio is None else ratio >= SYNC_OVER_BASELINE)  # fmt: skip
    return lines


def markdown(report: Report, big: Setting, small: Setting, baseline: str | None) -> str:
    head = (
        f"{machine()}; {report.started}; {report.rounds} round(s), the median of each row; "
        f"start-up included (spawn -> last job). Load average {report.load_before} -> "
        f"{load_average()} (the machine is shared).\n"
    )
    rows = ["| system | job | jobs/s | rounds |", "|---|---|---:|---|"]
    for key, values in report.samples.items():
        system, job = key.split(" | ", 1)
        rows.append(
            f"| {system} | {job} | {statistics.median(values):,.1f} | "
            + ", ".join(f"{v:,.0f}" for v in values) + " |"
        )  # fmt: skip
    fp = [
        "",
        "| system | idle threads | threads at 1,000 in flight "
        "| idle RSS MB | RSS MB at 1,000 in flight |",
        "|---|---:|---:|---:|---:|",
    ]
    for system, facts in report.footprint.items():
        fp.append(
            f"| {system} | {facts['idle_threads']:.0f} | {facts['peak_threads']:.0f} | "
            f"{facts['idle_rss_mb']:.1f} | {facts['peak_rss_mb']:.1f} |"
        )
    target_rows = ["", "| target | measured | wanted | |", "|---|---:|---|---|"]
    target_rows += targets(report, big, small, baseline)
    notes = ["", *[f"- {note}" for note in report.notes]] if report.notes else []
    return "\n".join([head, *rows, *fp, *target_rows, *notes]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--baseline", default=None, help="the previous Hermes (git ref)")
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    quick = args.quick
    rounds = args.rounds or (1 if quick else 3)
    if quick:
        big, small = Setting(200, 100, 0.1), Setting(100, 20, 0.1)
    else:
        big, small = Setting(4000, 1000, 0.5), Setting(2000, 100, 0.5)
    report = Report(quick, rounds)
    redis_url = services.ensure_redis()
    env = Env(redis_url, f"bench-incr-{uuid.uuid4().hex[:8]}")
    print("== the arq environment", flush=True)
    arq_python: str | None
    try:
        arq_python = envs.python("arq-redis")
    except subprocess.CalledProcessError as exc:
        arq_python = None
        report.notes.append(f"arq could not be installed ({exc}): its rows are missing")
    baseline = None if quick else resolve_baseline(args.baseline)
    if not quick and baseline is None:
        report.notes.append("no baseline (--baseline REF or the tag known-good): no before row")
    with contextlib.ExitStack() as stack:
        previous = None
        # This Hermes: with --quick this environment (observers blocked); else the
        # checkout's HEAD built like the baseline (hermes-core and hermes-redis in a
        # virtual environment of their own, from a worktree), so the two sync rows
        # differ by the commit alone and nothing uncommitted is measured.
        hermes = worker_command()
        if quick:
            compile_bytecode(sys.executable)
        else:
            head = resolve_baseline("HEAD")
            assert head is not None
            print(f"== building this Hermes: HEAD ({head[1][:12]})", flush=True)
            python = stack.enter_context(previous_hermes(head[1]))
            compile_bytecode(python)
            hermes = [str(Path(python).parent / "hermes")]
            report.notes.append(f"this Hermes: HEAD, {head[1][:7]}, hermes-core and hermes-redis")
        if baseline is not None:
            print(
                f"== building the previous Hermes: {baseline[0]} ({baseline[1][:12]})", flush=True
            )
            python = stack.enter_context(previous_hermes(baseline[1]))
            compile_bytecode(python)
            previous = [str(Path(python).parent / "hermes")]
        said = baseline[1][:7] if baseline else None
        systems = [HERMES] + ([ARQ] if arq_python else [])
        for round_ in range(rounds):
            print(f"== round {round_ + 1} of {rounds}", flush=True)
            for system in systems[round_ % len(systems) :] + systems[: round_ % len(systems)]:
                for setting in (big, small):
                    value, _ = run_async(system, setting, env, redis_url, arq_python, hermes=hermes)
                    report.add(f"{system} | {setting.label()}", value)
            if previous is not None:
                pair = [(HERMES, hermes), (f"{HERMES}, previous Hermes ({said})", previous)]
                for name, command in pair[round_ % 2 :] + pair[: round_ % 2]:
                    n = 2000
                    report.add(f"{name} | sync I/O", run_sync_io(command, env, redis_url, n))
        print("== footprint", flush=True)
        for system in systems:
            _, facts = run_async(
                system, big, env, redis_url, arq_python, footprint=True, hermes=hermes
            )
            report.footprint[system] = facts
            print(f"  {system}: {facts}", flush=True)
    if previous is not None:
        report.notes.append(
            "sync I/O: 2,000 x (time.sleep(0.02) + INCR) at --concurrency 8, start-up included"
        )
    text = markdown(report, big, small, said)
    print(text)
    if not quick:
        out = Path(args.out)
        (out / "async-io.md").write_text("# Async I/O jobs: hermes worker and arq\n\n" + text)
        (out / "async-io.json").write_text(
            json.dumps(
                {
                    "started": report.started,
                    "rounds": rounds,
                    "samples": report.samples,
                    "footprint": report.footprint,
                    "baseline": baseline,
                    "targets": targets(report, big, small, said),
                    "notes": report.notes,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
