"""Hermes as users run it, against the raw clients and Celery, RQ, Dramatiq and procrastinate.

    python -m bench.run [--quick] [--only redis,rabbitmq,...] [--jobs noop,incr,sleep]
    python -m bench.run --render    # the reports of bench/results/latest.json, measuring nothing

Every system runs the same jobs (``bench/jobs.py``: a no-op, one Redis INCR,
a 20 ms sleep) in one worker process against the same broker. Hermes runs as
``hermes worker`` (with what it watches by default: on Redis the shutdown
key); on Redis a bare Dispatcher runs beside it, and ``hermes worker`` with
each observer plugin (hermes-opentelemetry, hermes-sentry: installed, nothing
configured) against the same worker without it. On PostgreSQL the raw loop
runs the driver's own claim and delete statements, and procrastinate (in a
database of its own on the same server) is the peer. Each peer runs a small grid
of documented settings; the fastest is reported with the setting that won,
and the defaults beside it. Figures go to ``bench/results/`` as Markdown,
JSON, a PNG chart and a profile of ``hermes worker``; a full run also writes
the generated sections of docs/performance.md and of each driver's README.

Nothing here asserts a time: ``--quick`` is a smoke run that proves every row
can be measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import services  # noqa: E402
from readme import replace_section  # noqa: E402

#: The documentation page whose generated sections (bench, scaling) a full run rewrites.
PERFORMANCE_PAGE = ROOT / "docs" / "performance.md"

from bench.hermes_cli import block_observers, observers  # noqa: E402
from hermes.core import Emitter, Message, connect  # noqa: E402
from hermes.core.driver import Delay, DriverUrl, SupportsTeardown  # noqa: E402
from hermes.core.drivertools import isolated_url  # noqa: E402

JOBS = ("noop", "incr", "sleep")
JOB_LABELS = {"noop": "no-op", "incr": "INCR", "sleep": "sleep 20 ms"}
#: Threads (or ``hermes worker --concurrency``) for the I/O-bound job, where a system has them.
IO_CONCURRENCY = 8
#: The suffix of a Hermes row measured with ``--concurrency`` on a job that is not I/O-bound.
CONCURRENT = f"--concurrency {IO_CONCURRENCY}"
BARE = "hermes Dispatcher (bare)"
WORKER = "hermes worker"
#: The observer plugins measured on Redis (no-op) against ``hermes worker`` without them:
#: installed and loaded, with nothing configured (no TracerProvider, no Sentry DSN).
OBSERVED = ("opentelemetry", "sentry")


#: ``hermes worker`` without its heartbeat thread, beside the default (heartbeats on).
NO_HEARTBEAT = f"{WORKER} --no-heartbeat"


def observed_system(plugin: str) -> str:
    return f"{WORKER} + hermes-{plugin}"


def handle_metric(job: str) -> str:
    return f"handle {JOB_LABELS[job]}"


# The run ------------------------------------------------------------------------


@dataclass
class Row:
    broker: str
    system: str
    metric: str
    value: float
    unit: str
    note: str = ""


@dataclass
class Run:
    """Every sample taken; a row's value is the median of its samples."""

    quick: bool
    n: int
    n_sleep: int
    rounds: int
    machine: str
    started: str
    load: list[str] = field(default_factory=list)
    samples: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    meta: dict[tuple[str, str, str], tuple[str, str]] = field(default_factory=dict)
    #: (broker, system) -> (messages per sample, rounds) where they differ from the run's.
    sizes: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    #: ``hermes worker`` arguments ("" or "-v") -> (part, share of the time) of its profile.
    profiles: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: What a section could not measure, and why (not an error: said in the report).
    notes: list[str] = field(default_factory=list)

    def add(
        self, broker: str, system: str, metric: str, value: float, unit: str, note: str = ""
    ) -> None:
        key = (broker, system, metric)
        self.samples.setdefault(key, []).append(value)
        self.meta.setdefault(key, (unit, note))
        print(f"  {broker:<10} {system:<44} {metric:<20} {value:>10,.1f} {unit} {note}", flush=True)

    @property
    def rows(self) -> list[Row]:
        rows = []
        for key, values in self.samples.items():
            unit, note = self.meta[key]
            if len(values) > 1:
                note = f"{note}; median of {len(values)}".lstrip("; ")
            rows.append(Row(*key, round(statistics.median(values), 3), unit, note))
        return rows

    def value(self, broker: str, system: str, metric: str) -> float | None:
        values = self.samples.get((broker, system, metric))
        return statistics.median(values) if values else None

    def to_json(self) -> str:
        return json.dumps(
            {
                "quick": self.quick,
                "n": self.n,
                "n_sleep": self.n_sleep,
                "rounds": self.rounds,
                "machine": self.machine,
                "started": self.started,
                "load": self.load,
                "rows": [asdict(row) for row in self.rows],
                "samples": [
                    [*key, values, *self.meta[key]] for key, values in self.samples.items()
                ],
                "sizes": [[*key, *size] for key, size in self.sizes.items()],
                "targets": [asdict(t) for t in targets(self)],
                "profiles": self.profiles,
                "errors": self.errors,
                "notes": self.notes,
            },
            indent=2,
        )


def load_run(path: Path) -> Run:
    """The run a ``latest.json`` holds, to render its reports again."""
    data = json.loads(path.read_text())
    run = Run(
        data["quick"], data["n"], data["n_sleep"], data["rounds"], data["machine"],
        data["started"], data["load"],
    )  # fmt: skip
    notes = {(r["broker"], r["system"], r["metric"]): (r["unit"], r["note"]) for r in data["rows"]}
    for broker, system, metric, values, *meta in data["samples"]:
        key = (broker, system, metric)
        run.samples[key] = values
        unit, note = meta or notes[key]
        run.meta[key] = (unit, re.sub(r"(; )?median of \d+$", "", note))
    run.sizes = {(b, s): (n, r) for b, s, n, r in data["sizes"]}
    run.profiles = {flags: [tuple(p) for p in split] for flags, split in data["profiles"].items()}
    run.errors = data["errors"]
    run.notes = data.get("notes", [])
    return run


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, {platform.system()}"


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


# Worker processes -----------------------------------------------------------------


@dataclass
class Env:
    """What every worker and emitter process of one run is told."""

    redis_url: str
    incr_key: str

    def make(self, n: int, out: Path, job: str, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            "HERMES_BENCH_N": str(n),
            "HERMES_BENCH_OUT": str(out),
            "HERMES_BENCH_JOB": job,
            "HERMES_BENCH_REDIS": self.redis_url,
            "HERMES_BENCH_INCR_KEY": self.incr_key,
            **extra,
        }
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        return env


