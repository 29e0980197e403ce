"""How the cost grows with the work: big backlogs, several workers, the broker's side.

Sections of ``python -m bench.run`` (``--only backlog``, ``processes``, ``cost``):

* backlog -- ``hermes worker`` drains the same due messages three ways, in
  turn: from a queue holding nothing else, behind 100,000 more waiting, and
  beside 100,000 scheduled an hour ahead. The rate behind or beside a backlog
  over the rate on an empty queue is what a driver costs as queues grow.
* processes -- 1, 2 and 4 ``hermes worker`` processes on one queue, the INCR
  job: the total rate, timed by the INCR counter itself (the first and the last
  job), so no worker reports anything.
* cost -- what one message costs the broker, emitted one by one and handled by
  ``hermes worker``: the server's CPU time (``INFO`` on Redis; the server
  processes' CPU from ``/proc`` elsewhere), and Redis's commands per message
  (``INFO commandstats``, scripts' commands included). The documentation's
  "Scaling" section (docs/performance.md) turns it into the rate one broker core carries.

The local SQS server and Kafka broker are stand-ins (moto, Tansu): their rows
say what they can and cannot show.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.run import (
    Env,
    HermesSetting,
    Run,
    fill,
    purge_and_close,
    wait_result,
    worker,
    worker_command,
)
from hermes.core import Emitter, Message, connect

#: The backlog a "big queue" row puts behind or beside the messages it times.
BACKLOG = 100_000
QUICK_BACKLOG = 2_000
EMPTY = "handle no-op, nothing else queued"
WAITING = "handle no-op, behind {n} waiting"
SCHEDULED = "handle no-op, beside {n} scheduled"
#: How far ahead the scheduled backlog is due.
AHEAD_S = 3600.0
PROCESS_COUNTS = (1, 2, 4)
TOTAL = "handle INCR, total of {k} processes"
CPU = "broker CPU per message"
COMMANDS = "broker commands per message"


def backlog_sizes(run: Run) -> tuple[int, int]:
    """(messages timed, backlog) of ``run``."""
    return (200, QUICK_BACKLOG) if run.quick else (5_000, BACKLOG)


def waiting_metric(run: Run) -> str:
    return WAITING.format(n=f"{backlog_sizes(run)[1]:,}")


def scheduled_metric(run: Run) -> str:
    return SCHEDULED.format(n=f"{backlog_sizes(run)[1]:,}")


#: Where each section runs: broker -> settings (the URL options of bench.run's rows).
BACKLOG_SETTINGS = {
    "filesystem": [HermesSetting("fsync=false", "fsync=false")],
    "redis": [HermesSetting(""), HermesSetting("at-least-once", "delivery=at-least-once")],
    # Delay ignored by default: a message for later is delivered at once, so only
    # the waiting backlog applies; the delay queues get their own row.
    "rabbitmq": [
        HermesSetting("prefetch=1", "prefetch=1"),
        HermesSetting("delay=true", "delay=true"),
    ],
    "kafka": [HermesSetting("")],
    "postgres": [HermesSetting("")],
}
PROCESS_SETTINGS = {
    "filesystem": [HermesSetting("fsync=false", "fsync=false")],
    "redis": [HermesSetting(""), HermesSetting("at-least-once", "delivery=at-least-once")],
    "rabbitmq": [HermesSetting("prefetch=1", "prefetch=1")],
    "postgres": [HermesSetting("")],
}
COST_SETTINGS = {
    "redis": [HermesSetting(""), HermesSetting("at-least-once", "delivery=at-least-once")],
    "rabbitmq": [HermesSetting("prefetch=1", "prefetch=1")],
    "kafka": [HermesSetting("")],
    "postgres": [HermesSetting("")],
}


# Backlog -------------------------------------------------------------------------


def _drain(
    env: Env,
    url: str,
    n: int,
    setup: Callable[[Any], None],
    extra: list[str] = (),  # type: ignore[assignment]
) -> float:
    """``setup(driver)`` fills the queue; the rate at which ``hermes worker`` handles ``n``."""
    driver = connect(url)
    try:
        setup(driver)
        # What the fill wrote goes to disk now, not while the worker drains: the
        # filesystem driver's 100,000 new files would otherwise be written back
        # in the middle of the timed run (every turn syncs alike).
        os.sync()
        with tempfile.TemporaryDirectory() as tmp:
            out, log = Path(tmp) / "result.json", Path(tmp) / "worker.log"
            argv = [*worker_command(), "worker", "--url", url, "--handlers", "bench.jobs:register"]
            argv += ["--max-items", str(n)]
            with worker(argv, env.make(n, out, "noop"), log) as proc:
                result = wait_result(out, proc, 1800, log)
        return float((result["count"] - 1) / (result["last"] - result["first"]))
    finally:
        purge_and_close(driver)


def backlog(
    run: Run, env: Env, broker: str, setting: HermesSetting, base_url: str, *, scheduled: bool
) -> None:
    """The backlog rows of one setting: empty, behind waiting, and (if ``scheduled``) beside
    scheduled, in turn per round, the first rotating."""
    n, big = backlog_sizes(run)
    system = setting.system()
    later = time.time() + AHEAD_S

    def due(driver: Any) -> None:
        fill(driver, n)

    def waiting(driver: Any) -> None:
        fill(driver, n + big)

    def ahead(driver: Any) -> None:
        batch = [Message("bench", {"i": i}, execute_at=later) for i in range(big)]
        for i in range(0, big, 500):
            driver.send_batch(batch[i : i + 500])
        fill(driver, n)

    turns = [(EMPTY, due), (waiting_metric(run), waiting)]
    if scheduled:
        turns.append((scheduled_metric(run), ahead))
    for round_ in range(run.rounds):
        shift = round_ % len(turns)
        for metric, setup in turns[shift:] + turns[:shift]:
            rate = _drain(env, setting.url(base_url), n, setup)
            run.add(broker, system, metric, rate, "msgs/s", f"{n:,} handled")


def note_sqs_backlog(run: Run) -> None:
    """Why SQS has no backlog rows, from what this run measured of the local server."""
    batched = run.value("sqs", HermesSetting("").system(), "emit batched")
    big = backlog_sizes(run)[1]
    pace = f"{batched:,.0f} msgs/s" if batched else "its emit rate (not measured in this run)"
    minutes = f", about {big / batched / 60:.0f} min" if batched else ""
    run.notes.append(
        f"sqs: no backlog rows. Filling {big:,} messages on the local SQS server (moto) "
        f"goes at {pace} batched{minutes} per row, and the stand-in's pace would say "
        "nothing of AWS's."
    )


# Several processes -----------------------------------------------------------------


def processes(run: Run, env: Env, broker: str, setting: HermesSetting, base_url: str) -> None:
    """1, 2 and 4 ``hermes worker`` processes sharing one queue; the INCR job; the total rate."""
    import redis

    n = 400 if run.quick else 20_000
    counter = redis.Redis.from_url(env.redis_url)
    system = setting.system()
    for _ in range(run.rounds):
        for k in PROCESS_COUNTS:
            url = setting.url(base_url)
            key = f"bench-procs-{uuid.uuid4().hex[:8]}"
            driver = connect(url)
            try:
                fill(driver, n)
                with contextlib.ExitStack() as stack:
                    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                    for i in range(k):
                        argv = [*worker_command(), "worker", "--url", url]
                        argv += ["--handlers", "bench.jobs:register", "--no-heartbeat"]
                        job_env = env.make(n, tmp / f"unused-{i}", "incr")
                        job_env["HERMES_BENCH_INCR_KEY"] = key
                        stack.enter_context(worker(argv, job_env, tmp / f"worker-{i}.log"))
                    first, last = _count_to(counter, key, n, 600)
                rate = (n - 1) / (last - first)
                note = f"{n:,} messages, {os.cpu_count()} cores"
                run.add(broker, system, TOTAL.format(k=k), rate, "msgs/s", note)
            finally:
                counter.delete(key)
                purge_and_close(driver)
    counter.close()


def _count_to(counter: Any, key: str, n: int, timeout_s: float) -> tuple[float, float]:
    """Poll ``key`` until it reaches ``n``: when it first moved and when it got there."""
    deadline = time.monotonic() + timeout_s
    first: float | None = None
    while time.monotonic() < deadline:
        now = time.time()
        value = int(counter.get(key) or 0)
        if value and first is None:
            first = now
        if value >= n:
            assert first is not None
            return first, now
        time.sleep(0.005)
    raise RuntimeError(f"{key} reached {counter.get(key)} of {n} within {timeout_s:.0f} s")


# The broker's side ------------------------------------------------------------------


@dataclass
class Usage:
    """A server's CPU seconds so far, and (Redis) its command counts."""

    cpu_s: float
    commands: dict[str, int]


