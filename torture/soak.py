"""SIGKILL soaks and broker restarts: count what every driver loses.

    python -m torture.soak [--quick] [--only filesystem,redis,...]

For each driver: emit numbered messages, run 3 workers, SIGKILL a random
worker every ~0.5 s and start a new one, stop killing, wait until nothing
moves, then count like Jepsen's total-queue checker:

* lost       -- sent (``emit`` returned) but never handled
* duplicated -- handled more than once
* unexpected -- handled but never sent

Each driver runs twice: workers with one handler at a time, and workers
running 4 handlers at once (``Dispatcher(concurrency=4)``), so a kill lands
on several messages in flight. ``--quick`` (CI's smoke run: 400 messages, 4 s
of kills) leaves out the second: the conformance kit already SIGKILLs a
worker with 4 handlers in flight on every driver.

PostgreSQL runs two outages: ``postgres + terminated connections`` ends
every backend of the run's connections on the shared server
(``pg_terminate_backend`` by ``application_name``), which is what a restart
does to a client; ``postgres + restart`` restarts a server of the run's own
(``initdb`` in a temporary directory, a free port), as the shared one must
stay up for everyone else. ``--quick`` runs only the restart.

Redis runs in both delivery modes: ``redis`` (at-most-once, the default) and
``redis-at-least-once`` (leases that run out after 5 s), and at least once
with ``prefetch=16`` (``redis-prefetch``: a killed worker also held what it
claimed ahead).

Rules: at-least-once drivers lose nothing; Redis at-most-once loses at
most one message per kill and handler thread (the ones the killed worker had
popped); nothing is ever unexpected. Broker-restart runs (Redis in both modes,
RabbitMQ, PostgreSQL) restart the server mid-run while an emitter keeps emitting: every
``emit`` either raised or its message is eventually handled. Each restarts a
server of the run's own (Redis and PostgreSQL on a free port, a RabbitMQ node
of its own), never the machine's, which other test runs are using. Exit status 1 if
any rule is broken.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import services  # noqa: E402
from readme import replace_section  # noqa: E402

from hermes.core import Emitter, HermesError, Message, connect  # noqa: E402
from hermes.core.driver import Delivery, Driver, SupportsPurge, SupportsTeardown  # noqa: E402
from hermes.core.drivertools import isolated_url  # noqa: E402

WORKERS = 3
#: Handlers at once in each worker of the second run per driver.
CONCURRENCY = 4


@dataclass
class Outcome:
    target: str
    sent: int
    indeterminate: int
    handled: int
    kills: int
    restarts: int
    lost: int
    duplicated: int
    unexpected: int
    rule: str
    ok: bool
    notes: list[str] = field(default_factory=list)


class Workers:
    """Three worker processes on one URL, any of which can be killed and replaced."""

    def __init__(self, url: str, record: Path, log: Path, work_ms: float, concurrency: int) -> None:
        self.url, self.record, self.log, self.work_ms = url, record, log, work_ms
        self.concurrency = concurrency
        self.procs: list[subprocess.Popen[bytes]] = []
        self.kills = 0

    #: How long a worker may take to stop after SIGTERM before it is killed.
    stop_s = 15.0

    def command(self) -> list[str]:
        """The worker process's command line."""
        return [
            sys.executable,
            "-m",
            "torture.worker",
            self.url,
            str(self.record),
            str(self.work_ms),
            str(self.concurrency),
        ]

    def environ(self) -> dict[str, str]:
        """Its environment: this one, with the repository on ``PYTHONPATH``."""
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }

    def spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            return subprocess.Popen(
                self.command(), env=self.environ(), cwd=ROOT, stdout=log, stderr=log
            )

    def start(self) -> None:
        self.procs = [self.spawn() for _ in range(WORKERS)]

    def kill_one(self, rng: random.Random) -> None:
        index = rng.randrange(len(self.procs))
        victim = self.procs[index]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.kills += 1
        self.procs[index] = self.spawn()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(self.stop_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def handled(record: Path) -> list[int]:
    if not record.exists():
        return []
    return [int(line.split("\t", 1)[0]) for line in record.read_text().splitlines() if line]


def drain(read: Callable[[], Iterable[int]], sent: set[int], quiet_s: float) -> None:
    """Wait until every number in ``sent`` was handled (``read()``), or none for ``quiet_s``."""
    last, last_change = -1, time.monotonic()
    while time.monotonic() - last_change < quiet_s:
        got = set(read())
        if len(got) != last:
            last, last_change = len(got), time.monotonic()
        if sent <= got:
            time.sleep(1.0)  # let duplicates in flight land before counting
            return
        time.sleep(0.2)


def discard(driver: Driver) -> None:
    """Drop the run's namespace where the driver can (PostgreSQL's tables), else empty its
    queues; then close it."""
    with contextlib.suppress(HermesError):
        if isinstance(driver, SupportsTeardown):
            driver.teardown()
        elif isinstance(driver, SupportsPurge):
            driver.purge(None)
    driver.close()


def emit_numbered(driver: Driver, numbers: range) -> None:
    messages = [Message("torture", {"n": n}) for n in numbers]
    # Every driver batches now (core's send_batch over put).
    for i in range(0, len(messages), 100):
        driver.send_batch(messages[i : i + 100])


def soak(
    target: str,
    base_url: str,
    count: int,
    kill_phase_s: float,
    restart: Callable[[], None] | None = None,
    concurrency: int = 1,
) -> Outcome:
    """One soak on one driver; ``restart`` (if given) restarts the broker mid-run."""
    # Each message takes long enough that every handler of the 3 workers is still
    # busy when the kills stop: kills land mid-handler, not on idle workers.
    work_ms = 1000 * kill_phase_s * WORKERS * concurrency / count * 1.2
    rng = random.Random(os.getpid())
    url = isolated_url(base_url, f"torture-{uuid.uuid4().hex[:10]}")
    driver = connect(url)
    caps = driver.capabilities
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hermes-torture-") as tmp:
        record, log = Path(tmp, "record"), Path(tmp, "workers.log")
        emit_numbered(driver, range(count))
        sent = set(range(count))
        indeterminate: set[int] = set()
        workers = Workers(url, record, log, work_ms, concurrency)
        workers.start()
        restarts = 0
        stop_emitting = threading.Event()

        def emit_through_restart() -> None:
            # A second stream, emitted while the broker goes away and comes back.
            emitter, n = Emitter(driver), count
            while not stop_emitting.is_set():
                try:
                    emitter.emit(Message("torture", {"n": n}))
                    sent.add(n)
                except HermesError:
                    indeterminate.add(n)
                    time.sleep(0.05)
                n += 1
                time.sleep(0.005)

        emitter_thread = threading.Thread(target=emit_through_restart, daemon=True)
        if restart is not None:
            emitter_thread.start()
        try:
            deadline = time.monotonic() + kill_phase_s
            restart_at = time.monotonic() + kill_phase_s / 2
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.3, 0.7))
                workers.kill_one(rng)
                if restart is not None and restarts == 0 and time.monotonic() >= restart_at:
                    restart()
                    restarts += 1
            stop_emitting.set()
            if restart is not None:
                emitter_thread.join(10)
            # Drain: until every sent message is handled, or nothing moved for a while.
            quiet_s = max(8.0, 2 * caps.redelivery_timeout_s + 5)
            drain(lambda: handled(record), sent, quiet_s)
        finally:
            workers.stop()
            discard(driver)
        got = handled(record)
        counts = collections.Counter(got)
        delivered = set(counts)
        lost = len(sent - delivered)
        duplicated = sum(1 for c in counts.values() if c > 1)
        unexpected = len(delivered - sent - indeterminate)
        if caps.delivery is Delivery.AT_LEAST_ONCE:
            rule, ok = "lost = 0", lost == 0
        else:
            bound = workers.kills * concurrency
            per_kill = f" x {concurrency}" if concurrency > 1 else ""
            rule, ok = f"lost <= kills{per_kill} ({bound})", lost <= bound
        ok = ok and unexpected == 0
        if not ok:
            notes.append(f"worker log: {log.read_text()[-1500:]}")
        return Outcome(
            target,
            len(sent),
            len(indeterminate),
            len(got),
            workers.kills,
            restarts,
            lost,
            duplicated,
            unexpected,
            rule,
            ok,
            notes,
        )


