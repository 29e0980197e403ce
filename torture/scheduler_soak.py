"""Scheduler soak: six schedulers, one SIGKILLed and restarted every ~7 s; count every tick.

    python -m torture.scheduler_soak [--quick] [--minutes M]

Three ``hermes`` schedulers claim on one Redis and three on one filesystem
queue directory, all running the same schedule: a 1-second interval entry
(``catch_up="all"``) and an every-minute cron entry. Every ~7 s one
scheduler of each group is SIGKILLed and a new one started. Each tick's
message carries its tick key; every emit is appended, with the time it was
made, to a log the soak reads at the end (the emit target is that log, not a
queue: what is measured is the scheduler and its claims, not a driver's
delivery). Rules, for the ticks due while the soak ran:

* missing    -- 0: every tick was emitted by some scheduler
* duplicated -- 0: no tick key was emitted twice, over the whole run
* late       -- no emit more than 2 s after its tick

``--quick`` is CI's 20-second smoke run. A full run (5 minutes) writes its
table to ``torture/results/scheduler.md``. Exit status 1 if a rule is broken.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hermes.core.driver import SupportsClaim

#: A tick emitted later than this after it was due breaks the rules.
LATE_LIMIT_S = 2.0
#: Schedulers per broker.
SCHEDULERS = 3
#: Ticks this close to the start or the end are not counted (schedulers starting, stopping).
EDGE_S = 3.0
RESULTS = Path(__file__).parent / "results" / "scheduler.md"


# The child: one scheduler ---------------------------------------------------------


def _child(target: str, location: str, sink: str) -> None:
    import logging

    from hermes.core.driver import Capabilities, Consumer, Delay, Delivery, Driver, Outgoing
    from hermes.core.schedule import Schedule, Scheduler

    class Sink(Driver):
        """Appends each body and when it was put to ``sink`` (O_APPEND: one write per line)."""

        capabilities = Capabilities(
            delivery=Delivery.AT_LEAST_ONCE,
            delay=Delay.IGNORED,
            priorities=False,
            competing_consumers=False,
        )

        def put(self, items: Sequence[Outgoing], priority: int = 100) -> None:
            lines = "".join(
                json.dumps({"body": item.body.decode(), "at": time.time()}) + "\n" for item in items
            )
            fd = os.open(sink, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, lines.encode())
            finally:
                os.close(fd)

        def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
            raise NotImplementedError("the soak's sink is written, never read")

    claims: SupportsClaim = _claims(target, location)
    schedule = Schedule()
    key_payload = {"payload": lambda tick: {"key": tick.key}}
    schedule.every(seconds=1, type="soak", name="second", catch_up="all", **key_payload)  # type: ignore[arg-type]
    schedule.cron("* * * * *", type="soak", name="minute", **key_payload)  # type: ignore[arg-type]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    scheduler = Scheduler(schedule, Sink(), claims=claims, catch_up_window_s=30)
    signal.signal(signal.SIGTERM, lambda signum, frame: scheduler.stop())
    scheduler.run()


def _claims(target: str, location: str) -> SupportsClaim:
    """The broker's claims: its driver, as ``hermes scheduler`` uses it."""
    from hermes.core import connect
    from hermes.core.driver import SupportsClaim

    url = location if target == "redis" else Path(location).as_uri()
    driver = connect(url)
    if not isinstance(driver, SupportsClaim):
        raise SystemExit(f"{driver!r} cannot claim: the soak needs a driver that can")
    return driver


# The parent: start, kill, restart, count --------------------------------------------


@dataclass
class Group:
    target: str
    location: str
    sink: Path
    logs: Path
    processes: list[subprocess.Popen[bytes]]
    kills: int = 0

    def start_one(self) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{self.target}-{time.monotonic_ns()}.log", "wb")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torture.scheduler_soak",
                "--child",
                self.target,
                self.location,
                str(self.sink),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parent.parent,
        )
        log.close()
        self.processes.append(process)
        return process

    def kill_one(self, rng: random.Random) -> None:
        victim = rng.choice(self.processes)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.processes.remove(victim)
        self.kills += 1
        self.start_one()

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Verdict:
    target: str
    expected: int
    emitted: int
    missing: list[str]
    duplicated: dict[str, int]
    late: list[tuple[str, float]]
    max_late_s: float
    kills: int
    started: float

    @property
    def ok(self) -> bool:
        return not self.missing and not self.duplicated and not self.late

    def row(self) -> str:
        return (
            f"| {self.target} | {self.expected} | {self.emitted} | {len(self.missing)} | "
            f"{len(self.duplicated)} | {self.max_late_s:.3f} s | {self.kills} | "
            f"{'ok' if self.ok else 'BROKEN'} |"
        )


