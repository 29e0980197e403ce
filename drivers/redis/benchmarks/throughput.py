"""Messages/s of one Redis worker and one emitter, against raw redis-py doing the same.

    python drivers/redis/benchmarks/throughput.py [URL] [--messages N] [--rounds R]

handle: a Dispatcher with a no-op handler draining N queued messages, in
each delivery mode (at-most-once: ``SPOP``; at-least-once: a lease per
message), vs a raw ``SPOP`` loop (no decoding) over the same set. emit:
``Emitter.emit`` vs a raw ``SADD`` of the same serialized strings. The rows
take turns within each round, so noise on a shared machine hits them alike;
each figure is the median of R rounds, and the ratios are taken per round.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

from hermes.core import (
    Dispatcher,
    DriverUrl,
    Emitter,
    Message,
    MessageSerializer,
    connect,
    isolated_url,
)
from hermes.core._registry import installed_plugins
from hermes.drivers.redis import RedisSetDriver

#: Where the last run's table goes (the README's figures cite it).
RESULTS = Path(__file__).with_name("results") / "throughput.md"


class Noop:
    def handle(self, message: Message) -> bool:
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--out", default=str(RESULTS), help="write the table here ('' to only print it)"
    )
    args = parser.parse_args()
    n = args.messages
    parsed = DriverUrl.parse(args.url)
    if "delivery" in parsed.options:
        parser.error("the URL must not choose a delivery mode: both modes are measured")
    url = isolated_url(args.url, f"hermes-bench-throughput-{os.getpid()}")
    leasing_url = DriverUrl.parse(url).with_options(delivery="at-least-once")
    probe = connect(url)
    assert isinstance(probe, RedisSetDriver)
    key = probe.key
    client = redis.Redis.from_url(args.url.split("?")[0])
    serializer = MessageSerializer()

    def fill() -> None:
        probe.purge()
        probe.send_batch([Message("noop", {"i": i}) for i in range(n)])

    def raw_spop() -> None:
        while client.spop(key) is not None:
            pass

    def hermes_handle(worker_url: str) -> Callable[[], None]:
        def run() -> None:
            driver = connect(worker_url)
            driver.set_max_process_items(n)
            Dispatcher(driver).register_handler("noop", Noop()).handle()
            driver.close()

        return run

    bodies = [serializer.serialize(Message("noop", {"i": i})) for i in range(n)]

    def raw_sadd() -> None:
        for body in bodies:
            client.sadd(key, body)

    def hermes_emit() -> None:
        driver = connect(url)
        emitter = Emitter(driver)
        for i in range(n):
            emitter.emit(Message("noop", {"i": i}))
        driver.close()

    def timed(run: Callable[[], None], prepare: Callable[[], None]) -> float:
        prepare()
        start = time.perf_counter()
        run()
        return n / (time.perf_counter() - start)

    rows: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "handle raw SPOP": (raw_spop, fill),
        "handle Hermes at-most-once": (hermes_handle(url), fill),
        "handle Hermes at-least-once": (hermes_handle(leasing_url), fill),
        "emit raw SADD": (raw_sadd, probe.purge),
        "emit Hermes": (hermes_emit, probe.purge),
    }
    rates: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, (run, prepare) in rows.items():
            rates[name].append(timed(run, prepare))
    probe.purge()
    probe.close()

    def ratio(ours: str, raw: str) -> str:
        per_round = [a / b for a, b in zip(rates[ours], rates[raw], strict=True)]
        return f"{statistics.median(per_round):.2f}x (min {min(per_round):.2f}x)"

    observers = [p.name for p in installed_plugins() if set(p.hooks) - {"hermes_drivers"}]
    plugins = ", ".join(observers) or "none"
    lines = [
        "`" + " ".join(["python drivers/redis/benchmarks/throughput.py", *sys.argv[1:]]) + "`",
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, redis-py {redis.__version__}, observer plugins: {plugins}; "
        f"n = {n} messages per row, {args.rounds} rounds, the rows taking turns in each.",
        "",
        "| row | median msgs/s | each round |",
        "|---|---:|---|",
    ]
    for name, values in rates.items():
        each = ", ".join(f"{v:,.0f}" for v in values)
        lines.append(f"| {name} | {statistics.median(values):,.0f} | {each} |")
    lines += ["", "| Hermes / raw, per round | median (min) |", "|---|---|"]
    for label, ours, raw in (
        ("handle, at-most-once", "handle Hermes at-most-once", "handle raw SPOP"),
        ("handle, at-least-once", "handle Hermes at-least-once", "handle raw SPOP"),
        ("emit", "emit Hermes", "emit raw SADD"),
    ):
        lines.append(f"| {label} | {ratio(ours, raw)} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        print(f"written to {out}")


if __name__ == "__main__":
    main()