@contextlib.contextmanager
def private_redis() -> Iterator[tuple[str, Callable[[], None]]]:
    """A redis-server of our own, persisting every write, so a restart keeps the queue."""
    port = services.free_port()
    with tempfile.TemporaryDirectory(prefix="hermes-redis-") as tmp:
        argv = [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            tmp,
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        services.wait_for_port(port, 20, "redis-server", proc)

        def restart() -> None:
            nonlocal proc
            proc.terminate()  # SIGTERM: redis flushes the append-only file and exits
            proc.wait(20)
            time.sleep(1.0)
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
            services.wait_for_port(port, 20, "redis-server", proc)

        try:
            yield f"redis://127.0.0.1:{port}/0", restart
        finally:
            proc.terminate()
            proc.wait(20)


def terminate_postgres_backends(url: str, application_name: str) -> None:
    """End every server backend of ``application_name``: workers' and emitter's alike."""
    import psycopg

    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [application_name],
        )


def postgres_bin(program: str) -> str:
    """``program`` of the newest PostgreSQL under Debian's layout, else from ``$PATH``."""
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{program}"), key=_version)
    if found:
        return str(found[-1])
    on_path = shutil.which(program)
    if on_path is None:
        raise RuntimeError(f"{program} not found: install PostgreSQL's server binaries")
    return on_path


