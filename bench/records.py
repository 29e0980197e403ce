"""What job records cost: ``hermes worker --results-url`` against the worker without them.

    python -m bench.records [--quick] [--baseline REF] [-n N] [--rounds R] [--out DIR]

Every row is measured in the same run, on the machine's Redis (and PostgreSQL
for the last):

* throughput, records off and on: bench.jobs's INCR job (one Redis ``INCR`` a
  job) drained by ``hermes worker`` from a backlog on Redis, without records,
  and with ``--results-url`` naming a records store on the same Redis server
  (a namespace of its own). The records-on backlog is emitted through an
  ``Emitter(..., records=Jobs(url))``, so each job has its record from the
  emit and the worker updates it (start, then finish) as it would in
  production. A sample's rate is the jobs between the first and the last
  handler call over that time (start-up not counted, as in bench.run), and
  its CPU is the worker's per job over the same span;
* records off against the previous Hermes: the same INCR row of the
  ``hermes worker`` of ``--baseline REF`` (default: the tag ``known-good``,
  when there is one), checked out with ``git worktree`` into a temporary
  directory and installed with hermes-redis (and this environment's redis-py)
  into a virtual environment of its own. Both workers import bench.jobs from
  this checkout (the previous one through its own ``hermes`` script, as its
  environment has no plugin to block), so only the Hermes differs.
  Without a baseline, or with ``--quick``, the row is skipped and the output
  says why;
* ``result()`` wake latency, records on Redis and on PostgreSQL: a ``hermes
  worker --results-url`` whose handler returns at once; this process emits one
  job at a time through an Emitter with records and blocks in
  ``emitter.job(message).result(timeout=10)``. A job's latency is the time
  ``result()`` returned less the record's ``finished_at`` (the worker's clock
  when it ended the job, the same machine's), p50 and p95 over the jobs after
  a few uncounted ones (connections, LISTEN, tables). The queue is on Redis
  for both stores: only the records store differs.

The targets the project states, reported beside the figures: records on at
least 0.75x the rate of records off; records off at least 0.98x the previous
Hermes's rate; a ``result()`` wake p50 of 5 ms at most on each store.

The throughput rows take turns within each round, the first rotating per
round, so a burst of noise on this shared machine does not always hit the
same one; each is the median of its rounds. A full run (5 rounds of 5,000
jobs; 300 jobs per latency row) writes ``bench/results/records.md`` and
``records.json``. Nothing here asserts a time: ``--quick`` (1 round of 300;
30 jobs per latency row; no baseline) is a smoke run that proves every row can
be measured, and the targets are reported, not enforced.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import envs
from bench.hermes_cli import block_observers
from bench.run import (
    ROOT,
    Env,
    load_average,
    machine,
    purge_and_close,
    rate,
    wait_result,
    wait_until_logged,
    worker,
    worker_command,
)

sys.path.insert(0, str(ROOT / "tools"))
import services

from hermes.core import Emitter, Message, connect
from hermes.core.drivertools import isolated_url
from hermes.core.jobs import Jobs

OFF = "hermes worker"
ON = "hermes worker --results-url (records on Redis)"
#: The tag a baseline defaults to, when the repository has it.
DEFAULT_BASELINE = "known-good"
#: Stores of the latency rows: label -> how to reach its server.
STORES: dict[str, Callable[[], str]] = {
    "Redis": services.ensure_redis,
    "PostgreSQL": services.ensure_postgres,
}
#: Jobs a latency row runs before it counts: connections, LISTEN, tables.
WARM_UP = 5
#: What ``result()`` is given, per job of a latency row.
RESULT_TIMEOUT_S = 10.0
#: The stated targets.
ON_OVER_OFF = 0.75
THIS_OVER_BASELINE = 0.98
WAKE_P50_MS = 5.0


def baseline_system(baseline: tuple[str, str]) -> str:
    """The row of the previous Hermes: ``(ref, commit)`` as the table names it."""
    ref, commit = baseline
    said = commit[:7] if commit.startswith(ref) else f"{ref}, {commit[:7]}"
    return f"hermes worker, previous Hermes ({said})"


def namespace(what: str) -> str:
    return f"bench-{what}-{uuid.uuid4().hex[:8]}"


@dataclass
class Target:
    """A stated target beside what was measured; reported, never enforced."""

    what: str
    measured: float
    #: ``x`` for a ratio, else the unit of ``measured``.
    unit: str
    #: The target as the table says it (``>= 0.75x``).
    bound: str
    held: bool

    def cell(self) -> str:
        if self.unit == "x":
            return f"{self.measured:.2f}x"
        return f"{self.measured:,.2f} {self.unit}"


@dataclass
class Report:
    """Every sample taken, and what could not be measured."""

    quick: bool
    n: int
    rounds: int
    latency_count: int
    started: str
    machine: str
    load: list[str] = field(default_factory=list)
    #: Throughput row -> one (jobs/s, worker CPU µs per job) a round.
    samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: Store -> each job's result() wake latency, ms.
    latencies: dict[str, list[float]] = field(default_factory=dict)
    #: The previous Hermes measured: (the ref as given, its commit).
    baseline: tuple[str, str] | None = None
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def rate(self, system: str) -> float | None:
        values = self.samples.get(system)
        return statistics.median(r for r, _ in values) if values else None

    def cpu_us(self, system: str) -> float | None:
        values = self.samples.get(system)
        return statistics.median(c for _, c in values) if values else None

    def wake(self, store: str) -> tuple[float, float] | None:
        """(p50, p95) in ms of ``store``'s latency row."""
        values = sorted(self.latencies.get(store) or ())
        if not values:
            return None
        return statistics.median(values), values[int(0.95 * (len(values) - 1))]

    def targets(self) -> list[Target]:
        found = []
        off, on = self.rate(OFF), self.rate(ON)
        if off and on:
            ratio = on / off
            held = ratio >= ON_OVER_OFF
            bound = f">= {ON_OVER_OFF:.2f}x"
            found.append(Target("records on / off, INCR on Redis", ratio, "x", bound, held))
        if self.baseline is not None:
            previous = self.rate(baseline_system(self.baseline))
            if off and previous:
                ratio = off / previous
                what = f"records off: this Hermes / {self.baseline[0]}, INCR on Redis"
                held = ratio >= THIS_OVER_BASELINE
                found.append(Target(what, ratio, "x", f">= {THIS_OVER_BASELINE:.2f}x", held))
        for store in STORES:
            wake = self.wake(store)
            if wake is not None:
                what, held = f"result() wake p50, records on {store}", wake[0] <= WAKE_P50_MS
                found.append(Target(what, wake[0], "ms", f"<= {WAKE_P50_MS:g} ms", held))
        return found

    def to_json(self) -> str:
        wakes = {store: self.wake(store) for store in self.latencies}
        return json.dumps(
            {
                "quick": self.quick,
                "n": self.n,
                "rounds": self.rounds,
                "latency_count": self.latency_count,
                "started": self.started,
                "machine": self.machine,
                "load": self.load,
                "baseline": self.baseline,
                "throughput": {
                    system: {"rate": self.rate(system), "cpu_us": self.cpu_us(system)}
                    for system in self.samples
                },
                "wake_ms": {
                    store: {"p50": wake[0], "p95": wake[1]} if wake else None
                    for store, wake in wakes.items()
                },
                "targets": [asdict(t) for t in self.targets()],
                "samples": self.samples,
                "latencies": self.latencies,
                "notes": self.notes,
                "errors": self.errors,
            },
            indent=2,
        )


