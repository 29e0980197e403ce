"""PostgreSQL figures until bench.run has postgres rows: hermes worker vs the raw SQL loop.

    python -m bench.postgres_quick [N]

Fills a table of its own with N no-op messages and times three consumers of
it: a raw psycopg loop running the driver's own claim and delete statements
on one connection (with the driver's synchronous_commit = off), ``hermes
worker --max-items N`` (its start-up, measured with ``--max-items 1``,
subtracted), and an in-process Worker; then the emit-to-handler latency of
200 messages sent one at a time to an idle worker. Prints; asserts nothing.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg

from hermes.core import Message, Worker, connect
from hermes.drivers.postgres import PostgresDriver
from hermes.drivers.postgres._schema import Names, Statements

BASE = "postgresql://postgres@127.0.0.1:5432/test"
HERMES = str(Path(sys.executable).with_name("hermes"))


def filled(n: int) -> tuple[str, PostgresDriver]:
    """A URL on a table of its own, holding ``n`` no-op messages, and its driver."""
    url = f"{BASE}?table=bench_{uuid.uuid4().hex[:8]}"
    driver = connect(url)
    assert isinstance(driver, PostgresDriver)
    messages = [Message("noop", {"i": i}) for i in range(n)]
    for i in range(0, n, 500):
        driver.send_batch(messages[i : i + 500])
    return url, driver


def raw_loop(n: int) -> float:
    _, driver = filled(n)
    statements = Statements(Names("public", driver.names.table))
    claim = statements.claim([100])
    params = {"queue": "default", "worker": "raw", "lease_s": 30.0}
    taken = 0
    with psycopg.connect(BASE, autocommit=True, options="-c synchronous_commit=off") as conn:
        start = time.perf_counter()
        while (row := conn.execute(claim, params).fetchone()) is not None:
            conn.execute(statements.ack, [row[0]])
            taken += 1
        elapsed = time.perf_counter() - start
    driver.teardown()
    driver.close()
    return taken / elapsed


def hermes_worker_s(n: int, jobs: Path) -> float:
    url, driver = filled(n)
    start = time.perf_counter()
    argv = [HERMES, "worker", "-q", "--url", url, "--handlers", "pg_bench_jobs:HANDLERS"]
    subprocess.run([*argv, "--max-items", str(n)], cwd=jobs, check=True)
    elapsed = time.perf_counter() - start
    driver.teardown()
    driver.close()
    return elapsed


def in_process(n: int) -> float:
    _, driver = filled(n)
    start = time.perf_counter()
    Worker(driver, lambda message, priority: True, max_items=n, handle_signals=False).run()
    elapsed = time.perf_counter() - start
    driver.teardown()
    driver.close()
    return n / elapsed


def latencies(count: int = 200) -> list[float]:
    _, driver = filled(0)
    seen: list[float] = []
    got = threading.Event()

    def handle(message: Message, priority: int) -> bool:
        seen.append(time.time() - message.payload["t"])
        got.set()
        return True

    worker = Worker(driver, handle, handle_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    for _ in range(count + 1):  # the first one warms up
        got.clear()
        driver.send(Message("x", {"t": time.time()}))
        got.wait(5)
        time.sleep(0.01)
    worker.stop()
    thread.join(5)
    driver.teardown()
    driver.close()
    return seen[1:]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    raw = raw_loop(n)
    print(f"raw psycopg claim + delete: {raw:,.0f} msgs/s")
    with tempfile.TemporaryDirectory(prefix="hermes-bench-pg-") as tmp:
        jobs = Path(tmp)
        (jobs / "pg_bench_jobs.py").write_text("HANDLERS = {'noop': lambda message: True}\n")
        start_up = min(hermes_worker_s(1, jobs) for _ in range(2))
        rate = n / (hermes_worker_s(n, jobs) - start_up)
    print(f"hermes worker: {rate:,.0f} msgs/s, {rate / raw:.2f}x raw (start-up {start_up:.2f} s)")
    print(f"Worker in-process: {in_process(n):,.0f} msgs/s")
    seen = latencies()
    p99 = statistics.quantiles(seen, n=100)[98]
    p50 = statistics.median(seen)
    print(f"emit-to-handler latency: p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms")


if __name__ == "__main__":
    main()
