"""Emit-to-handle latency of an idle Redis worker, in another process.

    python drivers/redis/benchmarks/latency.py [URL] [--messages N]

The worker is a Dispatcher on RedisSetDriver; each message is emitted only
once the previous one was handled and the worker went idle again, so every
figure is a wake-up from an idle wait (the wake-up list), not a busy loop.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import redis

from hermes.core import Dispatcher, Emitter, Message, connect, isolated_url


class Clock:
    """Handler that stores how long the message took from ``emit`` to here."""

    def __init__(self, client: redis.Redis[bytes], results: str) -> None:
        self.client = client
        self.results = results

    def handle(self, message: Message) -> bool:
        latency = time.time() - message.payload["emitted"]
        self.client.rpush(self.results, repr(latency))
        return True


def worker(url: str, results: str, count: int) -> None:
    driver = connect(url)
    driver.set_max_process_items(count)
    client = redis.Redis.from_url(url.split("?")[0])
    Dispatcher(driver).register_handler("latency", Clock(client, results)).handle()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--messages", type=int, default=500)
    args = parser.parse_args()
    url = isolated_url(args.url, f"hermes-bench-latency-{os.getpid()}")
    results = f"hermes-bench-latency-{os.getpid()}-results"
    client = redis.Redis.from_url(args.url)
    process = multiprocessing.get_context("spawn").Process(
        target=worker, args=(url, results, args.messages)
    )
    process.start()
    emitter = Emitter(connect(url))
    time.sleep(2)  # the worker imports and goes idle; no figure depends on this
    for i in range(args.messages):
        emitter.emit(Message("latency", {"emitted": time.time()}))
        while client.llen(results) <= i:
            time.sleep(0.0005)
        time.sleep(0.01)  # let the worker block on its wake-up list again
    process.join()
    latencies = sorted(float(x) * 1000 for x in client.lrange(results, 0, -1))
    keys = list(client.scan_iter(match=f"hermes-bench-latency-{os.getpid()}*"))
    if keys:
        client.delete(*keys)
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99)]
    print(f"emit->handle, idle worker: n={len(latencies)} p50={p50:.2f} ms p99={p99:.2f} ms")


if __name__ == "__main__":
    main()
