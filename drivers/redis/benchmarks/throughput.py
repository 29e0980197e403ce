"""Messages/s of one Redis worker and one emitter, against raw redis-py doing the same.

    python drivers/redis/benchmarks/throughput.py [URL] [--messages N] [--rounds R]

handle: a Dispatcher with a no-op handler draining N queued messages, vs a
raw ``SPOP`` loop (no decoding) over the same set. emit: ``Emitter.emit`` vs
a raw ``SADD`` of the same serialized strings. The best of R rounds each.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import redis

from hermes.core import Dispatcher, Emitter, Message, MessageSerializer, connect, isolated_url
from hermes.drivers.redis import RedisSetDriver


class Noop:
    def handle(self, message: Message) -> bool:
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.messages
    url = isolated_url(args.url, f"hermes-bench-throughput-{os.getpid()}")
    probe = connect(url)
    assert isinstance(probe, RedisSetDriver)
    key = probe.key
    client = redis.Redis.from_url(args.url)
    serializer = MessageSerializer()

    def fill() -> None:
        driver = connect(url)
        assert isinstance(driver, RedisSetDriver)
        driver.purge()
        driver.send_batch([Message("noop", {"i": i}) for i in range(n)])
        driver.close()

    def raw_spop() -> None:
        while client.spop(key) is not None:
            pass

    def hermes_handle() -> None:
        driver = connect(url)
        driver.set_max_process_items(n)
        Dispatcher(driver).register_handler("noop", Noop()).handle()
        driver.close()

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

    def best(run: Callable[[], None], prepare: Callable[[], None]) -> float:
        rates: list[float] = []
        for _ in range(args.rounds):
            prepare()
            start = time.perf_counter()
            run()
            rates.append(n / (time.perf_counter() - start))
        return max(rates)

    def empty() -> None:
        probe.purge()

    figures = {
        "handle raw SPOP": best(raw_spop, fill),
        "handle Hermes": best(hermes_handle, fill),
        "emit raw SADD": best(raw_sadd, empty),
        "emit Hermes": best(hermes_emit, empty),
    }
    empty()
    probe.close()
    for name, rate in figures.items():
        print(f"{name:16s} {rate:8.0f} msg/s")
    handle = figures["handle Hermes"] / figures["handle raw SPOP"]
    emit = figures["emit Hermes"] / figures["emit raw SADD"]
    print(f"Hermes/raw: handle {handle:.2f}x, emit {emit:.2f}x")


if __name__ == "__main__":
    main()
