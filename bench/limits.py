"""Fleet-wide limits: a limited type held to its rate while an unlimited one keeps its speed.

    python -m bench.limits [--quick] [--rounds R] [--out DIR]

What users run: ``hermes worker --processes 4 --concurrency 8`` on a Redis
queue (the machine's Redis, a namespace of its own), with ``--limit
a:rate=50/s`` and ``--limits-url`` naming the limits store. Each job's handler
(:mod:`bench.limits_jobs`) pushes the time it started to a Redis list of its
type, which this process reads at the end.

* **B alone**: a backlog of ``N`` jobs of the unlimited type B. B's rate is
  its jobs over the time from its first start to its last.
* **A and B**: backlogs of ``N`` of each, the same worker. A's rate is its
  starts within the window (60 s) from its first start, over that window;
  B's rate as above. Each row starts from a warm pool: 200 jobs of a third
  type are handled before its backlog is emitted.

The pair runs with the limits store on Redis and on PostgreSQL (the queue on
Redis both times), each twice: with B interleaved with A's backlog, and with B
emitted once the worker took all of A's (each job of A deferred to its turn).
Every round runs every row; the targets are judged on the medians. The stated
targets, reported beside the figures and never enforced: A at 50/s ± 5% over
the window; B at least 0.9x its rate alone. A full run (``N`` 5,000, a 60 s
window, 3 rounds) writes ``bench/results/limits.md`` and ``limits.json``;
``--quick`` (500, 8 s) is a smoke run that proves every row can be measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.run import ROOT, load_average, machine, purge_and_close, worker, worker_command

sys.path.insert(0, str(ROOT / "tools"))
import redis
import services

from hermes.core import Emitter, Message, connect
from hermes.core.driver import Driver, SupportsStats, isolated_url

#: The limit A is held to, and the bounds stated for it.
RATE = 50.0
RATE_TOLERANCE = 0.05
B_OVER_ALONE = 0.9
PROCESSES = 4
CONCURRENCY = 8
#: Jobs the worker handles before a row's backlog is emitted: every process warm.
WARM_UP = 200


@dataclass
class Row:
    """One run of the worker over one backlog."""

    store: str
    #: B emitted once A's backlog was deferred (else interleaved with it).
    b_after: bool
    a_rate: float | None
    b_rate: float
    a_started: int
    b_started: int
    deferred: int


@dataclass
class Report:
    quick: bool
    n: int
    window_s: float
    started: str
    machine: str
    load: list[str] = field(default_factory=list)
    alone: list[float] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    def b_alone(self) -> float:
        return statistics.median(self.alone)

    def medians(self) -> dict[tuple[str, bool], tuple[float, float]]:
        """(store, B after) -> the median A and B rates of its rounds."""
        groups: dict[tuple[str, bool], list[Row]] = {}
        for row in self.rows:
            groups.setdefault((row.store, row.b_after), []).append(row)
        return {
            group: (
                statistics.median(r.a_rate or 0.0 for r in rows),
                statistics.median(r.b_rate for r in rows),
            )
            for group, rows in groups.items()
        }

    def targets(self) -> list[tuple[str, str, str, bool]]:
        found = []
        low, high = RATE * (1 - RATE_TOLERANCE), RATE * (1 + RATE_TOLERANCE)
        for (store, b_after), (a_rate, b_rate) in self.medians().items():
            when = "after the deferral" if b_after else "interleaved"
            found.append(
                (
                    f"A's rate, B {when}, limits on {store}",
                    f"{a_rate:.2f}/s",
                    f"{low:g}-{high:g}/s",
                    low <= a_rate <= high,
                )
            )
            ratio = b_rate / self.b_alone()
            found.append(
                (
                    f"B {when} / B alone, limits on {store}",
                    f"{ratio:.2f}x",
                    f">= {B_OVER_ALONE}x",
                    ratio >= B_OVER_ALONE,
                )
            )
        return found

    def markdown(self) -> str:
        lines = [
            "# Limits: a type held to 50/s beside an unlimited one",
            "",
            f"Written by `python -m bench.limits{' --quick' if self.quick else ''}` "
            f"at {self.started} on {self.machine}.",
            f"`hermes worker --processes {PROCESSES} --concurrency {CONCURRENCY} "
            "--limit a:rate=50/s --limits-url STORE`, queue on Redis; "
            f"{self.n:,} jobs of each type; A measured over {self.window_s:g} s "
            "from its first start. Load average before each row: " + ", ".join(self.load) + ".",
            "",
            "| row | limits store | A jobs/s | B jobs/s | A started | B started | deferred |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for rate_ in self.alone:
            lines.append(f"| B alone | - | - | {rate_:,.0f} | - | {self.n:,} | 0 |")
        for row in self.rows:
            lines.append(
                f"| A, then B {_when(row)} | {row.store} | {row.a_rate:.2f} | {row.b_rate:,.0f} | "
                f"{row.a_started:,} | {row.b_started:,} | {row.deferred:,} |"
            )
        lines += ["", "| target | measured | bound | held |", "|---|---:|---|---|"]
        for what, measured, bound, held in self.targets():
            lines.append(f"| {what} | {measured} | {bound} | {'yes' if held else 'no'} |")
        lines += [
            "",
            "Every round runs every row in this order; a target is judged on the medians "
            "of the rounds. B's rate is its jobs over the time from its first start to "
            "its last; A's, "
            "its starts within the window over the window. `deferred` is what the "
            "worker's summary line counted: jobs of A sent again for their turn. "
            '"B interleaved": both backlogs emitted together, a0 b0 a1 b1 ..., so B '
            "shares the workers with the pass that defers each job of A once (a limit "
            'decision and a send each). "B after the deferral": B\'s backlog emitted '
            "once the worker had taken all of A's, while A runs at its turns.",
        ]
        return "\n".join(lines) + "\n"


def _when(row: Row) -> str:
    return "after the deferral" if row.b_after else "interleaved"


def _drain(
    redis_url: str,
    limits_url: str | None,
    n_a: int,
    n_b: int,
    window_s: float,
    b_after: bool = False,
) -> tuple[list[float], list[float], int]:
    """Start times of A's and B's jobs, and how many the worker deferred.

    ``b_after``: B's backlog is emitted once the worker has taken every job of
    A's (each deferred to its turn), not interleaved with it.
    """
    tag = uuid.uuid4().hex[:8]
    url = isolated_url(redis_url, f"bench-limits-{tag}")
    lists = f"bench-limits-{tag}"
    driver = connect(url)
    try:
        emitter = Emitter(driver)
        a_jobs = [Message("a", {"i": i}) for i in range(n_a)]
        b_jobs = [Message("b", {"i": i}) for i in range(n_b)]
        # Interleaved (a0 b0 a1 b1 ...), or A alone first.
        first = a_jobs if b_after else sorted(a_jobs + b_jobs, key=lambda m: m.payload["i"])
        argv = [*worker_command(), "worker", "--url", url]
        argv += ["--handlers", "bench.limits_jobs:handlers", "-q"]
        argv += ["--processes", str(PROCESSES), "--concurrency", str(CONCURRENCY)]
        if limits_url is not None:
            argv += ["--limit", "a:rate=50/s", "--limits-url", limits_url]
        env = {**os.environ, "BENCH_LIMITS_LISTS": lists, "BENCH_LIMITS_REDIS": redis_url}
        env["PYTHONPATH"] = str(ROOT)
        client = redis.Redis.from_url(redis_url)
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "worker.log"
            with worker(argv, env, log) as proc:
                # Every process of the pool up and connected before the clock starts.
                _emit(emitter, [Message("warm-up", {"i": i}) for i in range(WARM_UP)])
                _wait_for(lambda: client.llen(f"{lists}:warm-up") >= WARM_UP, proc)
                _emit(emitter, first)
                if b_after:
                    _wait_taken(driver, proc)
                    _emit(emitter, b_jobs)
                deadline = time.monotonic() + window_s + 600
                while time.monotonic() < deadline and proc.poll() is None:
                    b_done = client.llen(f"{lists}:b") >= n_b
                    starts = client.lrange(f"{lists}:a", 0, 0)
                    a_done = n_a == 0 or (
                        starts and time.time() > float(starts[0].split(b",")[0]) + window_s + 1
                    )
                    if b_done and a_done:
                        break
                    time.sleep(0.2)
                proc.terminate()
                proc.wait(60)
            text = log.read_text()
        deferred = 0
        for line in text.splitlines():
            if "deferred " in line and "by their limit" in line:
                deferred += int(line.split("deferred ")[1].split()[0])
        a = sorted(_started(client.lrange(f"{lists}:a", 0, -1)))
        b = sorted(float(t.split(b",")[0]) for t in client.lrange(f"{lists}:b", 0, -1))
        client.delete(f"{lists}:a", f"{lists}:b", f"{lists}:warm-up")
        client.close()
        return a, b, deferred
    finally:
        purge_and_close(driver)


LATE: list[float] = []


def _started(entries: list[bytes]) -> list[float]:
    """Start times of ``entries`` (``start,due``); how late each deferred one was goes to LATE."""
    starts = []
    for entry in entries:
        start, due = (float(x) for x in entry.split(b","))
        starts.append(start)
        if due:
            LATE.append(start - due)
    return starts


def _emit(emitter: Emitter, jobs: list[Message]) -> None:
    for i in range(0, len(jobs), 500):
        emitter.emit_batch(jobs[i : i + 500])


def _wait_taken(driver: Driver, proc: subprocess.Popen[bytes]) -> None:
    """Until nothing is ready on ``driver``'s queue: the worker took (and deferred) it all."""
    assert isinstance(driver, SupportsStats)
    _wait_for(lambda: sum(row.ready or 0 for row in driver.queue_stats()) == 0, proc)