def _version(path: Path) -> int:
    version = path.parent.parent.name
    return int(version) if version.isdigit() else 0


@contextlib.contextmanager
def private_postgres() -> Iterator[tuple[str, Callable[[], None]]]:
    """A PostgreSQL server of our own (trust auth, a free port), and a function restarting it.

    The shared server on 5432 serves every other run and engineer: only a
    server made here may be restarted. initdb refuses to run as root, so as
    root the server runs as the ``postgres`` user.
    """
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    port = services.free_port()
    tmp = tempfile.mkdtemp(prefix="hermes-postgres-")
    data, log = os.path.join(tmp, "data"), os.path.join(tmp, "server.log")
    if as_postgres:
        shutil.chown(tmp, "postgres", "postgres")
    pg_ctl = [*as_postgres, postgres_bin("pg_ctl"), "-D", data, "-l", log, "-w", "-t", "60"]
    options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={tmp}"

    def run(*argv: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout)[-800:]}")

    started = False
    try:
        run(
            *as_postgres,
            postgres_bin("initdb"),
            "-D",
            data,
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",  # a throwaway cluster: no need to wait for its files to reach disk
        )
        run(*pg_ctl, "-o", options, "start")
        started = True

        def restart() -> None:
            # A fast shutdown, as a service manager does it: sessions are
            # terminated and the WAL flushed; clients see the server go away
            # for a second and come back with every committed row.
            run(*pg_ctl, "-m", "fast", "stop")
            time.sleep(1.0)
            run(*pg_ctl, "-o", options, "start")

        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", restart
    finally:
        if started:
            # Immediate: the cluster is thrown away, nothing needs flushing.
            run(*pg_ctl, "-m", "immediate", "stop")
        shutil.rmtree(tmp)


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| run | sent | indeterminate | handled | kills | broker restarts | lost | duplicated "
        "| unexpected | rule | result |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for o in outcomes:
        cells = [
            o.target,
            o.sent,
            o.indeterminate,
            o.handled,
            o.kills,
            o.restarts,
            o.lost,
            o.duplicated,
            o.unexpected,
            o.rule,
            "ok" if o.ok else "BROKEN",
        ]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    count, kill_phase = (400, 4.0) if args.quick else (10_000, 30.0)
    only = set(filter(None, args.only.split(",")))
    outcomes: list[Outcome] = []

    def run(target: str, fn: Callable[[], Outcome]) -> None:
        if only and target.split(" ")[0] not in only:
            return
        print(f"== {target}", flush=True)
        started = time.monotonic()
        outcome = fn()
        outcomes.append(outcome)
        took = time.monotonic() - started
        print(f"{table([outcome]).splitlines()[-1]} ({took:.0f} s)", flush=True)
        for note in outcome.notes:
            print(note)

    def with_service(name: str, concurrency: int = 1) -> Callable[[], Outcome]:
        def go() -> Outcome:
            # The local SQS server (moto) recomputes every queue attribute on each
            # send, so filling it with 10,000 takes many minutes: 2,000 there.
            n = min(count, 2_000) if name == "sqs" else count
            target = f"{name} x{concurrency}" if concurrency > 1 else name
            with services.service_url(name) as url:
                return soak(target, url, n, kill_phase, concurrency=concurrency)

        return go

    def redis_restart(target: str, options: str = "") -> Callable[[], Outcome]:
        def go() -> Outcome:
            with private_redis() as (url, restart):
                return soak(f"{target} + restart", url + options, count // 2, kill_phase, restart)

        return go

    def rabbitmq_restart() -> Outcome:
        # A node of the run's own: restarting the machine's would break other runs' tests.
        with services.restartable_rabbitmq() as node:
            url = node.url + "?queue=hermes"
            return soak("rabbitmq + restart", url, count // 2, kill_phase, node.restart_app)

    def postgres_outage() -> Outcome:
        app = f"hermes-torture-{uuid.uuid4().hex[:8]}"
        with services.service_url("postgres") as url:
            return soak(
                "postgres + terminated connections",
                f"{url}&application_name={app}",
                count // 2,
                kill_phase,
                lambda: terminate_postgres_backends(url, app),
            )

    def postgres_restart() -> Outcome:
        # --quick: a 2 s lease, so that the messages of killed workers come back
        # (and the drain ends) within the smoke run's time.
        options = "lease_timeout=2&poll_interval=0.25" if args.quick else services.POSTGRES_OPTIONS
        with private_postgres() as (url, restart):
            url += f"?table=hermes_torture&{options}"
            return soak("postgres + restart", url, count // 2, kill_phase, restart)

    names = (
        "filesystem",
        "redis",
        "redis-at-least-once",
        "redis-prefetch",
        "rabbitmq",
        "sqs",
        "kafka",
        "postgres",
    )
    for name in names:
        if (ROOT / "drivers" / name.split("-")[0] / "pyproject.toml").exists():
            run(name, with_service(name))
            if not args.quick:
                run(f"{name} x{CONCURRENCY}", with_service(name, CONCURRENCY))
    if (ROOT / "drivers" / "redis" / "pyproject.toml").exists():
        run("redis + restart", redis_restart("redis"))
        leases = f"?{services.REDIS_AT_LEAST_ONCE}"
        run("redis-at-least-once + restart", redis_restart("redis-at-least-once", leases))
    if (ROOT / "drivers" / "rabbitmq" / "pyproject.toml").exists():
        run("rabbitmq + restart", rabbitmq_restart)
    if (ROOT / "drivers" / "postgres" / "pyproject.toml").exists():
        if not args.quick:
            # A restart ends every connection too: the smoke run keeps only that.
            run("postgres + terminated connections", postgres_outage)
        run("postgres + restart", postgres_restart)
    print()
    print(table(outcomes))
    if not args.quick:
        update_readme(outcomes, count, args.only if only else "")
    return 0 if outcomes and all(o.ok for o in outcomes) else 1


def update_readme(outcomes: list[Outcome], count: int, only: str = "") -> None:
    """Write the latest full run's table to ``torture/results/latest.md`` and docs/reliability.md.

    The file is the artifact a reader checks the page's figures against;
    it also keeps what the page leaves out (the failed runs' worker logs).
    A run of some drivers (``only``) replaces their rows in the file's table,
    adds the ones it lacks and keeps the others, saying which rows it wrote
    and when: one driver can be soaked again without soaking them all.
    """
    stamp = time.strftime("%Y-%m-%d %H:%M %Z")
    results = ROOT / "torture" / "results"
    results.mkdir(exist_ok=True)
    latest = results / "latest.md"
    notes = "".join(f"\n{o.target}:\n{note}\n" for o in outcomes for note in o.notes)
    rows = table(outcomes)
    if only and latest.exists():
        intro, rows, old_notes = _merge(latest.read_text(), outcomes)
        intro += (
            f"Rows of {', '.join(o.target for o in outcomes)}: `python -m torture.soak --only "
            f"{only}` ({stamp}, {os.cpu_count()} cores), the same sizes.\n\n"
        )
        notes = old_notes + notes
    else:
        intro = (
            f"`python -m torture.soak` ({stamp}, {os.cpu_count()} cores): {count:,} messages per "
            f"driver (2,000 on the local SQS server, half for the restart runs), {WORKERS} "
            f"workers (one handler at a time; `x{CONCURRENCY}`: {CONCURRENCY} at once), a random "
            "worker SIGKILLed every ~0.5 s for 30 s.\n\n"
        )
    latest.write_text(f"{intro}{rows}\n{notes}")
    intro += "Written with `torture/results/latest.md` by the same run.\n\n"
    problem = replace_section(ROOT / "docs" / "reliability.md", "torture", f"{intro}{rows}\n")
    if problem:
        print(problem)


def _merge(previous: str, outcomes: list[Outcome]) -> tuple[str, str, str]:
    """The intro, the table with ``outcomes`` in place of their runs' rows, and the notes.

    ``previous`` is a ``latest.md`` as :func:`update_readme` writes it: an
    intro (the whole run's, then a line per partial run), the table, notes.
    A row belongs to the run named in its first cell.
    """
    lines = previous.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| run |"))
    last = first
    while last + 1 < len(lines) and lines[last + 1].startswith("|"):
        last += 1
    ours = table(outcomes).splitlines()[2:]
    new_rows = {o.target: row for o, row in zip(outcomes, ours, strict=True)}
    merged = []
    for line in lines[first + 2 : last + 1]:
        target = line.split("|")[1].strip()
        merged.append(new_rows.pop(target, line))
    # Runs the table lacks go where a full run puts them: soaks before restarts.
    outages = next((i for i, line in enumerate(merged) if " + " in line.split("|")[1]), None)
    plain = [row for target, row in new_rows.items() if " + " not in target]
    at = len(merged) if outages is None else outages
    merged[at:at] = plain
    merged.extend(row for target, row in new_rows.items() if " + " in target)
    intro = "".join(f"{line}\n" for line in lines[:first])
    rows = "\n".join([*lines[first : first + 2], *merged])
    notes = "".join(f"{line}\n" for line in lines[last + 1 :])
    return intro, rows, notes


if __name__ == "__main__":
    sys.exit(main())
