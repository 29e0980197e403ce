"""Workflows: what the bookkeeping costs per member, and long chains and big groups completing.

    python -m bench.workflows [--quick] [--rounds R] [--out DIR]

What users run: ``hermes worker --results-url R --processes 2 --concurrency 4`` on
a Redis queue (the machine's Redis, a namespace of its own), records on the
same server. Each handler (:mod:`bench.workflows_jobs`) pushes when it started
to a Redis list of its type, which this process reads at the end. Each row's
messages are all sent before its worker starts, so a rate is the workers',
not the sender's: the jobs between the first and the last start over that time.

* **Plain jobs, records on**: ``N`` jobs emitted through an ``Emitter(...,
  records=Jobs(R))``: what every job costs with records, the floor a
  workflow's member is compared with.
* **Plain jobs, records off**: the same without ``--results-url``.
* **A group of N members and a callback**: ``chain(group(N jobs),
  job("done"))`` started with ``Workflows.start``; the members' rate, and
  how long after the last member started the callback did.
* **A chain of C steps**: ``chain(C jobs)``; each step pushes its place, so
  the order is checked; the steps per second from the first start to the last.

The target the project states, reported beside the figures and never
enforced: members at least 0.7x the rate of plain jobs with records. A full
run (``N`` 10,000, ``C`` 1,000, 3 rounds) writes ``bench/results/workflows.md``
and ``workflows.json``; ``--quick`` (300 members, a chain of 30, 1 round) is a
smoke run that proves every row can be measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
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

from hermes.core import Emitter, Message, connect
from hermes.core.drivertools import isolated_url
from hermes.core.jobs import Jobs
from hermes.core.workflows import Workflows, chain, group, job

MEMBERS_OVER_PLAIN = 0.7
PROCESSES, CONCURRENCY = 2, 4


@dataclass
class Report:
    quick: bool
    n: int
    steps: int
    started: str
    machine: str
    load: list[str] = field(default_factory=list)
    #: Row -> its rate (jobs/s) in each round.
    rates: dict[str, list[float]] = field(default_factory=dict)
    #: Seconds from the last member's start to the callback's, each round.
    callback_after_s: list[float] = field(default_factory=list)
    #: Whether each round's chain ran its steps in order.
    in_order: list[bool] = field(default_factory=list)

    def median(self, row: str) -> float:
        return statistics.median(self.rates[row])

    def targets(self) -> list[tuple[str, str, str, bool]]:
        ratio = self.median("group members") / self.median("plain, records on")
        return [
            (
                "group members / plain jobs with records, on Redis",
                f"{ratio:.2f}x",
                f">= {MEMBERS_OVER_PLAIN}x",
                ratio >= MEMBERS_OVER_PLAIN,
            ),
            (
                f"a chain of {self.steps:,} steps in order",
                str(all(self.in_order)),
                "True",
                all(self.in_order),
            ),
        ]

    def markdown(self) -> str:
        lines = [
            "# Workflows: bookkeeping per member, a long chain, a big group",
            "",
            f"Written by `python -m bench.workflows{' --quick' if self.quick else ''}` at "
            f"{self.started} on {self.machine}. `hermes worker --results-url R --processes "
            f"{PROCESSES} --concurrency {CONCURRENCY}`, queue and records on Redis; every "
            "row's messages sent before its worker started. Load average before each round: "
            + ", ".join(self.load)
            + ".",
            "",
            "| row | jobs/s, median | each round |",
            "|---|---:|---|",
        ]
        for row, rates in self.rates.items():
            each = ", ".join(f"{r:,.0f}" for r in rates)
            lines.append(f"| {row} | {statistics.median(rates):,.0f} | {each} |")
        lines += [
            "",
            f'Plain rows: {self.n:,} jobs. Group: `chain(group({self.n:,} jobs), job("done"))`; '
            "the callback started "
            + ", ".join(f"{s * 1000:.0f} ms" for s in self.callback_after_s)
            + " after the last member. Chain: "
            f"`chain({self.steps:,} jobs)`, steps per second from the first start to the last.",
            "",
            "| target | measured | bound | held |",
            "|---|---:|---|---|",
        ]
        for what, measured, bound, held in self.targets():
            lines.append(f"| {what} | {measured} | {bound} | {'yes' if held else 'no'} |")
        return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _queue(redis_url: str) -> Iterator[tuple[str, str, str, redis.Redis[bytes]]]:
    """A queue and a records store of their own, the lists' prefix, a client; cleaned up."""
    tag = uuid.uuid4().hex[:8]
    url = isolated_url(redis_url, f"bench-wf-{tag}")
    records = isolated_url(redis_url, f"bench-wf-records-{tag}")
    client = redis.Redis.from_url(redis_url)
    lists = f"bench-wf-{tag}"
    try:
        yield url, records, lists, client
    finally:
        keys = list(client.scan_iter(f"{lists}:*"))
        if keys:
            client.delete(*keys)
        client.close()
        for each in (url, records):
            purge_and_close(connect(each))


