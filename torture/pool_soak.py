"""SIGKILL the children of a worker pool, and recycle them, on the at-least-once drivers.

    python -m torture.pool_soak [--quick] [--only filesystem,redis-at-least-once,limits,...]

Kill runs: one ``hermes worker --processes 2 --concurrency 4`` (the real
command: its supervisor forks the children), numbered messages on the
broker, a random child SIGKILLed every ~0.5 s for two minutes (``--quick``:
5 s), then wait until nothing moves and count like torture.soak: lost (sent,
never handled), duplicated, unexpected. A sampler reads the supervisor's
children from /proc every few milliseconds: never more than 2 alive. Every
kill must be answered by a replacement: the supervisor's summary counts them,
and 2 children run at the end.

Limits run: the same kills on file:// (``--quick``) or Redis at least once,
with the handler held to ``rate=200/s, concurrency=3`` (leases of 2 s) in the
broker's own store: lost 0, and every message runs with ``retries`` 0 (a job
deferred by its limit uses up no retry).

Recycle run: ``--max-jobs-per-child 100`` over 2,000 messages (``--quick``:
10 over 200) on file://: about 20 replacements, lost 0, none handled twice
(no child is killed, so an at-least-once driver has no reason to repeat one).

Restart run: ``hermes worker --processes 4 --concurrency 2`` on a redis-server
of its own (at least once, appendfsync always), 2,000 messages (``--quick``:
400) whose handler fails each first attempt, so every message sends a retry
copy (backoff 0.2 s); Redis is restarted (down 1 s) while that burst of retry
copies is being sent. Rules: lost 0, the pool runs on (no child exits 2, the
mistake that stops a pool; a child whose copy could not be sent exits 1 and is
replaced), and it stops with 0.

Exit status 1 if a rule is broken. The full run writes torture/results/pool.md,
a run with ``--only`` torture/results/pool-<its targets>.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import services  # noqa: E402

from hermes.core import Message, connect  # noqa: E402
from hermes.core.driver import SupportsPurge, SupportsTeardown  # noqa: E402
from hermes.core.drivertools import isolated_url  # noqa: E402

PROCESSES = 2
CONCURRENCY = 4
HERMES = str(Path(sys.executable).with_name("hermes"))

#: The handlers the pool runs: work a little (so kills land mid-handler), then
#: append "<n>\t<pid>" with one write on an O_APPEND file, which survives a SIGKILL.
JOBS = """
import os
import time