# Throughput ---------------------------------------------------------------------


def drain(
    env: Env, command: list[str], redis_url: str, n: int, records: bool
) -> tuple[float, float]:
    """Emit ``n`` INCR jobs to a fresh queue; the rate at which ``command worker`` drains
    it and the worker's CPU µs per job. ``records``: with a records store on the same
    Redis, given to the Emitter and the worker (``--results-url``)."""
    url = isolated_url(redis_url, namespace("records"))
    store_url = isolated_url(redis_url, namespace("store")) if records else None
    driver = connect(url)
    jobs = Jobs(store_url) if store_url is not None else None
    try:
        emitter = Emitter(driver, records=jobs)
        batch = [Message("bench", {"i": i}) for i in range(n)]
        for i in range(0, n, 500):
            emitter.emit_batch(batch[i : i + 500])
        with tempfile.TemporaryDirectory() as tmp:
            out, log = Path(tmp) / "result.json", Path(tmp) / "worker.log"
            argv = [*command, "worker", "--url", url, "--handlers", "bench.jobs:register"]
            argv += ["--max-items", str(n)]
            if store_url is not None:
                argv += ["--results-url", store_url]
            with worker(argv, env.make(n, out, "incr"), log) as proc:
                result = wait_result(out, proc, 600, log)
        return rate(result), result["cpu_s"] * 1e6 / max(result["count"] - 1, 1)
    finally:
        if jobs is not None:
            purge_and_close(jobs.driver)
        purge_and_close(driver)


