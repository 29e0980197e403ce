"""Messages/s of one Kafka worker and one emitter, against raw confluent-kafka doing the same.

    python tools/services.py run kafka -- \\
        python drivers/kafka/benchmarks/throughput.py {url} [--messages N] [--rounds R]

handle: a Dispatcher with a no-op handler reading N records as a new consumer
group, vs a raw ``Consumer.poll`` loop (no decoding) with the same commit
policy: a synchronous commit after every record, then (``commit_every=100``)
one after every 100. The clock starts at the first record, so the group
join (seconds) is left out of both. emit: ``Emitter.emit`` vs a raw
``produce`` + ``flush`` per message (both wait for the broker's ack), then
``send_batch`` vs produce-all + one flush. The best of R rounds each.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer

from hermes.core import (
    Dispatcher,
    DriverUrl,
    Emitter,
    Message,
    MessageSerializer,
    connect,
    isolated_url,
)
from hermes.drivers.kafka import KafkaDriver
from hermes.drivers.kafka._plugin import librdkafka_config
from hermes.drivers.kafka._settings import split


class Noop:
    def __init__(self) -> None:
        self.first: float | None = None

    def handle(self, message: Message) -> bool:
        if self.first is None:
            self.first = time.perf_counter()
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n: int = args.messages
    base = isolated_url(args.url, f"hermes-bench-{os.getpid()}")
    parsed = DriverUrl.parse(base)
    topic = parsed.path
    producer_config, consumer_config = split(librdkafka_config(parsed))
    emitter_driver = connect(base)
    assert isinstance(emitter_driver, KafkaDriver)
    serializer = MessageSerializer()
    bodies = [serializer.serialize(Message("noop", {"i": i})).encode() for i in range(n)]
    emitter_driver.produce(topic, bodies)
    groups = iter(range(1_000_000))

    def raw_handle(commit_every: int) -> float:
        consumer = Consumer(
            {
                **consumer_config,
                "group.id": f"raw-{os.getpid()}-{next(groups)}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([topic])
        first: float | None = None
        seen = 0
        try:
            while seen < n:
                record = consumer.poll(1.0)
                if record is None or record.error() is not None:
                    continue
                if first is None:
                    first = time.perf_counter()
                seen += 1
                if seen % commit_every == 0 or seen == n:
                    consumer.commit(message=record, asynchronous=False)
            assert first is not None
            return (n - 1) / (time.perf_counter() - first)
        finally:
            consumer.close()

    def hermes_handle(commit_every: int) -> float:
        url = DriverUrl.parse(base).with_options(
            group=f"hermes-{os.getpid()}-{next(groups)}", commit_every=str(commit_every)
        )
        driver = connect(url)
        driver.set_max_process_items(n)
        noop = Noop()
        Dispatcher(driver).register_handler("noop", noop).handle()
        end = time.perf_counter()
        driver.close()
        assert noop.first is not None
        return (n - 1) / (end - noop.first)

    producer = Producer({**producer_config, "acks": "all", "sticky.partitioning.linger.ms": 0})
    emit_n = min(n, 2000)

    def raw_emit() -> float:
        start = time.perf_counter()
        for body in bodies[:emit_n]:
            producer.produce(topic, body)
            producer.flush()
        return emit_n / (time.perf_counter() - start)

    def hermes_emit() -> float:
        emitter = Emitter(emitter_driver)
        start = time.perf_counter()
        for i in range(emit_n):
            emitter.emit(Message("noop", {"i": i}))
        return emit_n / (time.perf_counter() - start)

    def raw_batch() -> float:
        start = time.perf_counter()
        for body in bodies:
            producer.produce(topic, body)
        producer.flush()
        return n / (time.perf_counter() - start)

    def hermes_batch() -> float:
        messages = [Message("noop", {"i": i}) for i in range(n)]
        start = time.perf_counter()
        emitter_driver.send_batch(messages)
        return n / (time.perf_counter() - start)

    def best(run: Callable[..., float], *arg: Any) -> float:
        rounds: int = args.rounds
        return max(run(*arg) for _ in range(rounds))

    figures = {
        "handle raw, commit each": best(raw_handle, 1),
        "handle Hermes, commit each": best(hermes_handle, 1),
        "handle raw, commit /100": best(raw_handle, 100),
        "handle Hermes, commit /100": best(hermes_handle, 100),
        "emit raw, ack each": best(raw_emit),
        "emit Hermes, ack each": best(hermes_emit),
        "emit raw, batch": best(raw_batch),
        "emit Hermes, send_batch": best(hermes_batch),
    }
    emitter_driver.purge()
    emitter_driver.close()
    for name, rate in figures.items():
        print(f"{name:28s} {rate:9.0f} msg/s")
    pairs = [
        ("handle, commit each", "handle Hermes, commit each", "handle raw, commit each"),
        ("handle, commit /100", "handle Hermes, commit /100", "handle raw, commit /100"),
        ("emit, ack each", "emit Hermes, ack each", "emit raw, ack each"),
        ("emit, batch", "emit Hermes, send_batch", "emit raw, batch"),
    ]
    print("Hermes/raw: " + ", ".join(f"{k} {figures[h] / figures[r]:.2f}x" for k, h, r in pairs))


if __name__ == "__main__":
    main()
