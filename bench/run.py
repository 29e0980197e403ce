"""Hermes against the raw clients and against Celery, RQ and Dramatiq, in one run.

    python -m bench.run [--quick] [--only filesystem,redis,...] [--out bench/results]

Every system runs the same no-op job (``bench/jobs.py``) in one worker
process against the same broker. Figures are written as Markdown, JSON and a
PNG chart under ``bench/results/`` (``latest.*`` and a timestamped copy).
Nothing here asserts a time: ``--quick`` is a smoke run that proves every
row can be measured.
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

from hermes.core import (  # noqa: E402
    DriverUrl,
    Emitter,
    Message,
    SupportsBatchSend,
    SupportsPurge,
    connect,
    isolated_url,
)


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
    rounds: int
    machine: str
    started: str
    samples: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    meta: dict[tuple[str, str, str], tuple[str, str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add(
        self, broker: str, system: str, metric: str, value: float, unit: str, note: str = ""
    ) -> None:
        key = (broker, system, metric)
        self.samples.setdefault(key, []).append(value)
        self.meta.setdefault(key, (unit, note))
        print(f"  {broker:<10} {system:<34} {metric:<22} {value:>12,.1f} {unit} {note}", flush=True)

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
                "rounds": self.rounds,
                "machine": self.machine,
                "started": self.started,
                "rows": [asdict(row) for row in self.rows],
                "samples": [[*key, values] for key, values in self.samples.items()],
                "ratios": ratios(self),
                "errors": self.errors,
            },
            indent=2,
        )


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, {platform.system()}"


# Worker processes -----------------------------------------------------------


def _env(n: int, out: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "HERMES_BENCH_N": str(n), "HERMES_BENCH_OUT": str(out), **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def wait_result(out: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if out.exists():
            return dict(json.loads(out.read_text()))
        if proc.poll() is not None and not out.exists():
            raise RuntimeError(f"worker exited with {proc.returncode} before finishing")
        time.sleep(0.05)
    raise RuntimeError(f"worker did not finish within {timeout_s:.0f} s")


@contextlib.contextmanager
def worker(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
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


# Hermes ---------------------------------------------------------------------


def bench_hermes(run: Run, broker: str, system: str, base_url: str, n: int) -> None:
    url = isolated_url(base_url, f"bench-{uuid.uuid4().hex[:8]}")
    driver = connect(url)
    try:
        emitter = Emitter(driver)
        started = time.perf_counter()
        for i in range(n):
            emitter.emit(Message("bench", {"i": i}))
        run.add(broker, system, "emit", n / (time.perf_counter() - started), "msgs/s", "one by one")
        handle(run, broker, system, url, n)
        if isinstance(driver, SupportsBatchSend):
            started = time.perf_counter()
            batch = [Message("bench", {"i": i}) for i in range(n)]
            for i in range(0, n, 100):
                driver.send_batch(batch[i : i + 100])
            run.add(
                broker,
                system,
                "emit batched",
                n / (time.perf_counter() - started),
                "msgs/s",
                "batches of 100",
            )
            handle(run, broker, system + " (batch-emitted)", url, n, record=False)
        latency(run, broker, system, url, driver)
    finally:
        if isinstance(driver, SupportsPurge):
            driver.purge()
        driver.close()


def handle(run: Run, broker: str, system: str, url: str, n: int, record: bool = True) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "bench.hermes_worker", url, str(n)]
        with worker(argv, _env(n, out)) as proc:
            result = wait_result(out, proc, 300)
        if record:
            run.add(broker, system, "handle", rate(result), "msgs/s", "one worker process")


def latency(run: Run, broker: str, system: str, url: str, driver: Any, count: int = 200) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "bench.hermes_worker", url, str(count)]
        with worker(argv, _env(count, out)) as proc:
            assert proc.stdout is not None
            proc.stdout.readline()  # "ready": the worker is about to wait
            time.sleep(1.5)  # let it settle into its idle wait
            run.add(broker, system, "idle worker RSS", rss_mb(proc.pid), "MB")
            emitter = Emitter(driver)
            for _ in range(count):
                emitter.emit(Message("bench", {"sent": time.time()}))
                time.sleep(0.01)  # light load: 100 msgs/s at most
            result = wait_result(out, proc, 120)
        lat = sorted(result["latencies"])
        run.add(
            broker,
            system,
            "latency p50",
            1000 * statistics.median(lat),
            "ms",
            "emit -> handler start",
        )
        run.add(
            broker,
            system,
            "latency p99",
            1000 * lat[int(0.99 * (len(lat) - 1))],
            "ms",
            "emit -> handler start",
        )


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
    run.add(
        "-",
        "hermes",
        "import hermes.core",
        min(samples),
        "ms",
        "best of 7, -X importtime, bytecode cached",
    )


# Raw clients ------------------------------------------------------------------


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
            "filesystem",
            "raw (rename+read+unlink)",
            "handle",
            timed(n, consume),
            "msgs/s",
            "no fsync",
        )


def raw_redis(run: Run, url: str, n: int) -> None:
    import redis

    client = redis.Redis.from_url(url)
    key = f"bench-raw-{uuid.uuid4().hex[:8]}"
    body = Message("bench", {}).__repr__().encode()

    def emit() -> None:
        for i in range(n):
            client.sadd(key, body + str(i).encode())

    def consume() -> None:
        while client.spop(key) is not None:
            pass

    run.add("redis", "raw redis-py", "emit", timed(n, emit), "msgs/s", "SADD")
    run.add("redis", "raw redis-py", "handle", timed(n, consume), "msgs/s", "SPOP loop")
    client.delete(key)


def raw_rabbitmq(run: Run, url: str, n: int, prefetch: int) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    queue = f"bench-raw-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(queue, durable=True)
    props = pika.BasicProperties(delivery_mode=2, content_type="application/json")

    def emit() -> None:
        for i in range(n):
            channel.basic_publish("", queue, b'{"i":%d}' % i, props)

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

    if prefetch == 1:
        run.add("rabbitmq", "raw pika", "emit", timed(n, emit), "msgs/s", "persistent, confirms")
    else:
        emit()
    run.add(
        "rabbitmq",
        f"raw pika prefetch={prefetch}",
        "handle",
        timed(n, consume),
        "msgs/s",
        "consume+ack",
    )
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
    run.add("sqs", "raw boto3", "handle", timed(n, consume), "msgs/s", "receive 10 + delete batch")
    client.delete_queue(QueueUrl=queue_url)


def raw_kafka(run: Run, bootstrap: str, n: int) -> None:
    from confluent_kafka import Consumer, Producer

    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})

    def emit() -> None:
        for i in range(n):
            producer.produce(topic, b'{"i":%d}' % i)
            producer.flush()

    run.add(
        "kafka",
        "raw confluent-kafka",
        "emit",
        timed(n, emit),
        "msgs/s",
        "produce + wait for report",
    )
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
    consumer.commit(first, asynchronous=False)

    def consume() -> None:
        got = 1
        while got < n:
            record = consumer.poll(5)
            if record is None:
                raise RuntimeError(f"raw kafka consumer stalled after {got} of {n}")
            if record.error():
                continue
            json.loads(record.value())
            consumer.commit(record, asynchronous=False)
            got += 1

    run.add(
        "kafka",
        "raw confluent-kafka",
        "handle",
        timed(n - 1, consume),
        "msgs/s",
        "poll + sync commit each",
    )
    consumer.close()


# Peers -----------------------------------------------------------------------


def bench_peer(run: Run, broker: str, system: str, url: str, n: int, tuned: bool) -> None:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    extra = {"HERMES_BENCH_BROKER": url, "HERMES_BENCH_QUEUE": queue}
    label = f"{system} {'tuned' if tuned else 'defaults'}"
    if tuned:
        extra["HERMES_BENCH_TUNED"] = "1"
        extra["dramatiq_queue_prefetch"] = "256"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = _env(n, out, **extra)
        emitted = subprocess.run(
            [sys.executable, "-m", "bench.peer_emit", system],
            env={**env, "HERMES_BENCH_OUT": ""},
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        run.add(broker, label, "emit", float(emitted.stdout.strip()), "msgs/s", "one by one")
        if system == "celery":
            argv = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "bench.peer_celery",
                "worker",
                "-Q",
                queue,
                "--loglevel=WARNING",
            ]
            argv += (
                ["--pool=solo", "--without-mingle", "--without-gossip", "--without-heartbeat"]
                if tuned
                else ["--concurrency=1"]
            )
        elif system == "dramatiq":
            argv = [sys.executable, "-m", "dramatiq", "bench.peer_dramatiq", "--processes", "1"]
        else:
            argv = [sys.executable, "-m", "bench.peer_rq"]
        with worker(argv, env) as proc:
            result = wait_result(out, proc, 600)
        note = {
            ("celery", False): "prefork, concurrency 1",
            ("celery", True): "solo pool, prefetch x128, no mingle/gossip/heartbeat",
            ("dramatiq", False): "1 process, 8 threads",
            ("dramatiq", True): "1 process, 8 threads, dramatiq_queue_prefetch=256",
            ("rq", False): "SimpleWorker, burst",
        }[(system, tuned)]
        run.add(broker, label, "handle", rate(result), "msgs/s", note)
    if url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(url)
        for key in client.scan_iter(f"*{queue}*"):
            client.delete(key)


# Report ----------------------------------------------------------------------

#: Hermes beside the raw client doing the same broker operations (its limit).
PAIRS = [
    # broker, Hermes system, raw system, target for Hermes/raw
    ("filesystem", "hermes fsync=false", "raw (rename+read+unlink)", ""),
    ("redis", "hermes", "raw redis-py", ">= 0.7x raw SPOP loop"),
    ("redis", "hermes at-least-once", "raw redis-py", ">= 0.8x raw SPOP loop"),
    ("rabbitmq", "hermes prefetch=1", "raw pika prefetch=1", ">= 0.7x raw pika"),
    ("rabbitmq", "hermes prefetch=50", "raw pika prefetch=50", ">= 0.7x raw pika"),
    ("sqs", "hermes", "raw boto3", ""),
    ("kafka", "hermes", "raw confluent-kafka", ">= 0.7x raw"),
]
PEERS = ("celery", "rq", "dramatiq")
#: Brokers the peers run on, with the target for best Hermes / fastest peer.
PEER_TARGETS = {"redis": ">= 2x fastest peer", "rabbitmq": ""}


def handle_rates(run: Run, broker: str, systems: tuple[str, ...]) -> list[tuple[float, str]]:
    """(msgs/s, system) of the handle rows on ``broker`` whose system begins with ``systems``."""
    return [
        (value, system)
        for (b, system, metric) in run.samples
        if b == broker
        and metric == "handle"
        and system.split()[0] in systems
        and (value := run.value(b, system, metric)) is not None
    ]


def fastest_peer(run: Run, broker: str) -> tuple[float, str] | None:
    return max(handle_rates(run, broker, PEERS), default=None)


def ratios(run: Run) -> list[tuple[str, float, str]]:
    found = []
    for broker, ours, raw, target in PAIRS:
        mine, limit = run.value(broker, ours, "handle"), run.value(broker, raw, "handle")
        if mine and limit:
            found.append((f"{broker}: {ours} / {raw} (handle)", mine / limit, target))
    for broker, target in PEER_TARGETS.items():
        best = max(handle_rates(run, broker, ("hermes",)), default=None)
        peer = fastest_peer(run, broker)
        if best and peer:
            name = f"{broker}: best hermes / fastest peer ({peer[1]})"
            found.append((name, best[0] / peer[0], target))
    return found


def markdown(run: Run) -> str:
    lines = [
        f"Machine: {run.machine}. Run: {run.started}, {'quick' if run.quick else 'full'}, "
        f"n = {run.n} messages per throughput row, Hermes and raw rows the median of "
        f"{run.rounds} alternating rounds.",
        "",
        "| broker | system | metric | value | unit | note |",
        "|---|---|---|---:|---|---|",
    ]
    for r in run.rows:
        lines.append(
            f"| {r.broker} | {r.system} | {r.metric} | {r.value:,.1f} | {r.unit} | {r.note} |"
        )
    lines += ["", "| ratio | value | target |", "|---|---:|---|"]
    lines += [f"| {name} | {value:.2f}x | {target} |" for name, value, target in ratios(run)]
    if run.errors:
        lines += ["", "Rows that could not be measured:", ""] + [f"- {e}" for e in run.errors]
    return "\n".join(lines) + "\n"


def summary(run: Run) -> str:
    """The README's table: one row per driver, Hermes beside its limit and its peers."""

    def fmt(value: float | None, spec: str = ",.0f") -> str:
        return "-" if value is None else format(value, spec)

    lines = [
        f"{run.machine}; {run.started}; n = {run.n}, median of {run.rounds} alternating "
        "Hermes/raw rounds (`./run test -s bench`, full table in `bench/results/latest.md`).",
        "",
        "| driver | handle msgs/s | raw client | Hermes/raw | fastest peer | Hermes/peer "
        "| emit->handle p50 / p99 | idle RSS |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for broker, ours, raw, _ in PAIRS:
        mine, limit = run.value(broker, ours, "handle"), run.value(broker, raw, "handle")
        best = fastest_peer(run, broker)
        p50, p99 = run.value(broker, ours, "latency p50"), run.value(broker, ours, "latency p99")
        lines.append(
            f"| {broker} ({ours.removeprefix('hermes').strip() or 'default'}) | {fmt(mine)} "
            f"| {fmt(limit)} | {fmt(mine / limit if mine and limit else None, '.2f')}x "
            f"| {f'{best[1]} {best[0]:,.0f}' if best else '-'} "
            f"| {fmt(mine / best[0] if mine and best else None, '.2f')}{'x' if best else ''} "
            f"| {fmt(p50, '.1f')} / {fmt(p99, '.1f')} ms "
            f"| {fmt(run.value(broker, ours, 'idle worker RSS'), '.0f')} MB |"
        )
    imported = run.value("-", "hermes", "import hermes.core")
    lines += ["", f"`import hermes.core`: {fmt(imported, '.0f')} ms (best of 7, bytecode cached)."]
    return "\n".join(lines) + "\n"


def chart(run: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in run.rows if r.metric == "handle"]
    labels = [f"{r.broker}: {r.system}" for r in rows]
    colors = [
        "#2b6cb0"
        if r.system.startswith("hermes")
        else "#a0aec0"
        if r.system.startswith("raw")
        else "#dd6b20"
        for r in rows
    ]
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.5))
    ax.barh(labels, [r.value for r in rows], color=colors)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("handled msgs/s, one worker process (log scale)")
    ax.set_title("Hermes (blue) vs raw client (grey) vs peers (orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--only", default="", help="comma-separated brokers (default: all)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("-n", type=int, default=0, help="messages per throughput row")
    parser.add_argument("--rounds", type=int, default=0, help="Hermes/raw rounds (median)")
    args = parser.parse_args()
    n = args.n or (300 if args.quick else 10_000)
    # Hermes and the raw client take turns, so a burst of noise on this shared
    # machine hits both; the peers run once each.
    rounds = args.rounds or (1 if args.quick else 3)
    run = Run(args.quick, n, rounds, machine(), time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    only = set(filter(None, args.only.split(",")))

    def section(name: str, fn: Callable[[], None]) -> None:
        if only and name not in only:
            return
        print(f"== {name}", flush=True)
        try:
            fn()
        except Exception as exc:  # one broken section must not hide the others' figures
            run.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            print(f"  !! {name}: {exc}", flush=True)

    def filesystem() -> None:
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as tmp:
                bench_hermes(run, "filesystem", "hermes fsync=true", f"file://{tmp}/q1", n)
                bench_hermes(
                    run, "filesystem", "hermes fsync=false", f"file://{tmp}/q2?fsync=false", n
                )
            raw_filesystem(run, n)

    def redis_section() -> None:
        url = services.ensure_redis()
        for _ in range(rounds):
            bench_hermes(run, "redis", "hermes", url, n)
            bench_hermes(run, "redis", "hermes at-least-once", f"{url}?delivery=at-least-once", n)
            raw_redis(run, url, n)
        for system, tuned in (
            ("celery", False),
            ("celery", True),
            ("rq", False),
            ("dramatiq", False),
            ("dramatiq", True),
        ):
            bench_peer(run, "redis", system, url, n, tuned)

    def rabbitmq() -> None:
        url = services.ensure_rabbitmq()
        for prefetch in (1, 50) * rounds:
            bench_hermes(
                run,
                "rabbitmq",
                f"hermes prefetch={prefetch}",
                f"{url}?queue=bench&prefetch={prefetch}",
                n,
            )
            raw_rabbitmq(run, url, n, prefetch)
        for system, tuned in (
            ("celery", False),
            ("celery", True),
            ("dramatiq", False),
            ("dramatiq", True),
        ):
            bench_peer(run, "rabbitmq", system, url, n, tuned)

    def sqs() -> None:
        with services.service_url("sqs") as url:
            endpoint = DriverUrl.parse(url).options["endpoint_url"]
            # One round of 1,000: the local SQS server, not Hermes, sets this pace.
            bench_hermes(run, "sqs", "hermes", url, min(n, 1000))
            raw_sqs(run, endpoint, min(n, 1000))

    def kafka() -> None:
        with services.service_url("kafka") as url:
            for _ in range(rounds):
                bench_hermes(run, "kafka", "hermes", url, n)
                raw_kafka(run, url.split("//", 1)[1].split("/", 1)[0], n)

    section("import", lambda: import_time(run))
    section("filesystem", filesystem)
    section("redis", redis_section)
    section("rabbitmq", rabbitmq)
    section("sqs", sqs)
    section("kafka", kafka)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    prefix = "quick" if args.quick else "latest"
    try:
        chart(run, out / f"{prefix}.png")
    except ImportError as exc:
        run.errors.append(f"chart: matplotlib is needed for the PNG ({exc})")
    # Only a full run without errors replaces the README's figures: a failed
    # section would otherwise turn its row into dashes.
    if not args.quick and not only and not run.errors:
        problem = replace_section(ROOT / "README.md", "bench", summary(run))
        if problem:
            run.errors.append(problem)
    md = markdown(run)  # last: it lists every error above
    names = [prefix] if args.quick else [prefix, stamp]
    for name in names:
        (out / f"{name}.md").write_text(md)
        (out / f"{name}.json").write_text(run.to_json())
    print()
    print(md)
    print(summary(run))
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())