_fd = os.open(os.environ["POOL_SOAK_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
_work_s = float(os.environ["POOL_SOAK_WORK_MS"]) / 1000


def record(message):
    time.sleep(_work_s)
    os.write(_fd, f"{message.payload['n']}\\t{os.getpid()}\\n".encode())


HANDLERS = {"torture": record}
"""

#: The limits run's handlers: JOBS's, held to a rate and to 3 at once (leases of 2 s, so a
#: killed child's slots come back within the run), recording the retries each ran with.
LIMITED_JOBS = """
import os
import time

from hermes.core import HandlerRegistry, Limit

_fd = os.open(os.environ["POOL_SOAK_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
_work_s = float(os.environ["POOL_SOAK_WORK_MS"]) / 1000
HANDLERS = HandlerRegistry()


@HANDLERS.handler("torture", limit=Limit(rate="200/s", concurrency=3, lease_s=2))
def record(message):
    time.sleep(_work_s)
    os.write(_fd, f"{message.payload['n']}\\t{os.getpid()}\\t{message.retries}\\n".encode())
"""

#: The restart run's handlers: each message fails its first attempt (a retry copy
#: goes out, due 0.2 s later) and is recorded on its retry.
RETRYING_JOBS = """
import os

from hermes.core import HandlerRegistry

_fd = os.open(os.environ["POOL_SOAK_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
HANDLERS = HandlerRegistry()


@HANDLERS.handler("torture", max_retry=10, backoff=0.2)
def record(message):
    if message.retries == 0:
        raise RuntimeError("the first attempt fails: a retry copy goes out")
    os.write(_fd, f"{message.payload['n']}\\t{os.getpid()}\\n".encode())
"""


@dataclass
class Outcome:
    run: str
    sent: int
    handled: int
    kills: int
    replaced: int
    recycled: int
    most_alive: int
    lost: int
    duplicated: int
    exit_code: int
    ok: bool
    note: str = ""


def children_of(pid: int) -> list[int]:
    """The supervisor's live children (zombies left out), from /proc."""
    try:
        entries = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    alive = []
    for entry in entries:
        try:
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(int(entry))
    return alive


class Pool:
    def __init__(
        self,
        url: str,
        tmp: Path,
        work_ms: float,
        *options: str,
        jobs: str = JOBS,
        processes: int = PROCESSES,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self.record = tmp / "record"
        self.log = tmp / "pool.log"
        (tmp / "pool_soak_jobs.py").write_text(jobs)
        env = {
            **os.environ,
            "POOL_SOAK_RECORD": str(self.record),
            "POOL_SOAK_WORK_MS": str(work_ms),
        }
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [HERMES, "worker", "--url", url, "--handlers", "pool_soak_jobs:HANDLERS",
                 "--processes", str(processes), "--concurrency", str(concurrency), *options],
                cwd=tmp,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.most = 0
        self._done = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._done.wait(0.002):
            self.most = max(self.most, len(children_of(self.proc.pid)))

    def children(self) -> list[int]:
        return children_of(self.proc.pid)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            self._done.set()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def handled(record: Path) -> list[int]:
    if not record.exists():
        return []
    return [int(line.split("\t", 1)[0]) for line in record.read_text().splitlines() if line]


def retried_runs(record: Path) -> int:
    """Handler runs recorded with ``retries`` above 0 (LIMITED_JOBS writes a third field)."""
    if not record.exists():
        return 0
    fields = (line.split("\t") for line in record.read_text().splitlines() if line)
    return sum(1 for f in fields if len(f) > 2 and f[2] != "0")


def tally(record: Path, count: int) -> tuple[collections.Counter[int], int, int]:
    """Handles per message number, how many of 0..count-1 were never handled, how many twice."""
    counts = collections.Counter(handled(record))
    lost = len(set(range(count)) - set(counts))
    return counts, lost, sum(1 for c in counts.values() if c > 1)


def summary_number(output: str, words: str) -> int:
    match = re.search(rf"(\d+) {words}", output)
    return int(match.group(1)) if match else 0


def wait_for_drain(record: Path, sent: set[int], quiet_s: float) -> None:
    last, last_change = -1, time.monotonic()
    while time.monotonic() - last_change < quiet_s:
        got = handled(record)
        if len(got) != last:
            last, last_change = len(got), time.monotonic()
        if sent <= set(got):
            time.sleep(1.0)  # let duplicates in flight land before counting
            return
        time.sleep(0.2)


@contextlib.contextmanager
def namespace(base_url: str, name: str = "pool") -> Iterator[str]:
    """``base_url`` in a namespace of its own, emptied (or dropped) afterwards."""
    url = isolated_url(base_url, f"{name}-{uuid.uuid4().hex[:10]}")
    try:
        yield url
    finally:
        with connect(url) as driver:
            if isinstance(driver, SupportsTeardown):
                driver.teardown()
            elif isinstance(driver, SupportsPurge):
                driver.purge(None)


def emit(url: str, count: int) -> float:
    """Put ``count`` numbered messages on ``url``; the driver's redelivery timeout."""
    with connect(url) as driver:
        messages = [Message("torture", {"n": n}) for n in range(count)]
        for i in range(0, count, 100):
            driver.send_batch(messages[i : i + 100])
        return driver.capabilities.redelivery_timeout_s or 5.0


def kill_run(
    target: str, base_url: str, count: int, kill_phase_s: float, *, limited: bool = False
) -> Outcome:
    """``limited``: the handler is held to a rate and 3 at once (LIMITED_JOBS), and every
    message must also run with ``retries`` 0: deferrals use up no retry."""
    # Long enough per message that all 8 handler threads are still busy when the kills stop
    # (with limits, the 3 slots are: a job holds one about 8/3 as long).
    slots = 3 if limited else PROCESSES * CONCURRENCY
    work_ms = 1000 * kill_phase_s * slots / count * 1.2
    rng = random.Random(os.getpid())
    with namespace(base_url) as url, tempfile.TemporaryDirectory(prefix="hermes-pool-") as tmp:
        redelivery_s = emit(url, count)
        pool = Pool(url, Path(tmp), work_ms, jobs=LIMITED_JOBS if limited else JOBS)
        deadline = time.monotonic() + 30
        while len(pool.children()) < PROCESSES and time.monotonic() < deadline:
            time.sleep(0.05)
        kills = 0
        end = time.monotonic() + kill_phase_s
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.3, 0.7))
            alive = pool.children()
            if alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rng.choice(alive), signal.SIGKILL)
                    kills += 1
        wait_for_drain(pool.record, set(range(count)), max(8.0, 2 * redelivery_s + 5))
        # Every kill was answered: both slots hold a child again.
        deadline = time.monotonic() + 10
        while len(pool.children()) < PROCESSES and time.monotonic() < deadline:
            time.sleep(0.05)
        alive_at_end = len(pool.children())
        code = pool.stop()
        output = pool.output()
        counts, lost, duplicated = tally(pool.record, count)
        replaced = summary_number(output, "died and were replaced")
        retried = retried_runs(pool.record)
        ok = (
            lost == 0
            and retried == 0
            and pool.most <= PROCESSES
            and replaced == kills
            and alive_at_end == PROCESSES
            and code == 0
        )
        note = "" if ok else f"{retried} runs with retries > 0\n{output[-3000:]}"
        return Outcome(
            f"{target} + limits" if limited else target,
            count,
            sum(counts.values()),
            kills,
            replaced,
            0,
            pool.most,
            lost,
            duplicated,
            code,
            ok,
            note,
        )


def recycle_run(base_url: str, count: int, max_jobs: int) -> Outcome:
    with namespace(base_url) as url, tempfile.TemporaryDirectory(prefix="hermes-pool-") as tmp:
        emit(url, count)
        pool = Pool(url, Path(tmp), 0, "--max-jobs-per-child", str(max_jobs))
        wait_for_drain(pool.record, set(range(count)), 10.0)
        code = pool.stop()
        output = pool.output()
        counts, lost, duplicated = tally(pool.record, count)
        recycled = summary_number(output, "replaced at their limit")
        expected = count // max_jobs
        ok = (
            lost == 0
            and duplicated == 0
            and expected - PROCESSES <= recycled <= expected
            and pool.most <= PROCESSES
            and code == 0
        )
        return Outcome(
            f"filesystem --max-jobs-per-child {max_jobs}",
            count,
            sum(counts.values()),
            0,
            summary_number(output, "died and were replaced"),
            recycled,
            pool.most,
            lost,
            duplicated,
            code,
            ok,
            "" if ok else output[-3000:],
        )


def restart_run(count: int) -> Outcome:
    """A pool of 4 on a Redis of its own, restarted in the middle of a burst of retry copies."""
    from torture.soak import private_redis

    processes = 4
    with (
        private_redis() as (base, restart),
        tempfile.TemporaryDirectory(prefix="hermes-pool-") as tmp,
    ):
        url = f"{base}?{services.REDIS_AT_LEAST_ONCE}"
        emit(url, count)
        pool = Pool(url, Path(tmp), 0, jobs=RETRYING_JOBS, processes=processes, concurrency=2)
        # In the burst: some retries handled, most of the copies still to send.
        deadline = time.monotonic() + 60
        while len(handled(pool.record)) < count // 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        restart()
        wait_for_drain(pool.record, set(range(count)), 30.0)
        running = pool.proc.poll() is None
        code = pool.stop()
        output = pool.output()
        counts, lost, duplicated = tally(pool.record, count)
        mistakes = "stopping the pool" in output or "exited with code 2" in output
        ok = lost == 0 and running and not mistakes and code == 0
        return Outcome(
            f"redis-at-least-once + restart, --processes {processes}, retry burst",
            count,
            sum(counts.values()),
            0,
            summary_number(output, "died and were replaced"),
            0,
            pool.most,
            lost,
            duplicated,
            code,
            ok,
            "" if ok else output[-3000:],
        )


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| run | sent | handled | kills | replaced after a death | recycled | most alive "
        "| lost | duplicated | exit | result |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for o in outcomes:
        cells = [o.run, o.sent, o.handled, o.kills, o.replaced, o.recycled, o.most_alive]
        cells += [o.lost, o.duplicated, o.exit_code, "ok" if o.ok else "BROKEN"]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


#: The at-least-once drivers (Redis in its at-least-once mode), by tools/services.py's names.
FULL_TARGETS = ["filesystem", "redis-at-least-once", "rabbitmq", "sqs", "kafka", "postgres"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI's smoke run, under 30 s")
    parser.add_argument("--only", default="")
    parser.add_argument(
        "--count", type=int, default=0, help="messages per kill run (default 10,000; quick 300)"
    )
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    # Quick: file:// only (no server); the full run adds every other at-least-once driver.
    targets = ["filesystem"] if args.quick else FULL_TARGETS
    count, kill_phase = (300, 5.0) if args.quick else (10_000, 120.0)
    # The local SQS server takes minutes to hold 10,000 messages: fewer, longer jobs.
    count = args.count or count
    outcomes: list[Outcome] = []
    for target in targets:
        if only and target not in only:
            continue
        print(f"== {target}: SIGKILL a child every ~0.5 s for {kill_phase:g} s", flush=True)
        with services.service_url(target) as url:
            outcomes.append(kill_run(target, url, count, kill_phase))
        print(table(outcomes[-1:]).splitlines()[-1], flush=True)
    if not only or "limits" in only:
        target = "filesystem" if args.quick else "redis-at-least-once"
        print(f"== {target} with limits (rate 200/s, 3 at once): the same kills", flush=True)
        with services.service_url(target) as url:
            outcomes.append(kill_run(target, url, count, kill_phase, limited=True))
        print(table(outcomes[-1:]).splitlines()[-1], flush=True)
    restarted = not only or "restart" in only
    if restarted:
        total = 400 if args.quick else 2_000
        print(f"== --processes 4 on Redis, restarted amid {total:,} retry copies", flush=True)
        outcomes.append(restart_run(total))
        print(table(outcomes[-1:]).splitlines()[-1], flush=True)
    recycled = not only or "recycle" in only
    if recycled:
        total, max_jobs = (200, 10) if args.quick else (2_000, 100)
        print(f"== --max-jobs-per-child {max_jobs} over {total:,} messages", flush=True)
        with services.service_url("filesystem") as url:
            outcomes.append(recycle_run(url, total, max_jobs))
        print(table(outcomes[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(outcomes))
    for o in outcomes:
        if o.note:
            print(f"\n{o.run}:\n{o.note}")
    if not args.quick:
        stamp = time.strftime("%Y-%m-%d %H:%M %Z")
        runs = []
        if any(o.kills or o.run in FULL_TARGETS for o in outcomes):
            runs.append(
                f"one `hermes worker --processes {PROCESSES} --concurrency {CONCURRENCY}`, "
                f"{count:,} messages, a random child SIGKILLed every ~0.5 s for {kill_phase:g} s"
            )
        if restarted:
            runs.append("a pool of 4 on a Redis restarted amid 2,000 retry copies")
        if recycled:
            runs.append("`--max-jobs-per-child 100` over 2,000 messages")
        intro = (
            f"`python -m torture.pool_soak{' --only ' + args.only if only else ''}` "
            f"({stamp}, {os.cpu_count()} cores): " + "; ".join(runs) + ". Rules: lost 0, never "
            "more than the pool's children alive, every death answered by a replacement, no "
            "child's exit stopping the pool; recycling handles none twice.\n\n"
        )
        results = ROOT / "torture" / "results"
        results.mkdir(exist_ok=True)
        # A run of some targets (--only) has a file of its own beside the full run's.
        name = "pool.md" if not only else f"pool-{'-'.join(sorted(only))}.md"
        (results / name).write_text(f"{intro}{table(outcomes)}\n")
    return 0 if outcomes and all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