def expected_keys(started: float, ended: float) -> dict[str, float]:
    """Every tick key due in ``[started, ended]`` -> its time, for both entries."""
    from hermes.core.schedule import Schedule

    schedule = Schedule()
    schedule.every(seconds=1, type="soak", name="second")
    schedule.cron("* * * * *", type="soak", name="minute")
    keys: dict[str, float] = {}
    for entry in schedule:
        ticks, _ = entry.ticks_between(started, ended, limit=1_000_000)
        keys.update({entry.tick(at).key: at for at in ticks})
    return keys


def judge(group: Group, started: float, ended: float) -> Verdict:
    emitted: collections.Counter[str] = collections.Counter()
    emitted_at: dict[str, float] = {}
    for line in group.sink.read_text().splitlines():
        record = json.loads(line)
        key = json.loads(record["body"])["message"]["payload"]["key"]
        emitted[key] += 1
        emitted_at.setdefault(key, record["at"])
    expected = expected_keys(started + EDGE_S, ended - EDGE_S)
    late = [(key, emitted_at[key] - at) for key, at in expected.items() if key in emitted_at]
    return Verdict(
        target=group.target,
        expected=len(expected),
        emitted=sum(1 for key in expected if key in emitted),
        missing=sorted(key for key in expected if key not in emitted),
        duplicated={key: n for key, n in emitted.items() if n > 1},
        late=[(key, s) for key, s in late if s > LATE_LIMIT_S],
        max_late_s=max((s for _, s in late), default=0.0),
        kills=group.kills,
        started=started,
    )


def soak(
    duration_s: float, kill_every_s: float, workdir: Path, redis_url: str | None = None
) -> list[Verdict]:
    rng = random.Random()
    namespace = f"scheduler-soak-{secrets.token_hex(4)}:"
    redis_url = redis_url or os.environ.get("HERMES_SOAK_REDIS", "redis://127.0.0.1:6379/0")
    groups = [
        Group("redis", f"{redis_url}?prefix={namespace}", workdir / "redis.jsonl", workdir, []),
        Group("filesystem", str(workdir / "queue"), workdir / "filesystem.jsonl", workdir, []),
    ]
    for group in groups:
        group.sink.touch()
        for _ in range(SCHEDULERS):
            group.start_one()
    # Importing every driver plugin takes seconds when six processes start on two
    # cores: the run starts once each group's schedulers emit.
    deadline = time.monotonic() + 60
    while not all(g.sink.stat().st_size for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    started = time.time()
    next_kill = {g.target: time.monotonic() + rng.uniform(0.5, 1.5) * kill_every_s for g in groups}
    try:
        while time.time() - started < duration_s:
            time.sleep(0.1)
            for group in groups:
                if time.monotonic() >= next_kill[group.target]:
                    group.kill_one(rng)
                    next_kill[group.target] = (
                        time.monotonic() + rng.uniform(0.7, 1.3) * kill_every_s
                    )
    finally:
        ended = time.time()
        for group in groups:
            group.stop()
    return [judge(group, started, ended) for group in groups]


def table(verdicts: Sequence[Verdict], duration_s: float) -> str:
    lines = [
        f"Scheduler soak: {duration_s:.0f} s, {SCHEDULERS} schedulers per broker, one SIGKILLed "
        "and restarted every ~7 s; a 1-second interval entry (catch_up all) and an "
        "every-minute cron entry.",
        "",
        "| broker | ticks due | emitted | missing | duplicated | latest emit | kills | verdict |",
        "|---|---|---|---|---|---|---|---|",
        *(v.row() for v in verdicts),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torture.scheduler_soak")
    parser.add_argument("--quick", action="store_true", help="CI's 20-second run")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--child", nargs=3, metavar=("TARGET", "LOCATION", "SINK"))
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    duration_s = 20.0 if args.quick else args.minutes * 60
    keep = os.environ.get("HERMES_SOAK_KEEP")  # a directory: the logs stay there for a look
    with tempfile.TemporaryDirectory(prefix="hermes-scheduler-soak-") as tmp:
        workdir = Path(keep) if keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        verdicts = soak(duration_s, 7.0, workdir)
        print(f"started {time.strftime('%H:%M:%S', time.localtime(verdicts[0].started))}")
        text = table(verdicts, duration_s)
        print(text, end="")
        for verdict in verdicts:
            for key in verdict.missing[:10]:
                print(f"{verdict.target}: missing {key}")
            for key, n in list(verdict.duplicated.items())[:10]:
                print(f"{verdict.target}: {key} emitted {n} times")
            for key, late_s in verdict.late[:10]:
                print(f"{verdict.target}: {key} emitted {late_s:.2f} s late")
        if not args.quick:
            RESULTS.write_text(f"# Scheduler soak\n\n{text}")
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