@contextlib.contextmanager
def previous_hermes(commit: str) -> Iterator[str]:
    """The interpreter of a virtual environment holding ``commit``'s hermes-core and
    hermes-redis, editable from a worktree; both removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="hermes-baseline-"))
    source, venv = tmp / "src", tmp / "venv"
    git = ["git", "-C", str(ROOT)]
    try:
        add = [*git, "worktree", "add", "--detach", "-q", str(source), commit]
        subprocess.run(add, check=True)
        python = venv / "bin" / "python"
        install = envs.new_venv(venv)
        # The job's own client, as here: only Hermes differs between the two workers.
        redis_py = f"redis=={importlib.metadata.version('redis')}"
        install += ["-e", str(source / "core"), "-e", str(source / "drivers" / "redis"), redis_py]
        subprocess.run(install, check=True)
        yield str(python)
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(source)], check=False)
        subprocess.run([*git, "worktree", "prune"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_baseline(given: str | None) -> tuple[str, str] | None:
    """``(ref, commit)`` of ``given``, else of the tag ``known-good``; None when not here."""
    ref = given or DEFAULT_BASELINE
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    return (ref, found.stdout.strip()) if found.returncode == 0 else None


def throughput(report: Report, env: Env, redis_url: str, baseline: tuple[str, str] | None) -> None:
    """The throughput rows, round by round, the first of each round rotating."""
    turns: list[tuple[str, Callable[[], tuple[float, float]]]] = []
    command = worker_command()
    turns.append((OFF, functools.partial(drain, env, command, redis_url, report.n, records=False)))
    turns.append((ON, functools.partial(drain, env, command, redis_url, report.n, records=True)))
    with contextlib.ExitStack() as stack:
        if baseline is not None:
            ref, commit = baseline
            print(f"== building the previous Hermes: {ref} ({commit[:12]})", flush=True)
            python = stack.enter_context(previous_hermes(commit))
            # Its own console script: its environment holds no observer plugin to
            # block, and an older Hermes's modules need not match bench.hermes_cli's.
            theirs = [str(Path(python).with_name("hermes"))]
            previous = functools.partial(drain, env, theirs, redis_url, report.n, records=False)
            turns.append((baseline_system(baseline), previous))
            report.baseline = (ref, commit)
        print(f"== throughput: INCR on Redis, {report.n:,} jobs, {rounds_text(report.rounds)}")
        for round_ in range(report.rounds):
            shift = round_ % len(turns)
            for system, measure in turns[shift:] + turns[:shift]:
                value, cpu_us = measure()
                report.samples.setdefault(system, []).append((value, cpu_us))
                line = f"  round {round_ + 1} {system:<52} {value:>8,.0f} jobs/s"
                print(f"{line} {cpu_us:>7.1f} µs CPU/job", flush=True)


# result() wake latency ----------------------------------------------------------


def wake_latency(report: Report, env: Env, redis_url: str, store: str) -> None:
    """One job at a time, ``result()`` waiting on it: its return less the record's end."""
    count = report.latency_count
    url = isolated_url(redis_url, namespace("records"))
    store_url = isolated_url(STORES[store](), namespace("store"))
    print(f"== result() wake latency, records on {store}: {count} jobs", flush=True)
    driver = connect(url)
    jobs = Jobs(store_url)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out, log = Path(tmp) / "result.json", Path(tmp) / "worker.log"
            total = WARM_UP + count
            argv = [*worker_command(), "worker", "--url", url, "--results-url", store_url]
            argv += ["--handlers", "bench.jobs:register", "--max-items", str(total)]
            with worker(argv, env.make(total, out, "noop"), log) as proc:
                wait_until_logged(log, "Reading priorit", proc, 120)
                emitter = Emitter(driver, records=jobs)
                for i in range(total):
                    message = Message("bench", {"i": i})
                    emitter.emit(message)
                    handle = emitter.job(message)
                    handle.result(timeout=RESULT_TIMEOUT_S)
                    returned = time.time()
                    record = handle.record()
                    if record is None or record.finished_at is None:
                        raise RuntimeError(f"job #{message.id} has no finished record: {record}")
                    if i >= WARM_UP:
                        ms = 1000 * (returned - record.finished_at)
                        report.latencies.setdefault(store, []).append(ms)
                wait_result(out, proc, 60, log)
    finally:
        purge_and_close(jobs.driver)
        purge_and_close(driver)
    wake = report.wake(store)
    assert wake is not None
    print(f"  p50 {wake[0]:.2f} ms, p95 {wake[1]:.2f} ms", flush=True)


# Reports ------------------------------------------------------------------------


def rounds_text(count: int) -> str:
    return "1 round" if count == 1 else f"{count} rounds"


