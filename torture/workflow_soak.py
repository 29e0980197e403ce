"""Workflows under SIGKILLs: groups of members, a callback each, workers killed; count.

    python -m torture.workflow_soak [--quick] [--only redis-at-least-once,rabbitmq,postgres]

Each run starts ``W`` workflows, each ``chain(group(M members), callback)``
with the callback receiving the members' outcomes, on one broker (Redis at
least once, RabbitMQ with its records on Redis, PostgreSQL with its records
in its own database). Four ``hermes worker --results-url`` processes run
them; a random one is SIGKILLed every ~2 s and replaced, then the run waits
until every callback ran or nothing moves. A member works a little, then
appends one line (``m``, workflow, member, time); a callback appends one
(``c``, workflow, how many outcomes it got, how many succeeded, time), each
with one write on an O_APPEND file, which survives a SIGKILL.

Rules: every member ran (lost 0); every workflow's callback ran exactly once
(a line each), after the last line of its members, with all ``M`` outcomes
succeeded; every workflow's state says ``succeeded``. A member killed
mid-handler runs again (at least once): members may show twice, callbacks
may not.

Exit status 1 if a rule is broken. A full run writes
torture/results/workflows.md (with ``--only``: workflows-<names>.md).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import services  # noqa: E402

from hermes.core import connect  # noqa: E402
from hermes.core.jobs import Jobs  # noqa: E402
from hermes.core.workflows import Workflows, chain, group, job  # noqa: E402
from torture.pool_soak import namespace  # noqa: E402
from torture.records_soak import JOBS_PREAMBLE, Workers, report  # noqa: E402

WORKERS = 4

JOBS = (
    JOBS_PREAMBLE
    + """

def member(message):
    time.sleep(_work_s)
    w, i = message.payload["w"], message.payload["i"]
    os.write(_fd, f"m\\t{w}\\t{i}\\t{time.time():.6f}\\n".encode())
    return Result(i)


def callback(message):
    outcomes = message.payload["all"]["result"]
    ok = sum(1 for o in outcomes if o and o["state"] == "succeeded")
    w = message.payload["w"]
    os.write(_fd, f"c\\t{w}\\t{len(outcomes)}\\t{ok}\\t{time.time():.6f}\\n".encode())


