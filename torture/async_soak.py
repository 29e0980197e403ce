"""SIGKILL soak of ``hermes worker`` with async handlers at ``--concurrency 500``.

    python -m torture.async_soak [--quick] [--only redis-at-least-once,rabbitmq]

Numbered messages on the broker; three ``hermes worker --concurrency 500``
processes whose only handler is an ``async def`` (it awaits a sleep, then
appends ``<n>\\t<pid>\\t<threads>`` with one ``write`` on an ``O_APPEND`` file,
which survives a SIGKILL); a random worker SIGKILLed every ~0.5 s and
replaced, for a minute (``--quick``: 4 s); then wait until nothing moves and
count like torture.soak: lost (sent, never handled), duplicated, unexpected.
Each message waits long enough that every worker has hundreds of coroutines
in flight when a kill lands.

Targets: Redis at least once (``?delivery=at-least-once``: leases, renewed
while a coroutine runs) and RabbitMQ (prefetch from the concurrency). Rules:
lost 0, unexpected 0, and the async path was taken: no worker ever ran with
more than :data:`MAX_THREADS` threads (a thread per coroutine would be 500).

The workers run through bench.hermes_cli, which blocks the observer plugins
installed in the test environment (with one of them registered, as they
stand, a worker keeps a thread per message). Exit status 1 if a rule is
broken. The full run writes torture/results/async.md (``--only``:
async-<names>.md).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import services  # noqa: E402

from hermes.core import connect  # noqa: E402
from hermes.core.drivertools import isolated_url  # noqa: E402
from torture import soak as sigkill  # noqa: E402 - this module has a soak() of its own

WORKERS = 3
CONCURRENCY = 500
#: More threads than this in a worker means coroutines held threads.
MAX_THREADS = 40


@dataclass
class Outcome:
    target: str
    sent: int
    handled: int
    kills: int
    lost: int
    duplicated: int
    unexpected: int
    most_threads: int
    ok: bool
    notes: list[str] = field(default_factory=list)


class Workers(sigkill.Workers):
    """``hermes worker --concurrency 500`` processes, any of which can be killed and replaced."""

    #: Five hundred coroutines in flight take longer to wind down than a few threads.
    stop_s = 40.0

    def __init__(self, url: str, record: Path, log: Path, work_s: float) -> None:
        super().__init__(url, record, log, work_s * 1000, CONCURRENCY)
        self.work_s = work_s

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "bench.hermes_cli", "worker", "--url", self.url,
            "--handlers", "torture.async_handlers:HANDLERS",
            "--concurrency", str(self.concurrency), "--no-heartbeat",
        ]  # fmt: skip

    def environ(self) -> dict[str, str]:
        return {
            **super().environ(),
            "ASYNC_SOAK_RECORD": str(self.record),
            "ASYNC_SOAK_WORK_S": str(self.work_s),
        }


def lines(record: Path) -> list[tuple[int, int]]:
    if not record.exists():
        return []
    found = []
    for line in record.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            found.append((int(parts[0]), int(parts[2])))
    return found


def soak(target: str, base_url: str, count: int, kill_phase_s: float) -> Outcome:
    # Every worker keeps CONCURRENCY coroutines in flight until the kills stop.
    work_s = kill_phase_s * WORKERS * CONCURRENCY / count * 1.2
    rng = random.Random(os.getpid())
    url = isolated_url(base_url, f"torture-async-{uuid.uuid4().hex[:10]}")
    driver = connect(url)
    caps = driver.capabilities
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hermes-torture-") as tmp:
        record, log = Path(tmp, "record"), Path(tmp, "workers.log")
        sigkill.emit_numbered(driver, range(count))
        sent = set(range(count))
        workers = Workers(url, record, log, work_s)
        workers.start()
        try:
            deadline = time.monotonic() + kill_phase_s
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.3, 0.7))
                workers.kill_one(rng)
            quiet_s = max(10.0, 2 * caps.redelivery_timeout_s + 5 + work_s)
            sigkill.drain(lambda: (n for n, _ in lines(record)), sent, quiet_s)
        finally:
            workers.stop()
            sigkill.discard(driver)
        seen = lines(record)
        counts = collections.Counter(n for n, _ in seen)
        delivered = set(counts)
        lost = len(sent - delivered)
        duplicated = sum(1 for c in counts.values() if c > 1)
        unexpected = len(delivered - sent)
        most_threads = max((threads for _, threads in seen), default=0)
        ok = lost == 0 and unexpected == 0 and 0 < most_threads <= MAX_THREADS
        if not ok:
            notes.append(f"worker log: {log.read_text(errors='replace')[-1500:]}")
        return Outcome(
            target,
            len(sent),
            len(seen),
            workers.kills,
            lost,
            duplicated,
            unexpected,
            most_threads,
            ok,
            notes,
        )


def table(outcomes: list[Outcome], count: int, kill_phase_s: float) -> str:
    head = (
        f"{WORKERS} x hermes worker --concurrency {CONCURRENCY} (async def handler), "
        f"{count:,} messages, a random worker SIGKILLed every ~0.5 s for {kill_phase_s:g} s; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n"
        "| target | sent | handled | kills | lost | duplicated | unexpected "
        "| most threads in a worker | rule | ok |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n"
    )
    rows = [
        f"| {o.target} | {o.sent:,} | {o.handled:,} | {o.kills} | {o.lost} | {o.duplicated:,} "
        f"| {o.unexpected} | {o.most_threads} | lost = 0, threads <= {MAX_THREADS} "
        f"| {'yes' if o.ok else 'NO'} |"
        for o in outcomes
    ]
    return head + "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI's smoke run")
    parser.add_argument("--only", default="", help="comma-separated targets")
    args = parser.parse_args()
    count, kill_phase_s = (2000, 4.0) if args.quick else (20000, 60.0)
    targets = {
        "redis-at-least-once": lambda: services.ensure_redis() + "?delivery=at-least-once",
        "rabbitmq": services.ensure_rabbitmq,
    }
    # The torture session passes one --only to every soak: names of other soaks' targets
    # are not this one's (and a list of none of this one's runs nothing here).
    only = [t for t in args.only.split(",") if t]
    wanted = [t for t in only if t in targets] if only else list(targets)
    outcomes = []
    for target in wanted:
        print(f"== {target}", flush=True)
        outcome = soak(target, targets[target](), count, kill_phase_s)
        print(
            f"   sent {outcome.sent} handled {outcome.handled} kills {outcome.kills} "
            f"lost {outcome.lost} duplicated {outcome.duplicated} unexpected "
            f"{outcome.unexpected} most threads {outcome.most_threads} ok {outcome.ok}",
            flush=True,
        )
        for note in outcome.notes:
            print(note)
        outcomes.append(outcome)
    text = table(outcomes, count, kill_phase_s)
    print(text)
    if not args.quick:
        name = "async.md" if not args.only else f"async-{args.only.replace(',', '-')}.md"
        out = ROOT / "torture" / "results" / name
        out.write_text("# SIGKILL soak: async handlers at --concurrency 500\n\n" + text)
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