def _wait_for(done: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if done():
            return
        time.sleep(0.05)
    raise RuntimeError(f"the worker (exit {proc.poll()}) did not get there in 600 s")


def _b_rate(b: list[float]) -> float:
    return (len(b) - 1) / (b[-1] - b[0]) if len(b) > 1 and b[-1] > b[0] else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="500 jobs of each, an 8 s window")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--rounds", type=int, help="rounds of every row (default 3; 1 quick)")
    args = parser.parse_args(argv)
    n, window_s = (500, 8.0) if args.quick else (5000, 60.0)
    redis_url = services.ensure_redis()
    stores = {
        "Redis": isolated_url(redis_url, f"bench-limits-store-{uuid.uuid4().hex[:8]}"),
        "PostgreSQL": isolated_url(
            services.ensure_postgres(), f"bench_limits_{uuid.uuid4().hex[:8]}"
        ),
    }
    report = Report(args.quick, n, window_s, time.strftime("%Y-%m-%d %H:%M UTC"), machine())
    for _ in range(args.rounds or (1 if args.quick else 3)):
        report.load.append(load_average())
        _, b, _ = _drain(redis_url, None, 0, n, window_s)
        report.alone.append(_b_rate(b))
        print(f"B alone: {report.alone[-1]:,.0f}/s", flush=True)
        for store, limits_url in stores.items():
            for b_after in (False, True):
                report.load.append(load_average())
                a, b, deferred = _drain(redis_url, limits_url, n, n, window_s, b_after)
                in_window = [t for t in a if t < a[0] + window_s]
                rate_ = len(in_window) / window_s
                row = Row(store, b_after, rate_, _b_rate(b), len(a), len(b), deferred)
                report.rows.append(row)
                print(f"limits on {store}: {row}", flush=True)
    text = report.markdown()
    print(text)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "limits.md").write_text(text)
        data = asdict(report) | {"targets": report.targets()}
        (args.out / "limits.json").write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