def markdown(report: Report) -> str:
    intro = (
        f"`python -m bench.records{' --quick' if report.quick else ''}` ({report.started}; "
        f"{report.machine}; load {report.load[0]} before, {report.load[-1]} after)."
    )
    lines = [intro, ""]
    off = report.rate(OFF)
    previous: list[str] = []
    if report.baseline is not None:
        ref, commit = report.baseline
        previous = [
            f"The previous Hermes: `{ref}` ({commit[:12]}), hermes-core and hermes-redis "
            "alone in a virtual environment of their own."
        ]
    if report.samples:
        lines += [
            f"Throughput: bench.jobs's INCR job drained from a backlog of {report.n:,} on "
            f"Redis, median of {rounds_text(report.rounds)}, rate between the first and the last "
            "job's handler call; CPU: the worker's, per job, over the same span.",
            *previous,
            "",
            "| hermes worker | INCR jobs/s | vs the first row | CPU µs/job | samples (jobs/s) |",
            "|---|---:|---:|---:|---|",
        ]
        for system, values in report.samples.items():
            value, cpu = report.rate(system), report.cpu_us(system)
            assert value is not None and cpu is not None
            versus = f"{value / off:.2f}x" if off else "-"
            each = ", ".join(f"{r:,.0f}" for r, _ in values)
            lines.append(f"| {system} | {value:,.0f} | {versus} | {cpu:.1f} | {each} |")
        lines.append("")
    if report.latencies:
        lines += [
            "`result()` wake latency: one job at a time (a handler that returns at once, the "
            "queue on Redis), `result()` return less the record's `finished_at`.",
            "",
            "| records store | jobs | p50 | p95 | max |",
            "|---|---:|---:|---:|---:|",
        ]
        for store, waits in report.latencies.items():
            wake = report.wake(store)
            assert wake is not None
            lines.append(
                f"| {store} | {len(waits)} | {wake[0]:.2f} ms | {wake[1]:.2f} ms "
                f"| {max(waits):.2f} ms |"
            )
        lines.append("")
    targets = report.targets()
    if targets:
        lines += ["| target | measured | bound | held |", "|---|---:|---:|---|"]
        for t in targets:
            lines.append(f"| {t.what} | {t.cell()} | {t.bound} | {'yes' if t.held else 'no'} |")
        lines.append("")
    lines += [f"- {note}" for note in report.notes]
    lines += [f"- error: {error}" for error in report.errors]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts, no baseline")
    parser.add_argument(
        "--baseline",
        default=None,
        help=f"git ref of the previous Hermes (default: the tag {DEFAULT_BASELINE}, if any)",
    )
    parser.add_argument("-n", type=int, default=0, help="jobs per throughput sample")
    parser.add_argument("--rounds", type=int, default=0, help="throughput rounds (median)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    n = args.n or (300 if args.quick else 5_000)
    rounds = args.rounds or (1 if args.quick else 5)
    report = Report(
        quick=args.quick,
        n=n,
        rounds=rounds,
        latency_count=30 if args.quick else 300,
        started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        machine=machine(),
        load=[load_average()],
    )
    # The Emitters of this process are observed by no plugin, whatever the venv holds.
    block_observers()
    redis_url = services.ensure_redis()
    env = Env(redis_url, f"bench-incr-{uuid.uuid4().hex[:8]}")

    baseline: tuple[str, str] | None = None
    if args.quick:
        report.notes.append("--quick: records off against the previous Hermes is not measured")
    else:
        baseline = resolve_baseline(args.baseline)
        if baseline is None and args.baseline:
            # Asked for and not there: an error, not a row quietly left out.
            why = f"--baseline {args.baseline}: no such commit here"
            report.notes.append(f"records off against the previous Hermes skipped: {why}")
            report.errors.append(why)
        elif baseline is None:
            report.notes.append(
                "records off against the previous Hermes skipped: no --baseline given and "
                f"no tag {DEFAULT_BASELINE!r} here"
            )
    for note in report.notes:
        print(note, flush=True)

    def section(name: str, measure: Callable[[], None]) -> None:
        try:
            measure()
        except Exception as exc:  # one broken row must not hide the others' figures
            report.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            print(f"  !! {name}: {exc}", flush=True)

    section("throughput", lambda: throughput(report, env, redis_url, baseline))
    for store in STORES:
        section(f"wake {store}", functools.partial(wake_latency, report, env, redis_url, store))
    with contextlib.suppress(Exception):
        import redis

        redis.Redis.from_url(redis_url).delete(env.incr_key)
    report.load.append(load_average())
    md = markdown(report)
    print()
    print(md)
    if not args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "records.md").write_text(md)
        (out / "records.json").write_text(report.to_json())
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
