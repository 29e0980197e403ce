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

* **Concurrency**: 1,000 jobs of 50 ms under ``--limit c:concurrency=5``;
  each counts itself running while it runs (Redis INCR/DECR) and pushes the
  count it saw as it started, and this process samples the count every 10 ms.
* **Per key**: ``--limit t:rate=5/s,key=tenant``, 2,000 jobs of one tenant
  emitted first and 100 of each of 9 quiet tenants behind them; each
  tenant's rate over its own jobs.

The pair runs with the limits store on Redis and on PostgreSQL (the queue on
Redis both times), three ways: B interleaved with A's backlog; B emitted once
the worker took all of A's (each job of A deferred to its turn); and A's
sent through an ``Emitter(..., limits=...)`` that charges each job its turn as
it emits it (so no worker defers any), then B's.
Every round runs every row; the targets are judged on the medians. The stated
targets, reported beside the figures and never enforced: A at 50/s ± 5% over
the window; B at least 0.9x its rate alone; never more than 5 running under
concurrency 5; every quiet tenant at 5/s - 5% or more. A full run (``N`` 5,000, a 60 s
window, 3 rounds) writes ``bench/results/limits.md`` and ``limits.json``;
``--quick`` (200 jobs, a 3 s window, a pool of 2 x 4) is a smoke run that proves
every row can be measured.
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
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.run import ROOT, load_average, machine, purge_and_close, worker, worker_command

sys.path.insert(0, str(ROOT / "tools"))
import redis
import services

from hermes.core import Emitter, Limit, Message, connect
from hermes.core.driver import Driver, SupportsStats
from hermes.core.drivertools import isolated_url

#: The limit A is held to, and the bounds stated for it.
RATE = 50.0
RATE_TOLERANCE = 0.05
B_OVER_ALONE = 0.9
PROCESSES = 4
CONCURRENCY = 8
#: How a row emits its backlogs (see :func:`_drain`), and what its table says.
INTERLEAVED, AFTER, EMITTER = "interleaved", "after", "emitter"
_WHEN = {
    INTERLEAVED: "interleaved",
    AFTER: "after the deferral",
    EMITTER: "after A was sent at its turns by the Emitter",
}
#: The concurrency row's limit, and the per-tenant rate of the tenants row.
SLOTS = 5
TENANT_RATE = 5.0
#: Jobs the worker handles before a row's backlog is emitted: every process warm.
WARM_UP = 200


