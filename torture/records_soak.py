"""Job records under SIGKILLs, and cancels racing real workers: count what they say.

    python -m torture.records_soak [--quick] [--only kill,cancel,redis-at-least-once,...]

Kill runs (Redis at least once, RabbitMQ with its records on Redis,
PostgreSQL with its records in its own database): numbered jobs emitted
through an Emitter that starts a record for each, three ``hermes worker
--results-url`` processes, a random one SIGKILLed every ~2 s and replaced,
then wait until every job is handled or nothing moves. Each handler returns
``Result(n)``. Rules: lost 0 (every job handled), and every record final:
``succeeded`` with its own number as result. None is left ``running``: a job
whose worker was killed mid-handler is delivered again once its lease runs
out, and that attempt ends it.

Cancel runs (Redis at most once, RabbitMQ, the local SQS server, records on
Redis): four ``hermes worker`` processes running, 1,000 jobs emitted, then
500 of them, picked at random, cancelled in random order while the workers
drain the rest. A cancel that finds its job waiting ends it ``cancelled``
there and then; one that finds it running or done only notes the request.
Rules: none of the jobs cancelled while waiting runs, every other job runs,
and each cancelled job's record still says ``cancelled`` at the end.

Exit status 1 if a rule is broken. A full run writes
torture/results/records.md (with ``--only``: records-<names>.md).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import services  # noqa: E402

from hermes.core import Emitter, Message, connect  # noqa: E402
from hermes.core.jobs import Jobs, JobState  # noqa: E402
from torture.pool_soak import handled, namespace, wait_for_drain  # noqa: E402

HERMES = str(Path(sys.executable).with_name("hermes"))
KILL_WORKERS = 3
CANCEL_WORKERS = 4

#: What a handlers module of the soaks starts with: the O_APPEND file each line goes
#: to (one write a line survives a SIGKILL), and how long each job works.
JOBS_PREAMBLE = """
import os
import time

from hermes.core import Result