HANDLERS = {"member": member, "callback": callback}
"""
)


@dataclass
class Outcome:
    run: str
    workflows: int
    members: int
    kills: int
    members_lost: int
    members_twice: int
    callbacks: int
    callbacks_twice: int
    early: int
    wrong: int
    ok: bool
    note: str = ""


def lines(record: Path) -> list[list[str]]:
    if not record.exists():
        return []
    return [line.split("\t") for line in record.read_text().splitlines() if line]


def run(
    target: str, base_url: str, results_base: str, count: int, size: int, kill_s: float
) -> Outcome:
    work_ms = 1000 * kill_s * WORKERS / (count * size) * 1.2
    rng = random.Random(os.getpid())
    with (
        namespace(base_url, "wf-soak") as url,
        namespace(results_base, "wf-soak-results") as results_url,
        tempfile.TemporaryDirectory(prefix="hermes-wf-") as tmp,
        contextlib.closing(Jobs(results_url)) as jobs,
        connect(url) as driver,
    ):
        flows = Workflows(driver, jobs)
        lease_s = driver.capabilities.redelivery_timeout_s or 5.0
        workers = Workers(
            url, results_url, Path(tmp), work_ms, WORKERS, jobs=JOBS, module="wf_soak_jobs"
        )
        handles = []
        try:
            for w in range(count):
                members = group(job("member", {"w": w, "i": i}) for i in range(size))
                handles.append(
                    flows.start(chain(members, job("callback", {"w": w}, receive="all")))
                )
            end = time.monotonic() + kill_s
            while time.monotonic() < end:
                time.sleep(rng.uniform(1.5, 2.5))
                workers.kill_one(rng)
            last, quiet_since = -1, time.monotonic()
            while time.monotonic() - quiet_since < max(15.0, 3 * lease_s + 5):
                got = sum(1 for f in lines(workers.record) if f[0] == "c")
                if got != last:
                    last, quiet_since = got, time.monotonic()
                if got >= count:
                    time.sleep(2.0)  # a second run of a callback would land by now
                    break
                time.sleep(0.2)
        finally:
            codes = workers.stop()
        fields = lines(workers.record)
        member_runs = collections.Counter((int(f[1]), int(f[2])) for f in fields if f[0] == "m")
        last_member: dict[int, float] = {}
        for f in fields:
            if f[0] == "m":
                last_member[int(f[1])] = max(last_member.get(int(f[1]), 0.0), float(f[3]))
        callbacks = collections.Counter(int(f[1]) for f in fields if f[0] == "c")
        early = sum(
            1 for f in fields if f[0] == "c" and float(f[4]) < last_member.get(int(f[1]), 0)
        )
        wrong = sum(1 for f in fields if f[0] == "c" and (int(f[2]), int(f[3])) != (size, size))
        states = collections.Counter(h.state for h in handles)
        wrong += count - states.get("succeeded", 0)
        lost = count * size - len(member_runs)
        missing = sum(1 for w in range(count) if callbacks[w] == 0)
        twice = sum(1 for c in callbacks.values() if c > 1)
        ok = (
            lost == 0
            and missing == 0
            and twice == 0
            and early == 0
            and wrong == 0
            and all(code == 0 for code in codes)
        )
        note = (
            "" if ok else f"states {dict(states)}, exit codes {codes}\n{workers.output()[-3000:]}"
        )
        return Outcome(
            target,
            count,
            count * size,
            workers.kills,
            lost,
            sum(1 for c in member_runs.values() if c > 1),
            sum(callbacks.values()),
            twice,
            early,
            wrong + missing,
            ok,
            note,
        )


def table(outcomes: list[Outcome]) -> str:
    lines_ = [
        "| run | workflows | members | kills | members lost | members run twice | callbacks run "
        "| callbacks run twice | callbacks before their members' end | wrong outcomes or states "
        "| result |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for o in outcomes:
        cells = [o.run, o.workflows, o.members, o.kills, o.members_lost, o.members_twice]
        cells += [o.callbacks, o.callbacks_twice, o.early, o.wrong, "ok" if o.ok else "BROKEN"]
        lines_.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines_)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI's smoke run: Redis only")
    parser.add_argument("--only", default="", help="target names")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    count, size, kill_s = (20, 5, 6.0) if args.quick else (200, 20, 40.0)
    targets = (
        ["redis-at-least-once"] if args.quick else ["redis-at-least-once", "rabbitmq", "postgres"]
    )
    outcomes: list[Outcome] = []
    with services.service_url("redis") as redis_url:
        for target in targets:
            if only and target not in only:
                continue
            print(
                f"== {target}: {count} workflows of {size}, SIGKILL every ~2 s for {kill_s:g} s",
                flush=True,
            )
            with services.service_url(target) as url:
                results = url if target == "postgres" else redis_url
                outcomes.append(run(target, url, results, count, size, kill_s))
            print(table(outcomes[-1:]).splitlines()[-1], flush=True)
    intro = ""
    if not args.quick:
        stamp = time.strftime("%Y-%m-%d %H:%M %Z")
        intro = (
            f"`python -m torture.workflow_soak` ({stamp}, {os.cpu_count()} cores): per run "
            f"{count} workflows, each `chain(group({size} members), callback)`, "
            f"{WORKERS} `hermes worker --results-url` processes, a random one SIGKILLed "
            f"every ~2 s for {kill_s:g} s. Records on Redis, PostgreSQL's in PostgreSQL.\n\n"
        )
    return report(outcomes, table(outcomes), intro, "workflows", only)


if __name__ == "__main__":
    sys.exit(main())