@dataclass
class Row:
    """One run of the worker over one backlog."""

    store: str
    #: INTERLEAVED, AFTER or EMITTER (see :func:`_drain`).
    how: str
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
    #: Store -> (most running a job saw as it started, most sampled, jobs run).
    slots: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: Store -> tenant -> its jobs per second.
    tenants: dict[str, dict[str, float]] = field(default_factory=dict)

    def b_alone(self) -> float:
        return statistics.median(self.alone)

    def medians(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(store, how) -> the median A and B rates of its rounds."""
        groups: dict[tuple[str, str], list[Row]] = {}
        for row in self.rows:
            groups.setdefault((row.store, row.how), []).append(row)
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
        for (store, how), (a_rate, b_rate) in self.medians().items():
            when = _WHEN[how]
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
        for store, (seen, sampled, _) in self.slots.items():
            most = max(seen, sampled)
            what = f"most running at once under concurrency={SLOTS}, limits on {store}"
            found.append((what, str(most), f"<= {SLOTS}", most <= SLOTS))
        low_t = TENANT_RATE * (1 - RATE_TOLERANCE)
        for store, rates in self.tenants.items():
            quiet = min(r for t, r in rates.items() if t != "flood")
            what = f"slowest quiet tenant beside a flooding one, limits on {store}"
            found.append((what, f"{quiet:.2f}/s", f">= {low_t:g}/s", quiet >= low_t))
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
        if self.slots:
            lines += [
                "",
                f"Concurrency: jobs of 50 ms under `--limit c:concurrency={SLOTS}`, the same "
                "fleet; each job counts itself running (Redis INCR/DECR) and this process "
                "samples the count every 10 ms.",
                "",
                "| limits store | jobs | most running as a job started | most sampled |",
                "|---|---:|---:|---:|",
            ]
            for store, (seen, sampled, ran) in self.slots.items():
                lines.append(f"| {store} | {ran:,} | {seen} | {sampled} |")
        if self.tenants:
            lines += [
                "",
                f"Per key: `--limit t:rate={TENANT_RATE:g}/s,key=tenant`; one tenant's backlog "
                "emitted first, then each of 9 quiet tenants' behind it; each tenant's rate "
                "over its own jobs.",
                "",
                "| limits store | flooding tenant | quiet tenants, slowest | fastest |",
                "|---|---:|---:|---:|",
            ]
            for store, rates in self.tenants.items():
                quiet = [r for t, r in rates.items() if t != "flood"]
                lines.append(
                    f"| {store} | {rates['flood']:.2f}/s | {min(quiet):.2f}/s | "
                    f"{max(quiet):.2f}/s |"
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
            "once the worker had taken all of A's, while A runs at its turns. \"B after A "
            "was sent at its turns\": A's backlog emitted through an `Emitter(..., "
            "limits=...)`, which charges each job its turn as it emits it and sends it due "
            "then, so no worker defers it; then B's through a plain one.",
        ]
        return "\n".join(lines) + "\n"


def _when(row: Row) -> str:
    return _WHEN[row.how]


@dataclass
class Fleet:
    """A running ``hermes worker`` pool on a queue of its own, warmed up."""

    driver: Driver
    emitter: Emitter
    client: redis.Redis[bytes]
    #: What every Redis key the handlers write starts with.
    lists: str
    proc: subprocess.Popen[bytes]
    log: str = ""


@contextlib.contextmanager
def _fleet(redis_url: str, limit_args: list[str]) -> Iterator[Fleet]:
    """``hermes worker --processes 4 --concurrency 8 LIMIT_ARGS`` on a fresh queue, once
    every process handled warm-up jobs; its log is in ``fleet.log`` afterwards."""
    tag = uuid.uuid4().hex[:8]
    url = isolated_url(redis_url, f"bench-limits-{tag}")
    driver = connect(url)
    client = redis.Redis.from_url(redis_url)
    fleet = None
    try:
        argv = [*worker_command(), "worker", "--url", url]
        argv += ["--handlers", "bench.limits_jobs:handlers", "-q"]
        argv += ["--processes", str(PROCESSES), "--concurrency", str(CONCURRENCY), *limit_args]
        lists = f"bench-limits-{tag}"
        env = {**os.environ, "BENCH_LIMITS_LISTS": lists, "BENCH_LIMITS_REDIS": redis_url}
        env["PYTHONPATH"] = str(ROOT)
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "worker.log"
            with worker(argv, env, log) as proc:
                fleet = Fleet(driver, Emitter(driver), client, lists, proc)
                # Every process of the pool up and connected before the clock starts.
                _emit(fleet.emitter, [Message("warm-up", {"i": i}) for i in range(WARM_UP)])
                _wait_for(lambda: client.llen(f"{lists}:warm-up") >= WARM_UP, proc)
                yield fleet
                proc.terminate()
                proc.wait(60)
            fleet.log = log.read_text()
    finally:
        if fleet is not None:
            keys = list(client.scan_iter(f"{fleet.lists}:*"))
            if keys:
                client.delete(*keys)
        client.close()
        purge_and_close(driver)


def _drain(
    redis_url: str,
    limits_url: str | None,
    n_a: int,
    n_b: int,
    window_s: float,
    how: str = INTERLEAVED,
) -> tuple[list[float], list[float], int]:
    """Start times of A's and B's jobs, and how many the worker deferred.

    ``how``: INTERLEAVED, both backlogs emitted together (a0 b0 a1 b1 ...);
    AFTER, B's emitted once the worker has taken every job of A's (each
    deferred to its turn); EMITTER, A's through an Emitter given the limit,
    which sends each job of A due at its turn, then B's through a plain one
    (B's rate is the workers', not the pace of A's emit loop).
    """
    limit_args = ["--limit", "a:rate=50/s", "--limits-url", limits_url] if limits_url else []
    a_jobs = [Message("a", {"i": i}) for i in range(n_a)]
    b_jobs = [Message("b", {"i": i}) for i in range(n_b)]
    b_after = how in (AFTER, EMITTER)
    first = a_jobs if b_after else sorted(a_jobs + b_jobs, key=lambda m: m.payload["i"])
    with _fleet(redis_url, limit_args) as fleet:
        client, lists = fleet.client, fleet.lists
        emitter = fleet.emitter
        if how == EMITTER:
            assert limits_url is not None
            limits = {"a": Limit(rate=f"{RATE:g}/s")}
            emitter = Emitter(fleet.driver, limits=limits, limit_store=limits_url)
        _emit(emitter, first)
        if how == AFTER:
            _wait_taken(fleet.driver, fleet.proc)
        if b_after:
            _emit(fleet.emitter, b_jobs)
        deadline = time.monotonic() + window_s + 600
        while time.monotonic() < deadline and fleet.proc.poll() is None:
            b_done = client.llen(f"{lists}:b") >= n_b
            starts = client.lrange(f"{lists}:a", 0, 0)
            a_done = n_a == 0 or (
                starts and time.time() > float(starts[0].split(b",")[0]) + window_s + 1
            )
            if b_done and a_done:
                break
            time.sleep(0.2)
        a = sorted(_started(client.lrange(f"{lists}:a", 0, -1)))
        b = sorted(float(t.split(b",")[0]) for t in client.lrange(f"{lists}:b", 0, -1))
    deferred = 0
    for line in fleet.log.splitlines():
        if "deferred " in line and "by their limit" in line:
            deferred += int(line.split("deferred ")[1].split()[0])
    return a, b, deferred


def _concurrency(redis_url: str, limits_url: str, n: int) -> tuple[int, int, int]:
    """``n`` jobs of 50 ms under ``concurrency=5``: the most running that a job saw as it
    started, the most a sampler saw every 10 ms, and how many ran."""
    args = ["--limit", f"c:concurrency={SLOTS}", "--limits-url", limits_url]
    with _fleet(redis_url, args) as fleet:
        client, lists = fleet.client, fleet.lists
        _emit(fleet.emitter, [Message("c", {"i": i}) for i in range(n)])
        sampled = [0]
        deadline = time.monotonic() + 600
        while client.llen(f"{lists}:c") < n and time.monotonic() < deadline:
            sampled.append(int(client.get(f"{lists}:running") or 0))
            time.sleep(0.01)
        seen = [int(x) for x in client.lrange(f"{lists}:c", 0, -1)]
    return max(seen, default=0), max(sampled), len(seen)


def _tenants(redis_url: str, limits_url: str, flood: int, quiet: int) -> dict[str, float]:
    """``rate=5/s,key=tenant``: ``flood`` jobs of one tenant emitted first, then ``quiet``
    of each of 9 others; each tenant's rate over its own jobs."""
    args = ["--limit", f"t:rate={TENANT_RATE:g}/s,key=tenant", "--limits-url", limits_url]
    names = [f"quiet-{k}" for k in range(9)]
    with _fleet(redis_url, args) as fleet:
        client, lists = fleet.client, fleet.lists
        _emit(fleet.emitter, [Message("t", {"tenant": "flood"}) for _ in range(flood)])
        _emit(fleet.emitter, [Message("t", {"tenant": t}) for t in names for _ in range(quiet)])
        _wait_for(lambda: all(client.llen(f"{lists}:t:{t}") >= quiet for t in names), fleet.proc)
        starts = {
            t: sorted(float(x) for x in client.lrange(f"{lists}:t:{t}", 0, -1))
            for t in ["flood", *names]
        }
    return {t: _b_rate(s) for t, s in starts.items()}


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
    parser.add_argument(
        "--quick", action="store_true", help="200 jobs of each, a 3 s window, a pool of 2 x 4"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--rounds", type=int, help="rounds of every row (default 3; 1 quick)")
    args = parser.parse_args(argv)
    n, window_s = (200, 3.0) if args.quick else (5000, 60.0)
    if args.quick:  # a smoke run, beside the rest of CI: a smaller pool
        global PROCESSES, CONCURRENCY
        PROCESSES, CONCURRENCY = 2, 4
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
            for how in (INTERLEAVED, AFTER, EMITTER):
                report.load.append(load_average())
                a, b, deferred = _drain(redis_url, limits_url, n, n, window_s, how)
                in_window = [t for t in a if t < a[0] + window_s]
                rate_ = len(in_window) / window_s
                row = Row(store, how, rate_, _b_rate(b), len(a), len(b), deferred)
                report.rows.append(row)
                print(f"limits on {store}: {row}", flush=True)
    jobs, flood, quiet = (40, 60, 5) if args.quick else (1000, 2000, 100)
    for store, limits_url in stores.items():
        report.slots[store] = _concurrency(redis_url, limits_url, jobs)
        print(f"concurrency, limits on {store}: {report.slots[store]}", flush=True)
        report.tenants[store] = _tenants(redis_url, limits_url, flood, quiet)
        print(f"tenants, limits on {store}: {report.tenants[store]}", flush=True)
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