_fd = os.open(os.environ["RECORDS_SOAK_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
_work_s = float(os.environ["RECORDS_SOAK_WORK_MS"]) / 1000
"""

#: The handlers the workers run: work a little (so kills land mid-handler), then
#: append "<n>\t<pid>".
JOBS = (
    JOBS_PREAMBLE
    + """

def record(message):
    time.sleep(_work_s)
    os.write(_fd, f"{message.payload['n']}\\t{os.getpid()}\\n".encode())
    return Result(message.payload["n"])


HANDLERS = {"torture": record}
"""
)


@dataclass
class Outcome:
    run: str
    sent: int
    handled: int
    kills: int
    cancels: str
    lost: int
    duplicated: int
    wrong_records: int
    rule: str
    ok: bool
    note: str = ""


class Workers:
    """``hermes worker --results-url`` processes, any of which can be killed and replaced."""

    def __init__(
        self,
        url: str,
        results_url: str,
        tmp: Path,
        work_ms: float,
        n: int,
        *,
        jobs: str = JOBS,
        module: str = "records_soak_jobs",
    ) -> None:
        self.url, self.results_url = url, results_url
        self.record, self.log = tmp / "record", tmp / "workers.log"
        (tmp / f"{module}.py").write_text(jobs)
        self.handlers = f"{module}:HANDLERS"
        self.tmp = tmp
        self.env = {
            **os.environ,
            "RECORDS_SOAK_FILE": str(self.record),
            "RECORDS_SOAK_WORK_MS": str(work_ms),
        }
        self.kills = 0
        self.procs = [self.spawn() for _ in range(n)]

    def spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            return subprocess.Popen(
                [HERMES, "worker", "--url", self.url, "--handlers", self.handlers,
                 "--results-url", self.results_url],
                cwd=self.tmp,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill_one(self, rng: random.Random) -> None:
        index = rng.randrange(len(self.procs))
        self.procs[index].send_signal(signal.SIGKILL)
        self.procs[index].wait()
        self.kills += 1
        self.procs[index] = self.spawn()

    def stop(self) -> list[int]:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(30))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        return codes

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def emit(url: str, jobs: Jobs, count: int) -> list[Message]:
    """``count`` numbered jobs, each with a record started as it is emitted."""
    messages = [Message("torture", {"n": n}) for n in range(count)]
    with connect(url) as driver:
        emitter = Emitter(driver, records=jobs)
        for i in range(0, count, 100):
            emitter.emit_batch(messages[i : i + 100])
    return messages


def wrong_records(jobs: Jobs, messages: list[Message], skip: set[int]) -> tuple[int, str]:
    """How many records are not ``succeeded`` with their number, and the first few."""
    wrong: list[str] = []
    for n, message in enumerate(messages):
        if n in skip:
            continue
        record = jobs.get(message.id)
        if record is None:
            wrong.append(f"#{n}: no record")
        elif record.state is not JobState.SUCCEEDED or record.result != n:
            wrong.append(f"#{n}: {record.state} result={record.result!r}")
    return len(wrong), "; ".join(wrong[:5])


def kill_run(
    target: str, base_url: str, results_base: str, count: int, kill_phase_s: float
) -> Outcome:
    # Long enough per job that every worker is still busy when the kills stop.
    work_ms = 1000 * kill_phase_s * KILL_WORKERS / count * 1.2
    rng = random.Random(os.getpid())
    with (
        namespace(base_url, "records-soak") as url,
        namespace(results_base, "records-soak-results") as results_url,
        tempfile.TemporaryDirectory(prefix="hermes-records-") as tmp,
        contextlib.closing(Jobs(results_url)) as jobs,
    ):
        messages = emit(url, jobs, count)
        with connect(url) as driver:
            lease_s = driver.capabilities.redelivery_timeout_s or 5.0
        workers = Workers(url, results_url, Path(tmp), work_ms, KILL_WORKERS)
        try:
            end = time.monotonic() + kill_phase_s
            while time.monotonic() < end:
                time.sleep(rng.uniform(1.5, 2.5))
                workers.kill_one(rng)
            quiet_s = max(10.0, 2 * lease_s + 5)
            wait_for_drain(workers.record, set(range(count)), quiet_s)
            # A worker killed after its handler wrote the job's line but before the
            # record said so leaves that record running until the lease runs out and
            # another attempt ends it: the rule is checked once that had its time.
            deadline = time.monotonic() + quiet_s
            while wrong_records(jobs, messages, set())[0] and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            codes = workers.stop()
        counts = collections.Counter(handled(workers.record))
        lost = count - len(set(counts) & set(range(count)))
        duplicated = sum(1 for c in counts.values() if c > 1)
        wrong, examples = wrong_records(jobs, messages, set())
        ok = lost == 0 and wrong == 0 and all(code == 0 for code in codes)
        note = "" if ok else f"{examples}\nexit codes {codes}\n{workers.output()[-3000:]}"
        return Outcome(
            target,
            count,
            sum(counts.values()),
            workers.kills,
            "",
            lost,
            duplicated,
            wrong,
            "lost 0, every record succeeded with its result",
            ok,
            note,
        )


def cancel_run(target: str, base_url: str, results_base: str, count: int) -> Outcome:
    cancelled_n = count // 2
    rng = random.Random(os.getpid())
    with (
        namespace(base_url, "records-cancel") as url,
        namespace(results_base, "records-cancel-results") as results_url,
        tempfile.TemporaryDirectory(prefix="hermes-records-") as tmp,
        contextlib.closing(Jobs(results_url)) as jobs,
    ):
        # 4 workers x 40 ms: draining takes ~10 s, so most cancels find their job waiting.
        workers = Workers(url, results_url, Path(tmp), 40, CANCEL_WORKERS)
        try:
            time.sleep(2.0)  # the workers are up and waiting
            messages = emit(url, jobs, count)
            chosen = rng.sample(range(count), cancelled_n)
            while_waiting: set[int] = set()
            late: set[int] = set()
            for n in chosen:
                record = jobs.cancel(messages[n].id)
                # A cancel that finds the job waiting ends it there; the record then
                # says cancelled with no attempt. Any other answer: it had started.
                if record.state is JobState.CANCELLED and not record.attempts:
                    while_waiting.add(n)
                else:
                    late.add(n)
            wanted = set(range(count)) - while_waiting
            with connect(url) as driver:
                lease_s = driver.capabilities.redelivery_timeout_s or 5.0
            wait_for_drain(workers.record, wanted, max(10.0, 2 * lease_s + 5))
            time.sleep(2.0)  # a cancelled job that ran anyway would show by now
        finally:
            codes = workers.stop()
        counts = collections.Counter(handled(workers.record))
        ran_cancelled = len(while_waiting & set(counts))
        lost = len(wanted - set(counts))
        duplicated = sum(1 for c in counts.values() if c > 1)
        still_cancelled = sum(
            1
            for n in while_waiting
            if (final := jobs.get(messages[n].id)) is not None and final.state is JobState.CANCELLED
        )
        wrong, examples = wrong_records(jobs, messages, while_waiting | late)
        wrong += len(while_waiting) - still_cancelled
        ok = (
            ran_cancelled == 0
            and lost == 0
            and wrong == 0
            and len(while_waiting) > cancelled_n // 2
            and all(code == 0 for code in codes)
        )
        note = "" if ok else f"{examples}\nexit codes {codes}\n{workers.output()[-3000:]}"
        return Outcome(
            target,
            count,
            sum(counts.values()),
            0,
            f"{len(while_waiting)} while waiting ({ran_cancelled} ran), {len(late)} after start",
            lost,
            duplicated,
            wrong,
            "none cancelled while waiting runs; every other job runs",
            ok,
            note,
        )


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| run | sent | handled | kills | cancels | lost | duplicated | records not as expected "
        "| rule | result |",
        "|---|---:|---:|---:|---|---:|---:|---:|---|---|",
    ]
    for o in outcomes:
        cells = [o.run, o.sent, o.handled, o.kills, o.cancels or "-", o.lost, o.duplicated]
        cells += [o.wrong_records, o.rule, "ok" if o.ok else "BROKEN"]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI's smoke run: Redis only")
    parser.add_argument("--only", default="", help="kill, cancel, or target names")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    kill_count, kill_phase = (200, 6.0) if args.quick else (2_000, 40.0)
    cancel_count = 200 if args.quick else 1_000
    kill_targets = ["redis-at-least-once"] if args.quick else ["redis-at-least-once", "rabbitmq"]
    cancel_targets = ["redis"] if args.quick else ["redis", "rabbitmq", "sqs"]
    if not args.quick:
        kill_targets.append("postgres")

    def wanted(kind: str, target: str) -> bool:
        return not only or kind in only or target in only

    outcomes: list[Outcome] = []
    with services.service_url("redis") as redis_url:
        for target in kill_targets:
            if not wanted("kill", target):
                continue
            print(f"== kill {target}: SIGKILL a worker every ~2 s for {kill_phase:g} s", flush=True)
            with services.service_url(target) as url:
                # PostgreSQL keeps the records beside its queue; the others on Redis.
                results = url if target == "postgres" else redis_url
                outcomes.append(kill_run(f"kill {target}", url, results, kill_count, kill_phase))
            print(table(outcomes[-1:]).splitlines()[-1], flush=True)
        for target in cancel_targets:
            if not wanted("cancel", target):
                continue
            print(f"== cancel {target}: {cancel_count // 2} of {cancel_count} jobs", flush=True)
            with services.service_url(target) as url:
                outcomes.append(cancel_run(f"cancel {target}", url, redis_url, cancel_count))
            print(table(outcomes[-1:]).splitlines()[-1], flush=True)
    intro = ""
    if not args.quick:
        stamp = time.strftime("%Y-%m-%d %H:%M %Z")
        intro = (
            f"`python -m torture.records_soak` ({stamp}, {os.cpu_count()} cores). Kill runs: "
            f"{kill_count:,} jobs with records, {KILL_WORKERS} `hermes worker --results-url` "
            f"processes, a random one SIGKILLed every ~2 s for {kill_phase:g} s. Cancel runs: "
            f"{CANCEL_WORKERS} workers, {cancel_count:,} jobs, {cancel_count // 2} cancelled at "
            "random while the workers drain the rest. Records on Redis, PostgreSQL's in "
            "PostgreSQL.\n\n"
        )
    return report(outcomes, table(outcomes), intro, "records", only)


def report(outcomes: Sequence[Any], text: str, intro: str, name: str, only: set[str]) -> int:
    """Print the soak's table and what went wrong; with ``intro`` (a full run), write both
    to torture/results/NAME.md (NAME-<only>.md for part of it). The exit status: 1 if a
    rule broke or nothing ran."""
    print()
    print(text)
    for o in outcomes:
        if o.note:
            print(f"\n{o.run}:\n{o.note}")
    if intro:
        results_dir = ROOT / "torture" / "results"
        results_dir.mkdir(exist_ok=True)
        file = f"{name}.md" if not only else f"{name}-{'-'.join(sorted(only))}.md"
        (results_dir / file).write_text(f"{intro}{text}\n")
    return 0 if outcomes and all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
