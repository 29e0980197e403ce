"""Handle rate of one Hermes worker vs raw pika consume+ack, same prefetch, same broker.

    python drivers/rabbitmq/scripts/bench_handle.py [URL] [-n 5000] [--rounds 5]

Each round fills a fresh queue with n messages, then drains it with a
Dispatcher (no-op handler); again with ``driver.wait`` and a bare callback (core's
loop and the driver's consumer, without the Dispatcher); and with a plain pika consume loop that
parses the JSON and acks each message. Rounds alternate so
machine noise hits both sides; the medians are printed. Also measures a worker
that reads two priority queues (basic_get, exact order).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import pika

from hermes.core import Dispatcher, Message, connect
from hermes.drivers.rabbitmq import LazyRabbitMqDriver


class Noop:
    def handle(self, message: Message) -> bool:
        return True


def filled(url: str, n: int, priority: int = 100, **query: str) -> LazyRabbitMqDriver:
    extra = "".join(f"&{k}={v}" for k, v in query.items())
    driver = connect(f"{url}?queue=bench-{uuid.uuid4().hex[:8]}{extra}")
    assert isinstance(driver, LazyRabbitMqDriver)
    if priority != 100:
        driver.setup_priority_queue("high", priority)
    batch = [Message("bench", {"i": i}) for i in range(n)]
    for start in range(0, n, 500):
        driver.send_batch(batch[start : start + 500])
    return driver


def hermes(url: str, n: int, prefetch: int, two_priorities: bool = False) -> tuple[float, float]:
    driver = filled(url, n, 200 if two_priorities else 100, prefetch=str(prefetch))
    dispatcher = Dispatcher(driver).register_handler("bench", Noop())
    driver.set_max_process_items(n)
    started, cpu = time.perf_counter(), time.process_time()
    dispatcher.handle()
    rate = (n / (time.perf_counter() - started), (time.process_time() - cpu) / n * 1e6)
    driver.purge()
    driver.close()
    return rate


def driver_only(url: str, n: int, prefetch: int) -> tuple[float, float]:
    driver = filled(url, n, prefetch=str(prefetch))
    driver.set_max_process_items(n)
    started, cpu = time.perf_counter(), time.process_time()
    driver.wait(lambda message, priority: True)
    rate = (n / (time.perf_counter() - started), (time.process_time() - cpu) / n * 1e6)
    driver.purge()
    driver.close()
    return rate


def raw(url: str, n: int, prefetch: int) -> tuple[float, float]:
    driver = filled(url, n)
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    got = 0
    started, cpu = time.perf_counter(), time.process_time()
    for method, _properties, body in channel.consume(driver.queue, inactivity_timeout=10):
        if method is None:
            raise RuntimeError(f"only {got} of {n} messages arrived")
        json.loads(body)
        channel.basic_ack(method.delivery_tag)
        got += 1
        if got == n:
            break
    rate = (n / (time.perf_counter() - started), (time.process_time() - cpu) / n * 1e6)
    channel.cancel()
    connection.close()
    driver.purge()
    driver.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("-n", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for prefetch in (1, 10, 50):
        runs: dict[str, list[tuple[float, float]]] = {"hermes": [], "driver": [], "raw": []}
        for _ in range(args.rounds):
            runs["hermes"].append(hermes(args.url, args.n, prefetch))
            runs["driver"].append(driver_only(args.url, args.n, prefetch))
            runs["raw"].append(raw(args.url, args.n, prefetch))
        rate = {k: statistics.median(r for r, _ in v) for k, v in runs.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        print(
            f"prefetch={prefetch:<3} msgs/s: hermes {rate['hermes']:6,.0f} "
            f"({rate['hermes'] / rate['raw']:.2f}x)  driver.wait alone {rate['driver']:6,.0f} "
            f"({rate['driver'] / rate['raw']:.2f}x)  raw pika {rate['raw']:6,.0f}   "
            f"CPU us/msg: hermes {cpu['hermes']:.0f}  driver {cpu['driver']:.0f}  "
            f"raw {cpu['raw']:.0f}",
            flush=True,
        )
    two = statistics.median(hermes(args.url, args.n, 1, True)[0] for _ in range(args.rounds))
    print(f"two priority queues (basic_get, exact order): hermes {two:6,.0f} msgs/s", flush=True)


if __name__ == "__main__":
    main()