def wait_result(
    out: Path, proc: subprocess.Popen[bytes], timeout_s: float, log: Path | None = None
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if out.exists():
            return dict(json.loads(out.read_text()))
        if proc.poll() is not None and not out.exists():
            raise RuntimeError(f"worker exited with {proc.returncode} before finishing{tail(log)}")
        time.sleep(0.05)
    raise RuntimeError(f"worker did not finish within {timeout_s:.0f} s{tail(log)}")


def wait_tally(
    tally: Path, n: int, proc: subprocess.Popen[bytes], timeout_s: float
) -> dict[str, Any]:
    """The result of a worker whose jobs append their start times to ``tally``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        times = [float(x) for x in tally.read_text().split()] if tally.exists() else []
        if len(times) >= n:
            return {"first": min(times), "last": max(times), "count": len(times)}
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode} after {len(times)} of {n}")
        time.sleep(0.1)
    raise RuntimeError(f"worker did not finish within {timeout_s:.0f} s")


def tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    lines = log.read_text(errors="replace").splitlines()[-5:]
    return "; its output ends: " + " | ".join(lines) if lines else ""


@contextlib.contextmanager
def worker(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    # Output goes to a file, as a process manager would keep it: a pipe nobody
    # reads would stall a worker that logs.
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def rate(result: dict[str, Any]) -> float:
    span = result["last"] - result["first"]
    return (result["count"] - 1) / span if span > 0 else float("inf")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# Hermes -------------------------------------------------------------------------


def hermes_command() -> list[str]:
    """``hermes``, the console script users run (from this interpreter's environment)."""
    script = Path(sys.executable).parent / "hermes"
    return [str(script)] if script.exists() else [sys.executable, "-m", "hermes.core.cli"]


def worker_command(observe: str | None = None) -> list[str]:
    """``hermes`` with every observer plugin blocked but ``observe`` (see bench.hermes_cli).

    Every ``hermes worker`` row runs through it, so a row measures the same
    worker whichever plugins the venv holds, and an observed row pays the same
    start-up as the row it is compared with.
    """
    return [sys.executable, "-m", "bench.hermes_cli", *(["--observe", observe] if observe else [])]


def io_concurrency_args() -> list[str]:
    """``--concurrency 8`` for the I/O-bound job once ``hermes worker`` offers it."""
    help_text = subprocess.run(
        [*hermes_command(), "worker", "--help"], capture_output=True, text=True, check=True
    ).stdout
    return ["--concurrency", str(IO_CONCURRENCY)] if "--concurrency" in help_text else []


@dataclass(frozen=True)
class HermesSetting:
    """One Hermes configuration of a broker: a label and the URL options it adds."""

    label: str
    options: str = ""

    def system(self, bare: bool = False, concurrent: bool = False) -> str:
        base = BARE if bare else WORKER
        name = f"{base} {self.label}".strip()
        return f"{name} {CONCURRENT}" if concurrent else name

    def url(self, base_url: str) -> str:
        url = isolated_url(base_url, f"bench-{uuid.uuid4().hex[:8]}")
        if self.options:
            url += ("&" if "?" in url else "?") + self.options
        return url


@dataclass
class RawBeside:
    """The raw client's emit and consume rows, taken beside Hermes's (see ``Hermes.handle``)."""

    emit: Callable[[], None]
    consume: Callable[[], None]
    #: Whether each raw row goes right before its Hermes row (else right after).
    first: bool


class Hermes:
    """The Hermes rows of one broker."""

    def __init__(self, run: Run, env: Env, io_args: list[str]) -> None:
        self.run = run
        self.env = env
        self.io_args = io_args
        #: Messages per latency row, and how long an idle worker settles first.
        self.latency_count, self.settle_s = (20, 0.5) if run.quick else (200, 1.5)

    def handle(
        self,
        broker: str,
        setting: HermesSetting,
        base_url: str,
        job: str,
        n: int,
        *,
        bare: bool = False,
        measure_emit: bool = False,
        concurrent: bool = False,
        observe: str | None = None,
        heartbeat: bool = True,
        raw: RawBeside | None = None,
    ) -> None:
        """Fill a fresh queue with ``n`` messages, then time one worker draining it.

        ``concurrent``: the row of ``hermes worker --concurrency 8`` (the I/O-bound
        job always runs so), beside the serial one, as the peers' grid has 1 and 8 threads.
        ``observe``: the row of ``hermes worker`` with that observer plugin registered.
        ``heartbeat=False``: the row of ``hermes worker --no-heartbeat``.
        ``raw``: with ``measure_emit``, the raw client's emit and consume rows, each
        taken right before (``raw.first``) or right after its Hermes row: what the
        broker is busy with (its clean-up after the last worker) weighs on both alike.
        """
        url = setting.url(base_url)
        system = observed_system(observe) if observe else setting.system(bare, concurrent)
        if not heartbeat:
            system = NO_HEARTBEAT
        driver = connect(url)
        try:
            started = time.perf_counter()
            if measure_emit:
                if raw is not None and raw.first:
                    raw.emit()
                    started = time.perf_counter()
                emitter = Emitter(driver)
                for i in range(n):
                    emitter.emit(Message("bench", {"i": i}))
                elapsed = time.perf_counter() - started
                self.run.add(broker, system, "emit", n / elapsed, "msgs/s", "one by one")
                if raw is not None and not raw.first:
                    raw.emit()
            else:
                fill(driver, n)
            with tempfile.TemporaryDirectory() as tmp:
                out, log = Path(tmp) / "result.json", Path(tmp) / "worker.log"
                if bare:
                    argv = [sys.executable, "-m", "bench.hermes_worker", url, str(n)]
                    note = "no CLI, no logging set up, no shutdown watch"
                else:
                    argv = [*worker_command(observe), "worker", "--url", url]
                    argv += ["--handlers", "bench.jobs:register", "--max-items", str(n)]
                    note = "as users run it"
                    if observe:
                        note += f", hermes-{observe} registered, nothing configured"
                    if not heartbeat:
                        argv.append("--no-heartbeat")
                    if (job == "sleep" or concurrent) and self.io_args:
                        argv += self.io_args
                        note += f", {' '.join(self.io_args)}"
                if raw is not None and raw.first:
                    raw.consume()
                with worker(argv, self.env.make(n, out, job), log) as proc:
                    result = wait_result(out, proc, 600, log)
                if raw is not None and not raw.first:
                    raw.consume()
            self.run.add(broker, system, handle_metric(job), rate(result), "msgs/s", note)
        finally:
            purge_and_close(driver)

    def emit_batched(self, broker: str, setting: HermesSetting, base_url: str, n: int) -> None:
        driver = connect(setting.url(base_url))
        try:
            batch = [Message("bench", {"i": i}) for i in range(n)]
            started = time.perf_counter()
            for i in range(0, n, 100):
                driver.send_batch(batch[i : i + 100])
            elapsed = time.perf_counter() - started
            self.run.add(
                broker, setting.system(), "emit batched", n / elapsed, "msgs/s", "batches of 100"
            )
        finally:
            purge_and_close(driver)

    def latency(self, broker: str, setting: HermesSetting, base_url: str) -> None:
        """Emit->handle of an idle ``hermes worker`` at light load."""
        url = setting.url(base_url)
        system = setting.system()
        count = self.latency_count
        driver = connect(url)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                out, log = Path(tmp) / "result.json", Path(tmp) / "worker.log"
                argv = [*worker_command(), "worker", "--url", url]
                argv += ["--handlers", "bench.jobs:register", "--max-items", str(count)]
                with worker(argv, self.env.make(count, out, "noop"), log) as proc:
                    wait_until_logged(log, "Reading priorit", proc, 120)
                    time.sleep(self.settle_s)  # let it settle into its idle wait
                    emitter = Emitter(driver)
                    for _ in range(count):
                        emitter.emit(Message("bench", {"sent": time.time()}))
                        time.sleep(0.01)  # light load: 100 msgs/s at most
                    result = wait_result(out, proc, 120, log)
        finally:
            purge_and_close(driver)
        lat = sorted(result["latencies"])
        note = "emit -> handler start, 100 msgs/s"
        self.run.add(broker, system, "latency p50", 1000 * statistics.median(lat), "ms", note)
        p99 = 1000 * lat[int(0.99 * (len(lat) - 1))]
        self.run.add(broker, system, "latency p99", p99, "ms", note)


@contextlib.contextmanager
def broker_url(broker: str) -> Iterator[str]:
    """A base URL of ``broker`` with its server up for the duration (a temporary directory
    for the filesystem driver)."""
    if broker == "filesystem":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"file://{tmp}/q"
    elif broker == "redis":
        yield services.ensure_redis()
    elif broker == "rabbitmq":
        yield services.ensure_rabbitmq()
    elif broker == "postgres":
        yield services.ensure_postgres()
    else:
        with services.service_url(broker) as url:
            yield url


def fill(driver: Any, n: int) -> None:
    batch = [Message("bench", {"i": i}) for i in range(n)]
    for i in range(0, n, 500):
        driver.send_batch(batch[i : i + 500])


def purge_and_close(driver: Any) -> None:
    try:
        if isinstance(driver, SupportsTeardown):
            driver.teardown()
    finally:
        driver.close()


def wait_until_logged(
    log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(
                f"worker exited with {proc.returncode} before it was ready{tail(log)}"
            )
        time.sleep(0.05)
    raise RuntimeError(f"worker did not log {text!r} within {timeout_s:.0f} s{tail(log)}")


def import_time(run: Run) -> None:
    # As an installed package runs: with bytecode (pip compiles it; an editable
    # checkout gets it on the first import, which is not counted).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", "import hermes.core"], env=env, check=True)
    samples = []
    for _ in range(7):
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import hermes.core"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stderr
        match = re.search(r"\|\s+(\d+) \| hermes\.core$", out, re.MULTILINE)
        if match:
            samples.append(int(match.group(1)) / 1000)
    note = "best of 7, -X importtime, bytecode cached"
    run.add("-", "hermes", "import hermes.core", min(samples), "ms", note)


# Profile ------------------------------------------------------------------------

#: Where a frame's time goes: the first (outermost) frame in a stack whose file
#: matches decides; frames under none of them are Hermes's own loop.
PROFILE_PARTS = [
    ("the job (its INCR)", re.compile(r"bench/jobs\.py$")),
    ("the shutdown check", re.compile(r"_shutdown\.py$")),
    ("logging", re.compile(r"logging/__init__\.py$")),
    ("decoding the message", re.compile(r"hermes/core/_serializer\.py$|json/")),
    ("broker round trip (redis-py, socket)", re.compile(r"site-packages/redis/")),
]
LOOP_PART = "Hermes's loop, Dispatcher and driver"


def profile_file(run: Run, verbose: bool) -> str:
    prefix = "quick" if run.quick else "latest"
    return f"{prefix}-profile-redis-incr{'-verbose' if verbose else ''}.txt"


def profile_worker(
    run: Run, env: Env, base_url: str, n: int, out_dir: Path, verbose: bool = False
) -> None:
    """pyinstrument of ``hermes worker`` on Redis with the INCR job; the split into parts."""
    from pyinstrument.renderers import ConsoleRenderer
    from pyinstrument.session import Session

    flags = ["-v"] if verbose else []
    url = HermesSetting("").url(base_url)
    driver = connect(url)
    try:
        fill(driver, n)
        with tempfile.TemporaryDirectory() as tmp:
            out, log, saved = Path(tmp) / "r.json", Path(tmp) / "w.log", Path(tmp) / "s"
            argv = [sys.executable, "-m", "pyinstrument", "-r", "session", "-o", str(saved)]
            # pyinstrument runs a module itself: the launcher of worker_command(), by name.
            argv += ["-m", "bench.hermes_cli", "worker", "--url", url, *flags]
            argv += ["--handlers", "bench.jobs:register", "--max-items", str(n)]
            with worker(argv, env.make(n, out, "incr"), log) as proc:
                wait_result(out, proc, 600, log)
                proc.wait(60)
            session = Session.load(str(saved))
    finally:
        purge_and_close(driver)
    root = session.root_frame()
    if root is None:
        raise RuntimeError("pyinstrument recorded nothing")
    loop = find_frame(root, "handle", "_dispatcher.py") or root
    parts: dict[str, float] = {}
    for part, self_time in frame_parts(loop, None):
        parts[part] = parts.get(part, 0.0) + self_time
    total = sum(parts.values()) or 1.0
    split = sorted(((p, t / total) for p, t in parts.items()), key=lambda x: -x[1])
    run.profiles[" ".join(flags)] = split
    text = ConsoleRenderer(unicode=True, time="percent_of_total").render(session)
    text = text.replace(str(ROOT) + "/", "").replace(str(Path(sys.executable).parent) + "/", "")
    header = (
        f"pyinstrument of `hermes worker{' -v' if verbose else ''}` on Redis, INCR job, "
        f"{n} messages ({run.started}; {run.machine}).\n"
        "Dispatcher.handle split by where the time went: "
        + ", ".join(f"{p} {share:.0%}" for p, share in split)
        + "\n\n"
    )
    (out_dir / profile_file(run, verbose)).write_text(header + text)


def find_frame(frame: Any, function: str, file_suffix: str) -> Any:
    if frame.function == function and (frame.file_path or "").endswith(file_suffix):
        return frame
    for child in frame.children:
        found = find_frame(child, function, file_suffix)
        if found is not None:
            return found
    return None


def frame_parts(frame: Any, part: str | None) -> Iterator[tuple[str, float]]:
    path = frame.file_path or ""
    if part is None:
        part = next((name for name, pattern in PROFILE_PARTS if pattern.search(path)), None)
    yield part or LOOP_PART, frame.time - sum(child.time for child in frame.children)
    for child in frame.children:
        yield from frame_parts(child, part)


# Raw clients --------------------------------------------------------------------


def timed(n: int, fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return n / (time.perf_counter() - started)


def raw_filesystem(run: Run, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        new, processing = Path(tmp, "new"), Path(tmp, "processing")
        new.mkdir()
        processing.mkdir()
        body = json.dumps({"message": {"id": "x", "type": "bench", "payload": {}}})

        def emit() -> None:
            for i in range(n):
                path = Path(tmp, f"tmp-{i}")
                path.write_text(body)
                os.rename(path, new / f"{i:012d}")

        def consume() -> None:
            for name in sorted(os.listdir(new)):
                claimed = processing / name
                os.rename(new / name, claimed)
                json.loads(claimed.read_text())
                os.unlink(claimed)

        run.add("filesystem", "raw (write+rename)", "emit", timed(n, emit), "msgs/s", "no fsync")
        run.add(
            "filesystem", "raw (rename+read+unlink)", "handle no-op", timed(n, consume), "msgs/s",
            "no fsync",
        )  # fmt: skip


def raw_redis(run: Run, url: str, n: int) -> None:
    import redis

    client = redis.Redis.from_url(url)
    key = f"bench-raw-{uuid.uuid4().hex[:8]}"
    body = repr(Message("bench", {})).encode()

    def emit() -> None:
        for i in range(n):
            client.sadd(key, body + str(i).encode())

    def consume() -> None:
        while client.spop(key) is not None:
            pass

    run.add("redis", "raw redis-py", "emit", timed(n, emit), "msgs/s", "SADD")
    run.add("redis", "raw redis-py", "handle no-op", timed(n, consume), "msgs/s", "SPOP loop")
    client.delete(key)
    client.close()


def raw_postgres(run: Run, url: str, n: int) -> None:
    """The driver's own claim and delete statements in a loop on one connection.

    The same SQL work as ``hermes worker`` per message (the claim's UPDATE
    ... SKIP LOCKED, then the DELETE, with the driver's ``synchronous_commit
    = off`` for both), without the worker around it.
    """
    import psycopg

    from hermes.drivers.postgres import PostgresDriver

    driver = connect(isolated_url(url, f"bench-raw-{uuid.uuid4().hex[:8]}"))
    assert isinstance(driver, PostgresDriver)
    try:
        fill(driver, n)
        claim = driver.sql.claim(sorted(driver.priorities, reverse=True))
        params = {"queue": driver.queue, "worker": "raw", "lease_s": driver.lease_timeout_s}
        settling = {"autocommit": True, "options": "-c synchronous_commit=off"}
        with psycopg.connect(driver.conninfo, **settling) as conn:

            def consume() -> None:
                while (row := conn.execute(claim, params).fetchone()) is not None:
                    conn.execute(driver.sql.ack, [row[0]])

            rate_ = timed(n, consume)
        run.add("postgres", RAW["postgres", ""], "handle no-op", rate_, "msgs/s", "claim + delete")
    finally:
        purge_and_close(driver)


def raw_rabbitmq_emit(run: Run, url: str, n: int) -> str:
    """The raw pika emit row: ``n`` persistent messages, each confirmed, to a fresh queue.

    Returns the queue, left full for :func:`raw_rabbitmq` to consume: deleting
    it here would give the broker clean-up work right beside Hermes's emit row.
    """
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    queue = f"bench-raw-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(queue, durable=True)
    emit = _raw_rabbitmq_emitter(channel, queue, n)
    run.add("rabbitmq", "raw pika", "emit", timed(n, emit), "msgs/s", "persistent, confirms")
    connection.close()
    return queue


def _raw_rabbitmq_emitter(channel: Any, queue: str, n: int) -> Callable[[], None]:
    import pika

    channel.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2, content_type="application/json")

    def emit() -> None:
        for i in range(n):
            channel.basic_publish("", queue, b'{"i":%d}' % i, props)

    return emit


def raw_rabbitmq(run: Run, url: str, n: int, prefetch: int, queue: str | None = None) -> None:
    """The raw pika consume row at ``prefetch``, of ``queue`` (holding ``n``) or a new one."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    if queue is None:
        queue = f"bench-raw-{uuid.uuid4().hex[:8]}"
        channel.queue_declare(queue, durable=True)
        _raw_rabbitmq_emitter(channel, queue, n)()

    def consume() -> None:
        channel.basic_qos(prefetch_count=prefetch)
        got = 0
        for method, _props, body in channel.consume(queue, inactivity_timeout=5):
            if method is None:
                break
            json.loads(body)
            channel.basic_ack(method.delivery_tag)
            got += 1
            if got == n:
                break
        channel.cancel()

    system = f"raw pika prefetch={prefetch}"
    run.add("rabbitmq", system, "handle no-op", timed(n, consume), "msgs/s", "consume+ack")
    channel.queue_delete(queue)
    connection.close()


def raw_sqs(run: Run, endpoint: str, n: int) -> None:
    import boto3

    client = boto3.client("sqs", region_name="us-east-1", endpoint_url=endpoint)
    queue_url = client.create_queue(QueueName=f"bench-raw-{uuid.uuid4().hex[:8]}")["QueueUrl"]

    def emit() -> None:
        for i in range(n):
            client.send_message(QueueUrl=queue_url, MessageBody=f'{{"i":{i}}}')

    def consume() -> None:
        got = 0
        while got < n:
            batch = client.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            )
            messages = batch.get("Messages", [])
            for message in messages:
                json.loads(message["Body"])
            if messages:
                client.delete_message_batch(
                    QueueUrl=queue_url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(messages)
                    ],
                )
            got += len(messages)

    run.add("sqs", "raw boto3", "emit", timed(n, emit), "msgs/s", "SendMessage")
    note = "receive 10 + delete batch"
    run.add("sqs", "raw boto3", "handle no-op", timed(n, consume), "msgs/s", note)
    client.delete_queue(QueueUrl=queue_url)


def raw_kafka(run: Run, bootstrap: str, n: int) -> None:
    from confluent_kafka import Consumer, Producer

    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})

    def emit() -> None:
        for i in range(n):
            producer.produce(topic, b'{"i":%d}' % i)
            producer.flush()

    note = "produce + wait for report"
    run.add("kafka", "raw confluent-kafka", "emit", timed(n, emit), "msgs/s", note)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": topic,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    consumer.subscribe([topic])
    first = consumer.poll(30)  # the group join is not part of the rate
    assert first is not None and first.error() is None, first
    consumer.commit(message=first, asynchronous=False)

    def consume() -> None:
        got = 1
        while got < n:
            record = consumer.poll(5)
            if record is None:
                raise RuntimeError(f"raw kafka consumer stalled after {got} of {n}")
            if record.error():
                continue
            json.loads(record.value())
            consumer.commit(message=record, asynchronous=False)
            got += 1

    note = "poll + sync commit each"
    run.add("kafka", "raw confluent-kafka", "handle no-op", timed(n - 1, consume), "msgs/s", note)
    consumer.close()


# Peers --------------------------------------------------------------------------

_NO_CHATTER = ("--without-mingle", "--without-gossip", "--without-heartbeat")


@dataclass(frozen=True)
class PeerSetting:
    """One documented way to run a peer's worker (always one worker process)."""

    system: str
    label: str
    argv: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    default: bool = False
    #: Runs jobs one at a time: pointless for the I/O-bound job.
    serial: bool = False
    #: Fewer messages for a worker this slow (RQ's fork per job, procrastinate).
    max_n: int | None = None
    #: Runs each job in a process of its own, which cannot count in memory.
    forks: bool = False

    @property
    def name(self) -> str:
        return f"{self.system}: {self.label}"


PEER_SETTINGS = [
    PeerSetting("celery", "defaults (prefork, 1 child)", ("--concurrency=1",), default=True),
    PeerSetting("celery", "solo", ("--pool=solo", *_NO_CHATTER), serial=True),
    PeerSetting(
        "celery", "solo, prefetch x128", ("--pool=solo", *_NO_CHATTER),
        (("HERMES_BENCH_CELERY_PREFETCH", "128"),), serial=True,
    ),
    PeerSetting("celery", "8 threads", ("--pool=threads", "--concurrency=8", *_NO_CHATTER)),
    PeerSetting(
        "celery", "8 threads, prefetch x128", ("--pool=threads", "--concurrency=8", *_NO_CHATTER),
        (("HERMES_BENCH_CELERY_PREFETCH", "128"),),
    ),
    PeerSetting("dramatiq", "defaults (8 threads, prefetch 16)", ("--threads", "8"), default=True),
    PeerSetting(
        "dramatiq", "8 threads, prefetch 100", ("--threads", "8"),
        (("dramatiq_queue_prefetch", "100"),),
    ),
    PeerSetting("dramatiq", "1 thread, prefetch 2", ("--threads", "1"), serial=True),
    PeerSetting(
        "dramatiq", "1 thread, prefetch 100", ("--threads", "1"),
        (("dramatiq_queue_prefetch", "100"),), serial=True,
    ),
    PeerSetting(
        "rq", "defaults (Worker: a process per job)", (), (("HERMES_BENCH_RQ_WORKER", "fork"),),
        default=True, max_n=500, forks=True,
    ),
    PeerSetting("rq", "SimpleWorker", (), (("HERMES_BENCH_RQ_WORKER", "simple"),), serial=True),
    # Its docs' levers for throughput: concurrency (asynchronous jobs at once)
    # and deleting finished jobs, which Hermes always does.
    PeerSetting("procrastinate", "defaults (concurrency 1)", (), default=True, max_n=1000),
    PeerSetting(
        "procrastinate", "concurrency 1, delete successful",
        ("--delete-jobs", "successful"), serial=True, max_n=1000,
    ),
    PeerSetting(
        "procrastinate", "concurrency 8, delete successful",
        ("--concurrency", "8", "--delete-jobs", "successful"), max_n=1000,
    ),
]  # fmt: skip
PEERS = ("celery", "rq", "dramatiq", "procrastinate")
#: The peers that support each broker.
PEERS_ON = {
    "redis": ("celery", "rq", "dramatiq"),
    "rabbitmq": ("celery", "dramatiq"),
    "postgres": ("procrastinate",),
}


def peer_settings(broker: str, job: str, quick: bool) -> list[PeerSetting]:
    """The grid for one broker and job: every setting, less the pointless ones.

    One-at-a-time settings are left out of the I/O-bound job (their rate is
    1 / 20 ms); a quick run tries the whole grid once (Redis, no-op) and
    the defaults elsewhere.
    """
    chosen = []
    for setting in PEER_SETTINGS:
        if setting.system not in PEERS_ON[broker]:
            continue
        if job == "sleep" and setting.serial and not setting.default:
            continue
        if quick and (broker, job) != ("redis", "noop") and not setting.default:
            continue
        chosen.append(setting)
    return chosen


def bench_peer(
    run: Run, env: Env, broker: str, url: str, setting: PeerSetting, job: str, n: int
) -> None:
    n = min(n, setting.max_n) if setting.max_n else n
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    extra = {"HERMES_BENCH_BROKER": url, "HERMES_BENCH_QUEUE": queue, **dict(setting.env)}
    system = setting.system
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out, log, tally = Path(tmp) / "result.json", Path(tmp) / "worker.log", None
            if setting.forks:  # count through a file
                tally = Path(tmp) / "tally"
                extra["HERMES_BENCH_TALLY"] = str(tally)
            worker_env = env.make(n, out, job, **extra)
            emitted = subprocess.run(
                [sys.executable, "-m", "bench.peer_emit", system],
                env={**worker_env, "HERMES_BENCH_OUT": "", "HERMES_BENCH_TALLY": ""},
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            if emitted.returncode != 0:
                raise RuntimeError(f"{system} emit failed: {emitted.stderr.strip()[-500:]}")
            if job == "noop":
                rate_ = float(emitted.stdout.strip())
                run.add(broker, setting.name, "emit", rate_, "msgs/s", "one by one")
            if system == "celery":
                argv = [sys.executable, "-m", "celery", "-A", "bench.peer_celery", "worker"]
                # A node name of the run's own: two runs' workers on one RabbitMQ would
                # otherwise both claim the exclusive celery@HOST.celery.pidbox queue.
                argv += ["-Q", queue, "-n", f"{queue}@%h", "--loglevel=WARNING", *setting.argv]
            elif system == "dramatiq":
                argv = [sys.executable, "-m", "dramatiq", "bench.peer_dramatiq"]
                argv += ["--processes", "1", *setting.argv]
            elif system == "procrastinate":
                argv = [sys.executable, "-m", "procrastinate", "--app"]
                argv += ["bench.peer_procrastinate.app", "worker", "--queues", queue]
                argv += [*setting.argv]
            else:
                argv = [sys.executable, "-m", "bench.peer_rq"]
            with worker(argv, worker_env, log) as proc:
                if tally is not None:
                    result = wait_tally(tally, n, proc, 600)
                else:
                    result = wait_result(out, proc, 600, log)
        note = f"n = {n}" if n != run.n and job != "sleep" else ""
        run.add(broker, setting.name, handle_metric(job), rate(result), "msgs/s", note)
        if n != run.n and job != "sleep":
            run.sizes[(broker, setting.name)] = (n, run.rounds)
    finally:
        clean_peer_queue(url, queue)


#: The database of procrastinate's tables, on the same server as Hermes's.
PROCRASTINATE_DATABASE = "bench_procrastinate"


def procrastinate_database(url: str) -> str:
    """A URL of :data:`PROCRASTINATE_DATABASE` on ``url``'s server, with its schema applied.

    A database of its own: procrastinate's schema (tables, types, functions)
    stays out of the one the tests and other runs share.
    """
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [PROCRASTINATE_DATABASE]
        ).fetchone()
        if found is None:
            conn.execute(f'CREATE DATABASE "{PROCRASTINATE_DATABASE}"'.encode())
    peer_url = f"{url.rsplit('/', 1)[0]}/{PROCRASTINATE_DATABASE}"
    with psycopg.connect(peer_url, autocommit=True) as conn:
        applied = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
    if applied is None or applied[0] is None:
        app = ["--app", "bench.peer_procrastinate.app"]
        subprocess.run(
            [sys.executable, "-m", "procrastinate", *app, "schema", "--apply"],
            env={**os.environ, "HERMES_BENCH_BROKER": peer_url},
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    return peer_url


def clean_peer_queue(url: str, queue: str) -> None:
    """Delete what a peer left on the shared broker under ``queue``."""
    if url.startswith("postgres"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM procrastinate_jobs WHERE queue_name = %s", [queue])
        return
    if url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(url)
        for key in client.scan_iter(f"*{queue}*"):
            client.delete(key)
        client.close()
        return
    import pika
    from pika.exceptions import ChannelClosedByBroker

    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            channel = connection.channel()
            with contextlib.suppress(ChannelClosedByBroker):
                channel.queue_delete(name)
            if channel.is_open:
                with contextlib.suppress(ChannelClosedByBroker):
                    channel.exchange_delete(name)
            if channel.is_open:
                channel.close()
    finally:
        connection.close()


# Report -------------------------------------------------------------------------

#: Each broker's Hermes settings; the first is what a URL without options gives.
HERMES_SETTINGS = {
    "filesystem": [HermesSetting("fsync=true", ""), HermesSetting("fsync=false", "fsync=false")],
    "redis": [
        HermesSetting(""),
        HermesSetting("at-least-once", "delivery=at-least-once"),
        HermesSetting("at-least-once prefetch=16", "delivery=at-least-once&prefetch=16"),
    ],
    "rabbitmq": [
        HermesSetting("prefetch=1", "prefetch=1"), HermesSetting("prefetch=50", "prefetch=50")
    ],
    "sqs": [HermesSetting("")],
    "kafka": [HermesSetting("")],
    "postgres": [HermesSetting("")],
}  # fmt: skip
#: The raw client row beside each broker's Hermes settings (the no-op's limit).
RAW = {
    ("filesystem", "fsync=false"): "raw (rename+read+unlink)",
    ("redis", ""): "raw redis-py",
    ("redis", "at-least-once"): "raw redis-py",
    ("redis", "at-least-once prefetch=16"): "raw redis-py",
    ("rabbitmq", "prefetch=1"): "raw pika prefetch=1",
    ("rabbitmq", "prefetch=50"): "raw pika prefetch=50",
    ("sqs", ""): "raw boto3",
    ("kafka", ""): "raw confluent-kafka",
    ("postgres", ""): "raw psycopg claim+delete",
}
#: The least ``hermes worker`` / raw client no-op rate of each setting that has one.
RAW_TARGETS = {
    ("redis", ""): 0.9,
    ("redis", "at-least-once"): 0.8,
    # One script call claims 16 where the raw loop pops one per round trip.
    ("redis", "at-least-once prefetch=16"): 1.5,
    ("rabbitmq", "prefetch=1"): 0.85,
    ("rabbitmq", "prefetch=50"): 0.85,
    ("kafka", ""): 0.75,
    ("postgres", ""): 0.7,
    # The raw loop renames, reads and unlinks; the driver also lists new/ in
    # priority and due order, counts deliveries and recovers dead workers' files.
    ("filesystem", "fsync=false"): 0.7,
}
#: Settings whose ``--concurrency 8`` INCR row must keep up with their serial one.
CONCURRENT_TARGETS = [
    ("redis", ""),
    ("redis", "at-least-once"),
    ("rabbitmq", "prefetch=1"),
    ("filesystem", "fsync=false"),
]
#: Idle memory a worker may add over its client library's own idle consumer, in MB.
IDLE_OVER_CLIENT_MB = 3.0


@dataclass
class Target:
    what: str
    value: float | None
    #: The bound, in ``unit``; ``at_most`` makes it an upper bound.
    bound: float
    unit: str
    compared: str
    at_most: bool = False

    @property
    def held(self) -> str:
        if self.value is None:
            return "not measured"
        ok = self.value <= self.bound if self.at_most else self.value >= self.bound
        return "held" if ok else "missed"

    def cells(self) -> tuple[str, str]:
        """(measured, target) as table cells."""
        spec = ".2f" if self.unit == "x" else ".1f" if self.unit in ("ms", "MB") else ",.0f"
        sign = "<=" if self.at_most else ">="
        unit = self.unit if self.unit == "x" else f" {self.unit}"
        bound = f"{self.bound:g}" if self.unit == "x" else f"{self.bound:,.0f}"
        return fmt(self.value, spec, unit), f"{sign} {bound}{unit}"


def best_hermes(run: Run, broker: str, job: str) -> tuple[float, str] | None:
    """The fastest ``hermes worker`` row of ``job`` (serial or ``--concurrency 8``)."""
    found = [
        (value, system)
        for setting in HERMES_SETTINGS[broker]
        for system in (setting.system(), setting.system(concurrent=True))
        if (value := run.value(broker, system, handle_metric(job))) is not None
    ]
    return max(found, default=None)


def peer_rates(
    run: Run, broker: str, job: str, system: str | None = None
) -> list[tuple[float, str]]:
    """(msgs/s, setting name) of every peer setting measured on ``broker`` for ``job``."""
    return [
        (value, setting.name)
        for setting in PEER_SETTINGS
        if (system is None or setting.system == system)
        and (value := run.value(broker, setting.name, handle_metric(job))) is not None
    ]


def fastest_peer(run: Run, broker: str, job: str) -> tuple[float, str] | None:
    return max(peer_rates(run, broker, job), default=None)


#: broker, job -> the least ``hermes worker`` / fastest peer setting.
PEER_TARGETS = {
    ("redis", "noop"): 2.0,
    ("redis", "incr"): 1.4,
    ("rabbitmq", "noop"): 1.2,
    ("rabbitmq", "incr"): 1.0,
    ("postgres", "noop"): 1.5,
    ("postgres", "incr"): 1.5,
}


def targets(run: Run) -> list[Target]:
    found = []
    for (broker, job), least in PEER_TARGETS.items():
        ours, peer = best_hermes(run, broker, job), fastest_peer(run, broker, job)
        found.append(
            Target(
                f"{broker}, {JOB_LABELS[job]}: `hermes worker` / fastest peer",
                ours[0] / peer[0] if ours and peer else None,
                least,
                "x",
                f"{ours[1] if ours else '-'} / {peer[1] if peer else '-'}",
            )
        )

    def redis_ratio(label: str, system: str, other: str, job: str, least: float) -> Target:
        """``system`` over ``other`` on Redis, the same job and run."""
        mine = run.value("redis", system, handle_metric(job))
        theirs = run.value("redis", other, handle_metric(job))
        ratio = mine / theirs if mine and theirs else None
        name = f"redis, {JOB_LABELS[job]}: {label}"
        return Target(name, ratio, least, "x", f"{system} / {other}")

    for job in ("noop", "incr"):
        found.append(redis_ratio("`hermes worker` / bare Dispatcher", WORKER, BARE, job, 0.9))
    for job in ("noop", "incr"):
        label = "`hermes worker` with heartbeats / without"
        found.append(redis_ratio(label, WORKER, NO_HEARTBEAT, job, 0.97))
    for plugin in OBSERVED:
        # Installed but not configured (no TracerProvider, no DSN): what every
        # worker of an app that depends on the plugin pays before anyone looks.
        label = f"`hermes worker` with hermes-{plugin} / without"
        found.append(redis_ratio(label, observed_system(plugin), WORKER, "noop", 0.9))
    for broker, label in CONCURRENT_TARGETS:
        setting = HermesSetting(label)
        eight = run.value(broker, setting.system(concurrent=True), "handle INCR")
        one = run.value(broker, setting.system(), "handle INCR")
        found.append(
            Target(
                f"{broker}{f' ({label})' if label else ''}, INCR: `{CONCURRENT}` / one thread",
                eight / one if eight and one else None,
                0.9,
                "x",
                f"{setting.system(concurrent=True)} / {setting.system()}",
            )
        )
    emit, raw_emit = (
        run.value("rabbitmq", "hermes worker prefetch=1", "emit"),
        run.value("rabbitmq", "raw pika", "emit"),
    )
    found.append(
        Target(
            "rabbitmq, emit with confirms: Hermes / raw pika",
            emit / raw_emit if emit and raw_emit else None,
            0.85,
            "x",
            "hermes worker prefetch=1 / raw pika (emit)",
        )
    )
    found += startup_targets(run) + footprint_targets(run) + backlog_targets(run)
    for (broker, label), least in RAW_TARGETS.items():
        # The SQS raw loop does less than a driver must: no ratio target.
        raw = RAW[broker, label]
        system = HermesSetting(label).system()
        mine = run.value(broker, system, "handle no-op")
        limit = run.value(broker, raw, "handle no-op")
        found.append(
            Target(
                f"{broker}, no-op: `{system}` / raw client",
                mine / limit if mine and limit else None,
                least,
                "x",
                f"{system} / {raw}",
            )
        )
    fs = "hermes worker fsync=false"
    found.append(
        Target(
            "filesystem (fsync=false), no-op handled",
            run.value("filesystem", fs, "handle no-op"),
            3000,
            "msgs/s",
            fs,
        )
    )
    for broker, least_ms in (("redis", 2), ("postgres", 5)):
        p50 = run.value(broker, WORKER, "latency p50")
        what = f"{broker}: emit->handle p50"
        found.append(Target(what, p50, least_ms, "ms", WORKER, at_most=True))
    for broker, settings in HERMES_SETTINGS.items():
        system = settings[0].system()
        rss = run.value(broker, system, "idle worker RSS")
        found.append(Target(f"{broker}: idle worker RSS", rss, 40, "MB", system, at_most=True))
    imported = run.value("-", "hermes", "import hermes.core")
    found.append(Target("`import hermes.core`", imported, 50, "ms", "hermes", at_most=True))
    return found


def startup_targets(run: Run) -> list[Target]:
    """From a cold start (bench/startup.py): Hermes against Dramatiq and Celery."""
    from bench import startup

    hermes, plugins, dramatiq, celery = (name for name, _ in startup.SYSTEMS)
    found = []
    for peer in (dramatiq, celery):
        ours = run.value("redis", hermes, startup.COLD_RATE)
        theirs = run.value("redis", peer, startup.COLD_RATE)
        found.append(
            Target(
                f"redis, I/O job from a cold start: `{hermes}` / {peer}",
                ours / theirs if ours and theirs else None,
                1.0,
                "x",
                f"{hermes} / {peer}",
            )
        )
    theirs = run.value("redis", dramatiq, startup.START_UP)
    for name in (hermes, plugins):
        ours = run.value("redis", name, startup.START_UP)
        found.append(
            Target(
                f"redis, start-up to the first job: `{name}` / {dramatiq}",
                ours / theirs if ours and theirs else None,
                1.0,
                "x",
                f"{name} / {dramatiq}",
                at_most=True,
            )
        )
    return found


def footprint_targets(run: Run) -> list[Target]:
    """Idle ``hermes worker`` over its client library's idle consumer (bench/footprint.py)."""
    from bench import footprint

    found = []
    for broker, settings in HERMES_SETTINGS.items():
        if broker == "filesystem":
            continue  # no client library to compare with
        ours = run.value(broker, settings[0].system(), footprint.IDLE)
        client = run.value(broker, footprint.CLIENT, "RSS")
        found.append(
            Target(
                f"{broker}: idle worker RSS over its client library's idle consumer",
                ours - client if ours is not None and client is not None else None,
                IDLE_OVER_CLIENT_MB,
                "MB",
                f"{settings[0].system()} - {footprint.CLIENT}",
                at_most=True,
            )
        )
    return found


def backlog_targets(run: Run) -> list[Target]:
    """Rates behind and beside a big backlog over the empty queue's (bench/scale.py)."""
    from bench import scale

    found = []
    for broker, settings in scale.BACKLOG_SETTINGS.items():
        for setting in settings:
            empty = run.value(broker, setting.system(), scale.EMPTY)
            for metric in (scale.waiting_metric(run), scale.scheduled_metric(run)):
                rate = run.value(broker, setting.system(), metric)
                if rate is None and metric == scale.scheduled_metric(run):
                    continue  # delay ignored: nothing is held for later
                found.append(
                    Target(
                        f"{broker}{f' ({setting.label})' if setting.label else ''}: "
                        f"{metric.removeprefix('handle no-op, ')} / empty queue",
                        rate / empty if rate and empty else None,
                        0.8,
                        "x",
                        f"{setting.system()}",
                    )
                )
    return found


def fmt(value: float | None, spec: str = ",.0f", suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def size_note(run: Run) -> str:
    lines = [
        f"{run.n:,} messages per throughput row ({run.n_sleep:,} for sleep 20 ms), "
        f"the median of {run.rounds} round{'s' if run.rounds != 1 else ''}"
    ]
    for (broker, system), (n, rounds) in sorted(run.sizes.items()):
        lines.append(
            f"{broker} {system}: {n:,} messages, {rounds} round{'s' if rounds != 1 else ''}"
        )
    return "; ".join(lines)


def header(run: Run) -> str:
    return (
        f"{run.machine}; {run.started}; {'quick' if run.quick else 'full'} run: "
        f"{size_note(run)}. Load average (1/5/15 min) {' -> '.join(run.load)} "
        "(the machine is shared)."
    )


def markdown(run: Run) -> str:
    lines = [
        header(run),
        "",
        "| broker | system | metric | value | unit | note |",
        "|---|---|---|---:|---|---|",
    ]
    for r in run.rows:
        lines.append(
            f"| {r.broker} | {r.system} | {r.metric} | {r.value:,.1f} | {r.unit} | {r.note} |"
        )
    lines += ["", targets_table(run)]
    if run.profiles:
        lines += ["", profile_line(run)]
    if run.notes:
        lines += ["", "Not measured, and why:", ""] + [f"- {note}" for note in run.notes]
    if run.errors:
        lines += ["", "Rows that could not be measured:", ""] + [f"- {e}" for e in run.errors]
    return "\n".join(lines) + "\n"


def targets_table(run: Run) -> str:
    lines = ["| target | measured | bound | result | rows |", "|---|---:|---:|---|---|"]
    for t in targets(run):
        measured, bound = t.cells()
        lines.append(f"| {t.what} | {measured} | {bound} | {t.held} | {t.compared} |")
    return "\n".join(lines)


def profile_line(run: Run) -> str:
    lines = []
    for flags, split in sorted(run.profiles.items()):
        parts = ", ".join(f"{part} {share:.0%}" for part, share in split)
        lines.append(
            f"Where `hermes worker{' ' + flags if flags else ''}` spends its time on Redis with "
            f"the INCR job (pyinstrument, {run.n:,} messages; the tree is in "
            f"`bench/results/{profile_file(run, bool(flags))}`): {parts}."
        )
    return "\n\n".join(lines)


def peers_table(run: Run, brokers: tuple[str, ...]) -> str:
    lines = [
        "| broker | job | `hermes worker` msgs/s | fastest peer (its winning setting) | msgs/s "
        "| Hermes/peer |",
        "|---|---|---:|---|---:|---:|",
    ]
    for broker in brokers:
        for job in JOBS:
            ours, peer = best_hermes(run, broker, job), fastest_peer(run, broker, job)
            if ours is None and peer is None:
                continue
            setting = ours[1].removeprefix(WORKER).strip() if ours else ""
            lines.append(
                f"| {broker} | {JOB_LABELS[job]} "
                f"| {fmt(ours[0] if ours else None)}{f' ({setting})' if setting else ''} "
                f"| {peer[1] if peer else '-'} | {fmt(peer[0] if peer else None)} "
                f"| {fmt(ours[0] / peer[0] if ours and peer else None, '.2f', 'x')} |"
            )
    lines += [
        "",
        "| broker | job | peer | defaults msgs/s | best msgs/s | best setting |",
        "|---|---|---|---:|---:|---|",
    ]
    for broker in brokers:
        for job in JOBS:
            for system in PEERS_ON.get(broker, ()):
                rates = peer_rates(run, broker, job, system)
                if not rates:
                    continue
                default = next(s for s in PEER_SETTINGS if s.system == system and s.default)
                best = max(rates)
                lines.append(
                    f"| {broker} | {JOB_LABELS[job]} | {system} "
                    f"| {fmt(run.value(broker, default.name, handle_metric(job)))} "
                    f"| {fmt(best[0])} | {best[1].split(': ', 1)[1]} |"
                )
    return "\n".join(lines)


def driver_table(run: Run, brokers: tuple[str, ...]) -> str:
    lines = [
        "| driver (setting) | no-op msgs/s | INCR, 1 / 8 handlers | sleep 20 ms "
        "| raw client no-op | Hermes/raw | emit one by one | emit batched "
        "| emit->handle p50 / p99 | idle RSS "
        "| client library alone |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for broker in brokers:
        for setting in HERMES_SETTINGS[broker]:
            system = setting.system()

            def value(metric: str, b: str = broker, s: str = system) -> float | None:
                return run.value(b, s, metric)

            raw_name = RAW.get((broker, setting.label))
            raw = run.value(broker, raw_name, "handle no-op") if raw_name else None
            mine = value("handle no-op")
            if mine is None:
                continue
            lines.append(
                f"| {broker}{f' ({setting.label})' if setting.label else ''} | {fmt(mine)} "
                f"| {fmt(value('handle INCR'))} / "
                f"{fmt(run.value(broker, setting.system(concurrent=True), 'handle INCR'))} "
                f"| {fmt(value('handle sleep 20 ms'))} "
                f"| {fmt(raw)} | {fmt(mine / raw if raw else None, '.2f', 'x')} "
                f"| {fmt(value('emit'))} | {fmt(value('emit batched'))} "
                f"| {fmt(value('latency p50'), '.1f')} / {fmt(value('latency p99'), '.1f')} ms "
                f"| {fmt(value('idle worker RSS'), '.0f')} MB "
                f"| {fmt(run.value(broker, 'client library alone', 'RSS'), '.0f', ' MB')} |"
            )
    bare = run.value("redis", BARE, "handle no-op")
    if "redis" in brokers and bare is not None:
        lines += [
            "",
            f"Bare Dispatcher on Redis (no CLI, no logging set up, no shutdown watch): no-op "
            f"{fmt(bare)} msgs/s, INCR {fmt(run.value('redis', BARE, 'handle INCR'))} msgs/s.",
        ]
    return "\n".join(lines)


def startup_table(run: Run) -> str:
    from bench import startup

    return startup.table(run)


def summary(run: Run) -> str:
    """docs/performance.md's section: Hermes against its peers and raw clients, and the targets."""
    imported = run.value("-", "hermes", "import hermes.core")
    lines = [
        header(run) + " Full table: `bench/results/latest.md`.",
        "",
        peers_table(run, ("redis", "rabbitmq", "postgres")),
        "",
        driver_table(run, tuple(HERMES_SETTINGS)),
        "",
        f"`import hermes.core`: {fmt(imported, '.0f')} ms (best of 7, `-X importtime`, "
        "bytecode cached, taken while nothing else of the benchmark runs).",
        "",
        "From a cold start (`bench/startup.py`): 2,000 jobs of a 20 ms sleep and one "
        "INCR wait on Redis; each worker is spawned with 8 threads, from an environment "
        "holding only what its users install:",
        "",
        startup_table(run),
        "",
        targets_table(run),
    ]
    if run.profiles:
        lines += ["", profile_line(run)]
    return "\n".join(lines) + "\n"


def driver_summary(run: Run, broker: str) -> str:
    """A driver README's section: its own rows of the same run."""
    lines = [
        f"From `./run test -s bench`: {header(run)} Every driver and the peers: the "
        "documentation's Performance page (`docs/performance.md`) and `bench/results/latest.md`.",
        "",
        driver_table(run, (broker,)),
    ]
    if broker in PEERS_ON:
        lines += ["", peers_table(run, (broker,))]
    from bench import scale

    big_queues = scale.driver_section(run, broker)
    if big_queues:
        lines += ["", big_queues]
    wanted = [
        t for t in targets(run) if t.what.startswith((f"{broker},", f"{broker}:", f"{broker} ("))
    ]
    if wanted:
        lines += ["", "| target | measured | bound | result |", "|---|---:|---:|---|"]
        lines += [f"| {t.what} | {' | '.join(t.cells())} | {t.held} |" for t in wanted]
    return "\n".join(lines) + "\n"


def chart(run: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars: list[tuple[str, float, str]] = []
    for broker in ("redis", "rabbitmq"):
        for job in JOBS:
            ours = best_hermes(run, broker, job)
            if ours:
                bars.append((f"{broker} {JOB_LABELS[job]}: {ours[1]}", ours[0], "#2b6cb0"))
            for system in PEERS_ON[broker]:
                rates = peer_rates(run, broker, job, system)
                if rates:
                    best = max(rates)
                    bars.append((f"{broker} {JOB_LABELS[job]}: {best[1]}", best[0], "#dd6b20"))
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(bars) + 1.5))
    ax.barh([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("jobs/s, one worker process (log scale)")
    ax.set_title("hermes worker (blue) vs each peer's fastest setting (orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# Main ---------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--only", default="", help="comma-separated brokers (default: all)")
    parser.add_argument("--jobs", default=",".join(JOBS), help="comma-separated jobs")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("-n", type=int, default=0, help="messages per throughput row")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (median)")
    parser.add_argument("--no-peers", action="store_true", help="Hermes and raw rows only")
    parser.add_argument(
        "--render", action="store_true", help="measure nothing: write the reports of latest.json"
    )
    args = parser.parse_args()
    # Not at the top: each imports helpers from this module.
    from bench import footprint, scale, startup

    if args.render:
        run = load_run(Path(args.out) / "latest.json")
        write_reports(run, Path(args.out), readmes=not run.quick and not run.errors)
        return 0
    n = args.n or (200 if args.quick else 5_000)
    n_sleep = min(n, 20 if args.quick else 500)
    # Every system takes one turn per round, so a burst of noise on this shared
    # machine hits them alike; each row is the median of its rounds.
    rounds = args.rounds or (1 if args.quick else 3)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    run = Run(args.quick, n, n_sleep, rounds, machine(), started, [load_average()])
    # The emit rows use an Emitter in this process: it must be observed by no
    # plugin either, whatever the venv holds.
    block_observers()
    only = set(filter(None, args.only.split(",")))
    jobs = [job for job in JOBS if job in args.jobs.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    redis_url = services.ensure_redis()
    env = Env(redis_url, f"bench-incr-{uuid.uuid4().hex[:8]}")
    io_args = io_concurrency_args()
    hermes = Hermes(run, env, io_args)
    #: Where a broker's peers run when not on Hermes's URL.
    peer_urls: dict[str, str] = {}

    def section(name: str, fn: Callable[[], None]) -> None:
        if only and name not in only:
            return
        print(f"== {name}", flush=True)
        try:
            fn()
        except Exception as exc:  # one broken section must not hide the others' figures
            run.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            print(f"  !! {name}: {exc}", flush=True)

    installed = observers()
    observed = [name for name in OBSERVED if name in installed]
    for name in sorted(set(OBSERVED) - set(observed)):
        run.errors.append(f"redis {observed_system(name)}: hermes-{name} is not installed here")

    def hermes_rounds(
        broker: str,
        url: str,
        n: int,
        raw: Callable[[], None] | None,
        beside: Callable[[bool], RawBeside] | None = None,
    ) -> None:
        """Every Hermes row of ``broker``, round by round, and ``raw()`` after the no-op's.

        ``beside(first)``: the raw rows taken beside the no-op rows of the broker's
        first setting, twice a round: right before them, then right after them.
        """
        for round_ in range(rounds):
            for job in jobs:
                size = n_sleep if job == "sleep" else n
                for setting in HERMES_SETTINGS[broker]:
                    noop = job == "noop"
                    first = broker == "redis" and setting is HERMES_SETTINGS[broker][0]
                    if first and job in ("noop", "incr"):
                        # hermes worker as it runs by default, without its heartbeat and
                        # (no-op) with each observer, back to back, the one that goes
                        # first rotating per round: a burst of noise on this shared
                        # machine does not always hit the same row.
                        turns: list[tuple[str | None, bool]] = [(None, True), (None, False)]
                        turns += [(observe, True) for observe in observed] if noop else []
                        shift = round_ % len(turns)
                        for observe, beats in turns[shift:] + turns[:shift]:
                            hermes.handle(
                                broker,
                                setting,
                                url,
                                job,
                                size,
                                measure_emit=noop and observe is None and beats,
                                observe=observe,
                                heartbeat=beats,
                            )
                    else:
                        pairs: list[RawBeside | None] = [None]
                        if noop and beside and setting is HERMES_SETTINGS[broker][0]:
                            # Both orders every round: the row that goes second after
                            # a worker's run tends to be the slower, whichever it is.
                            pairs = [beside(True), beside(False)]
                        for pair in pairs:
                            hermes.handle(
                                broker, setting, url, job, size, measure_emit=noop, raw=pair
                            )
                    if noop:
                        hermes.emit_batched(broker, setting, url, size)
                    if job == "incr" and io_args:
                        hermes.handle(broker, setting, url, job, size, concurrent=True)
                if broker == "redis":
                    hermes.handle(broker, HERMES_SETTINGS[broker][0], url, job, size, bare=True)
                if job == "noop" and raw is not None:
                    raw()
                grid = broker in PEERS_ON and not args.no_peers
                for peer in peer_settings(broker, job, args.quick) if grid else ():
                    bench_peer(run, env, broker, peer_urls.get(broker, url), peer, job, size)
            if "noop" in jobs:
                for setting in HERMES_SETTINGS[broker]:
                    hermes.latency(broker, setting, url)

    def filesystem() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            hermes_rounds("filesystem", f"file://{tmp}/q", n, lambda: raw_filesystem(run, n))

    def redis_section() -> None:
        hermes_rounds("redis", redis_url, n, lambda: raw_redis(run, redis_url, n))

    def rabbitmq() -> None:
        url = services.ensure_rabbitmq()

        #: The queue the raw emit row filled, for the raw prefetch=1 consume row.
        filled: list[str] = []

        def beside(first: bool) -> RawBeside:
            return RawBeside(
                emit=lambda: filled.append(raw_rabbitmq_emit(run, url, n)),
                consume=lambda: raw_rabbitmq(run, url, n, 1, filled.pop() if filled else None),
                first=first,
            )

        hermes_rounds("rabbitmq", url, n, lambda: raw_rabbitmq(run, url, n, 50), beside)

    def sqs() -> None:
        with services.service_url("sqs") as url:
            endpoint = DriverUrl.parse(url).options["endpoint_url"]
            # One round of at most 1,000: the local SQS server, not Hermes, sets this pace.
            small = min(n, 1000)
            setting = HERMES_SETTINGS["sqs"][0]
            for job in jobs:
                size = n_sleep if job == "sleep" else small
                hermes.handle("sqs", setting, url, job, size, measure_emit=job == "noop")
                if job == "noop":
                    hermes.emit_batched("sqs", setting, url, size)
                    raw_sqs(run, endpoint, size)
            if "noop" in jobs:
                hermes.latency("sqs", setting, url)
            for system in (HermesSetting("").system(), "raw boto3"):
                run.sizes[("sqs", system)] = (small, 1)

    def kafka() -> None:
        with services.service_url("kafka") as url:
            bootstrap = url.split("//", 1)[1].split("/", 1)[0]
            hermes_rounds("kafka", url, n, lambda: raw_kafka(run, bootstrap, n))

    def postgres() -> None:
        url = services.ensure_postgres()
        if not args.no_peers:
            peer_urls["postgres"] = procrastinate_database(url)
        hermes_rounds("postgres", url, n, lambda: raw_postgres(run, url, n))

    def profile() -> None:
        profile_worker(run, env, redis_url, n, out)
        profile_worker(run, env, redis_url, n, out, verbose=True)

    def each_broker(measure: Callable[[str, HermesSetting, str], None],
                    settings: dict[str, list[HermesSetting]]) -> None:  # fmt: skip
        """``measure(broker, setting, url)`` for every broker in ``settings``, each server up."""
        for broker, chosen in settings.items():
            with broker_url(broker) as url:
                for setting in chosen:
                    try:
                        measure(broker, setting, url)
                    except Exception as exc:  # one broker's failure must not hide the others'
                        run.errors.append(f"{broker} {setting.label}: {type(exc).__name__}: {exc}")
                        print(f"  !! {broker} {setting.label}: {exc}", flush=True)

    def footprint_section() -> None:
        def measure(broker: str, setting: HermesSetting, url: str) -> None:
            footprint.measure(run, env, broker, setting, url)

        each_broker(measure, {b: HERMES_SETTINGS[b][:1] for b in HERMES_SETTINGS})

    def backlog_section() -> None:
        def measure(broker: str, setting: HermesSetting, url: str) -> None:
            probe = connect(setting.url(url))
            try:
                scheduled = probe.capabilities.delay is Delay.NATIVE
            finally:
                probe.close()
            scale.backlog(run, env, broker, setting, url, scheduled=scheduled)

        each_broker(measure, scale.BACKLOG_SETTINGS)
        scale.note_sqs_backlog(run)

    def processes_section() -> None:
        def measure(broker: str, setting: HermesSetting, url: str) -> None:
            scale.processes(run, env, broker, setting, url)

        each_broker(measure, scale.PROCESS_SETTINGS)

    def cost_section() -> None:
        def measure(broker: str, setting: HermesSetting, url: str) -> None:
            usage, what = scale.usage_of(broker, url)
            scale.cost(run, env, broker, setting, url, usage, what)

        each_broker(measure, scale.COST_SETTINGS)

    section("import", lambda: import_time(run))
    section("startup", lambda: startup.measure(run, env, redis_url))
    section("footprint", footprint_section)
    section("filesystem", filesystem)
    section("redis", redis_section)
    section("rabbitmq", rabbitmq)
    section("sqs", sqs)
    section("kafka", kafka)
    section("postgres", postgres)
    section("backlog", backlog_section)
    section("processes", processes_section)
    section("cost", cost_section)
    if "incr" in jobs:
        section("profile", profile)
    with contextlib.suppress(Exception):
        import redis

        redis.Redis.from_url(redis_url).delete(env.incr_key)
    run.load.append(load_average())

    # Only a full run without errors replaces the READMEs' figures: a failed
    # section would otherwise turn its rows into dashes.
    complete = not (args.quick or only or args.no_peers or jobs != list(JOBS))
    write_reports(run, out, readmes=complete and not run.errors)
    return 1 if run.errors else 0


def write_reports(run: Run, out: Path, readmes: bool) -> None:
    """The chart, Markdown and JSON of ``run`` (and, with ``readmes``, the READMEs' sections)."""
    prefix = "quick" if run.quick else "latest"
    try:
        chart(run, out / f"{prefix}.png")
    except ImportError as exc:
        run.errors.append(f"chart: matplotlib is needed for the PNG ({exc})")
    if readmes:
        for readme, text in [(PERFORMANCE_PAGE, summary(run))] + [
            (ROOT / "drivers" / broker / "README.md", driver_summary(run, broker))
            for broker in HERMES_SETTINGS
        ]:
            problem = replace_section(readme, "bench", text)
            if problem:
                run.errors.append(problem)
        from bench import scale

        problem = replace_section(PERFORMANCE_PAGE, "scaling", scale.scaling_section(run))
        if problem:
            run.errors.append(problem)
    md = markdown(run)  # last: it lists every error above
    (out / f"{prefix}.md").write_text(md)
    (out / f"{prefix}.json").write_text(run.to_json())
    print()
    print(md)
    print(summary(run))


if __name__ == "__main__":
    sys.exit(main())
