"""Handle rate of one Hermes worker vs raw pika consume+ack, same prefetch, same broker.

    python drivers/rabbitmq/scripts/bench_handle.py [URL] [-n 5000] [--rounds 5]

Each round fills a fresh queue with n messages, then drains it with a
Dispatcher (no-op handler) and, on another fresh queue, with a plain pika
consume loop that parses the JSON and acks each message. Rounds alternate so
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


def hermes(url: str, n: int, prefetch: int, two_priorities: bool = False) -> float:
    driver = filled(url, n, 200 if two_priorities else 100, prefetch=str(prefetch))
    dispatcher = Dispatcher(driver).register_handler("bench", Noop())
    driver.set_max_process_items(n)
    started = time.perf_counter()
    dispatcher.handle()
    rate = n / (time.perf_counter() - started)
    driver.purge()
    driver.close()
    return rate


def raw(url: str, n: int, prefetch: int) -> float:
    driver = filled(url, n)
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)
    got = 0
    started = time.perf_counter()
    for method, _properties, body in channel.consume(driver.queue, inactivity_timeout=10):
        if method is None:
            raise RuntimeError(f"only {got} of {n} messages arrived")
        json.loads(body)
        channel.basic_ack(method.delivery_tag)
        got += 1
        if got == n:
            break
    rate = n / (time.perf_counter() - started)
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
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(args.rounds):
            ours.append(hermes(args.url, args.n, prefetch))
            theirs.append(raw(args.url, args.n, prefetch))
        h, r = statistics.median(ours), statistics.median(theirs)
        print(
            f"prefetch={prefetch:<3} hermes {h:7,.0f} msgs/s   raw pika {r:7,.0f} msgs/s   "
            f"ratio {h / r:.2f}",
            flush=True,
        )
    two = statistics.median(hermes(args.url, args.n, 1, True) for _ in range(args.rounds))
    print(f"two priority queues (basic_get, exact order): hermes {two:7,.0f} msgs/s", flush=True)


if __name__ == "__main__":
    main()