def _run_worker(
    url: str, records: str | None, lists: str, redis_url: str, done: Callable[[], bool]
) -> None:
    argv = [*worker_command(), "worker", "--url", url, "-q"]
    argv += ["--handlers", "bench.workflows_jobs:handlers"]
    argv += ["--processes", str(PROCESSES), "--concurrency", str(CONCURRENCY)]
    argv += ["--results-url", records] if records else []
    env = {**os.environ, "BENCH_WF_LISTS": lists, "BENCH_WF_REDIS": redis_url}
    env["PYTHONPATH"] = str(ROOT)
    with tempfile.TemporaryDirectory() as tmp, worker(argv, env, Path(tmp) / "log") as proc:
        deadline = time.monotonic() + 900
        while not done():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker (exit {proc.poll()}) did not finish the row")
            time.sleep(0.1)
        proc.terminate()
        proc.wait(60)


def _rate(starts: list[float]) -> float:
    starts = sorted(starts)
    return (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else float("nan")


def _floats(client: redis.Redis[bytes], key: str) -> list[float]:
    return [float(x) for x in client.lrange(key, 0, -1)]


def plain(redis_url: str, n: int, records_on: bool) -> float:
    with _queue(redis_url) as (url, records, lists, client):
        with connect(url) as driver, contextlib.closing(Jobs(records)) as jobs:
            emitter = Emitter(driver, records=jobs) if records_on else Emitter(driver)
            messages = [Message("plain", {"i": i}) for i in range(n)]
            for i in range(0, n, 500):
                emitter.emit_batch(messages[i : i + 500])
        key = f"{lists}:plain"
        _run_worker(
            url, records if records_on else None, lists, redis_url, lambda: client.llen(key) >= n
        )
        return _rate(_floats(client, key))


def members(redis_url: str, n: int) -> tuple[float, float]:
    with _queue(redis_url) as (url, records, lists, client):
        with connect(url) as driver, contextlib.closing(Jobs(records)) as jobs:
            Workflows(driver, jobs).start(
                chain(group(job("member", {"i": i}) for i in range(n)), job("done"))
            )
        done = f"{lists}:done"
        _run_worker(url, records, lists, redis_url, lambda: client.llen(done) >= 1)
        starts = _floats(client, f"{lists}:member")
        return _rate(starts), _floats(client, done)[0] - max(starts)


def steps(redis_url: str, count: int) -> tuple[float, bool]:
    with _queue(redis_url) as (url, records, lists, client):
        with connect(url) as driver, contextlib.closing(Jobs(records)) as jobs:
            Workflows(driver, jobs).start(chain(job("step", {"i": i}) for i in range(count)))
        key = f"{lists}:step"
        _run_worker(url, records, lists, redis_url, lambda: client.llen(key) >= count)
        entries = [x.decode().split(",") for x in client.lrange(key, 0, -1)]
        order = [int(i) for i, _ in entries]
        return _rate([float(t) for _, t in entries]), order == list(range(count))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workflows", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="300 members, a chain of 30, 1 round")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--rounds", type=int, help="rounds of every row (default 3; 1 quick)")
    args = parser.parse_args(argv)
    n, count = (300, 30) if args.quick else (10_000, 1_000)
    redis_url = services.ensure_redis()
    report = Report(args.quick, n, count, time.strftime("%Y-%m-%d %H:%M UTC"), machine())
    for _ in range(args.rounds or (1 if args.quick else 3)):
        report.load.append(load_average())
        for row, measure in (
            ("plain, records off", lambda: plain(redis_url, n, False)),
            ("plain, records on", lambda: plain(redis_url, n, True)),
        ):
            report.rates.setdefault(row, []).append(measure())
            print(f"{row}: {report.rates[row][-1]:,.0f}/s", flush=True)
        rate, after = members(redis_url, n)
        report.rates.setdefault("group members", []).append(rate)
        report.callback_after_s.append(after)
        print(f"group members: {rate:,.0f}/s, callback {after * 1000:.0f} ms after", flush=True)
        rate, in_order = steps(redis_url, count)
        report.rates.setdefault("chain steps", []).append(rate)
        report.in_order.append(in_order)
        print(f"chain steps: {rate:,.1f}/s, in order: {in_order}", flush=True)
    text = report.markdown()
    print(text)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "workflows.md").write_text(text)
        data = asdict(report) | {"targets": report.targets()}
        (args.out / "workflows.json").write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