def _ticks_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of its children it has reaped, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime, stime, cutime, cstime are fields 14-17 of stat(5); fields[0] is field 3.
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _pids_named(name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == name:
                    pids.append(int(entry.name))
    return pids


def _listener_pid(port: int) -> int:
    """The pid of the process listening on TCP ``port`` (IPv4 or IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(parts[9])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(entry.name)
    raise RuntimeError(f"no process found listening on port {port}")


def redis_usage(url: str) -> Callable[[], Usage]:
    import redis

    client = redis.Redis.from_url(url)

    def usage() -> Usage:
        cpu = client.info("cpu")
        stats = client.info("commandstats")
        commands = {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in stats.items()
            if name not in ("cmdstat_info",)
        }
        return Usage(float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), commands)

    return usage


def process_usage(pids: Callable[[], list[int]]) -> Callable[[], Usage]:
    def usage() -> Usage:
        total = 0.0
        for pid in pids():
            with contextlib.suppress(OSError):
                total += _ticks_s(pid)
        return Usage(total, {})

    return usage


def usage_of(broker: str, url: str) -> tuple[Callable[[], Usage], str]:
    """How to read what ``broker``'s server at ``url`` has spent, and what that counts."""
    from hermes.core.driver import DriverUrl

    if broker == "redis":
        return redis_usage(url), "Redis INFO: used_cpu_sys + used_cpu_user"
    if broker == "postgres":
        return (
            process_usage(lambda: _pids_named("postgres")),
            "the CPU of every postgres process, reaped backends included",
        )
    port = DriverUrl.parse(url).port or {"rabbitmq": 5672}.get(broker)
    if port is None:
        raise RuntimeError(f"{broker}: no port in {url}")
    pid = _listener_pid(port)
    name = Path(f"/proc/{pid}/comm").read_text().strip()
    return process_usage(lambda: [pid]), f"the CPU of the server process ({name})"


def cost(run: Run, env: Env, broker: str, setting: HermesSetting, base_url: str,
         usage: Callable[[], Usage], what: str) -> None:  # fmt: skip
    """Emit messages one by one, let ``hermes worker`` handle them; what the broker spent."""
    n = 500 if run.quick else 5_000
    system = setting.system()
    for _ in range(run.rounds):
        url = setting.url(base_url)
        driver = connect(url)
        try:
            before = usage()
            emitter = Emitter(driver)
            for i in range(n):
                emitter.emit(Message("bench", {"i": i}))
            with tempfile.TemporaryDirectory() as tmp:
                out, log = Path(tmp) / "result.json", Path(tmp) / "worker.log"
                argv = [*worker_command(), "worker", "--url", url]
                argv += ["--handlers", "bench.jobs:register", "--max-items", str(n)]
                with worker(argv, env.make(n, out, "noop"), log) as proc:
                    wait_result(out, proc, 1800, log)
                    proc.wait(60)  # its connections are closed: their CPU is the server's now
            time.sleep(0.5)
            after = usage()
        finally:
            purge_and_close(driver)
        note = f"emitted one by one and handled, {n:,} messages; {what}"
        run.add(broker, system, CPU, (after.cpu_s - before.cpu_s) * 1e6 / n, "µs", note)
        if before.commands or after.commands:
            calls = {
                name: after.commands.get(name, 0) - before.commands.get(name, 0)
                for name in after.commands
            }
            calls = {name: count for name, count in calls.items() if count > 0}
            total = sum(calls.values()) / n
            top = sorted(calls.items(), key=lambda item: -item[1])[:6]
            detail = ", ".join(f"{name} {count / n:.2f}" for name, count in top)
            run.add(broker, system, COMMANDS, total, "commands", f"{detail}; scripts' own counted")


# Reports ---------------------------------------------------------------------------

#: Job rates per worker process for the fleet column: one second of work each at
#: 100 jobs/s is 10 ms a job, a typical short web-backend job.
FLEET_RATE = 100
SHARDING = {
    "redis": "Redis runs commands on one core: past it, give job types Redis servers of "
    "their own (a worker reads the one URL it is given, so each server has its own "
    "workers), or more servers behind one type with emitters spreading over them.",
    "rabbitmq": "A RabbitMQ queue is one Erlang process on one node: past it, more queues "
    "(a priority is a queue of its own; job types can have their own), or more nodes "
    "with queues spread over them.",
    "kafka": "At most one worker of a group reads a partition: more partitions (the "
    "driver's `partitions` option for new topics) let more workers and more broker "
    "cores share a topic.",
    "postgres": "Claims are row locks on one table: past one server, a table per job type "
    "(`?table=`) on servers of their own.",
    "sqs": "SQS has no server to outgrow; a standard queue's throughput is the service's "
    "(AWS documents it as nearly unlimited); more queues split job types.",
}


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def backlog_table(run: Run, brokers: tuple[str, ...]) -> str:
    big = backlog_sizes(run)[1]
    lines = [
        f"| driver (setting) | empty queue msgs/s | behind {big:,} waiting | ratio "
        f"| beside {big:,} scheduled | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for broker in brokers:
        for setting in BACKLOG_SETTINGS.get(broker, []):
            system = setting.system()
            empty = run.value(broker, system, EMPTY)
            if empty is None:
                continue
            waiting = run.value(broker, system, waiting_metric(run))
            ahead = run.value(broker, system, scheduled_metric(run))
            lines.append(
                f"| {broker}{f' ({setting.label})' if setting.label else ''} | {_fmt(empty)} "
                f"| {_fmt(waiting)} | {_fmt(waiting / empty if waiting else None, '.2f')}x "
                f"| {_fmt(ahead) if ahead else 'n/a: delay ignored'} "
                f"| {_fmt(ahead / empty if ahead else None, '.2f')}{'x' if ahead else ''} |"
            )
    return "\n".join(lines)


def processes_table(run: Run) -> str:
    lines = [
        "| driver (setting) | " + " | ".join(f"{k} process{'es' if k > 1 else ''}"
                                             for k in PROCESS_COUNTS) + " |",
        "|---|" + "---:|" * len(PROCESS_COUNTS),
    ]  # fmt: skip
    for broker, settings in PROCESS_SETTINGS.items():
        for setting in settings:
            rates = [run.value(broker, setting.system(), TOTAL.format(k=k)) for k in PROCESS_COUNTS]
            if all(rate is None for rate in rates):
                continue
            lines.append(
                f"| {broker}{f' ({setting.label})' if setting.label else ''} | "
                + " | ".join(_fmt(rate) for rate in rates)
                + " |"
            )
    return "\n".join(lines)


def cost_table(run: Run) -> str:
    lines = [
        "| broker (setting) | server CPU per message | commands per message "
        "| messages/s one server core carries | workers it keeps busy at their INCR rate "
        f"| at {FLEET_RATE} jobs/s each |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for broker, settings in COST_SETTINGS.items():
        for setting in settings:
            system = setting.system()
            cpu_us = run.value(broker, system, CPU)
            if not cpu_us:
                continue
            per_core = 1e6 / cpu_us
            incr = run.value(broker, system, "handle INCR")
            commands = run.value(broker, system, COMMANDS)
            lines.append(
                f"| {broker}{f' ({setting.label})' if setting.label else ''} "
                f"| {cpu_us:,.0f} µs | {_fmt(commands, '.1f')} | {per_core:,.0f} "
                f"| {_fmt(per_core / incr if incr else None)} "
                f"| {per_core / FLEET_RATE:,.0f} |"
            )
    return "\n".join(lines)


def scaling_section(run: Run) -> str:
    """docs/performance.md's "Scaling" section, every figure from ``run``."""
    n, big = backlog_sizes(run)
    lines = [
        f"From the same run as Performance ({run.started}; {run.machine}).",
        "",
        f"**Big queues.** `hermes worker` handles {n:,} due messages from a queue holding "
        f"nothing else, behind {big:,} more waiting, and beside {big:,} scheduled an hour "
        "ahead (no-op job):",
        "",
        backlog_table(run, tuple(BACKLOG_SETTINGS)),
        "",
        *[f"{note}" for note in run.notes if note.startswith("sqs")],
        "",
        f"**Several workers on one queue.** 1, 2 and 4 `hermes worker` processes share "
        f"one queue (INCR job; total messages/s; the machine has {os.cpu_count()} cores, "
        "and the broker runs on them too):",
        "",
        processes_table(run),
        "",
        "**What one message costs the broker**, emitted one by one and handled by "
        "`hermes worker`: the server's CPU time per message (Redis's own count; the "
        "server processes' elsewhere), and the rate one server core would carry at that "
        "cost. The fleet columns divide it by what one worker process handles: its INCR "
        f"rate in this run, and {FLEET_RATE} jobs/s (10 ms jobs).",
        "",
        cost_table(run),
        "",
        "Kafka's row is Tansu's, the in-memory Kafka-protocol broker the tests run: what "
        "Kafka itself spends is not measured here. SQS has no server here to measure "
        "(the local one is a stand-in); AWS bills it per request.",
        "",
        "**When one broker is not enough:**",
        "",
        *[f"- {broker}: {text}" for broker, text in SHARDING.items()],
    ]
    return "\n".join(lines) + "\n"


def driver_section(run: Run, broker: str) -> str:
    """What a driver README says of big queues: its rows, or why there are none."""
    notes = [note for note in run.notes if note.startswith(f"{broker}:")]
    if broker not in BACKLOG_SETTINGS:
        return "\n".join(notes)
    return backlog_table(run, (broker,)) + ("\n\n" + "\n".join(notes) if notes else "")
