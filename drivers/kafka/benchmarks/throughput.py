"""Messages/s of one Kafka worker and one emitter, against raw confluent-kafka doing the same.

    python tools/services.py run kafka -- \\
        python drivers/kafka/benchmarks/throughput.py {url} [--messages N] [--rounds R]

handle: a Dispatcher with a no-op handler reading N records as a new consumer
group, vs a raw ``Consumer.poll`` loop (no decoding) with the same commit
policy: a synchronous commit after every record, then (``commit_every=100``)
one after every 100. The clock runs from the first record to the last, so
joining and leaving the group (seconds) are left out of both. emit: ``Emitter.emit`` vs a raw
``produce`` + ``flush`` per message (both wait for the broker's ack), then
``send_batch`` vs produce-all + one flush. Raw and Hermes alternate for R
rounds; the best rate of each and the median ratio are printed.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

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
    """Notes when the first and the last message arrived."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0

    def handle(self, message: Message) -> bool:
        self.last = time.perf_counter()
        if self.first is None:
            self.first = self.last
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
        last = 0.0
        seen = 0
        try:
            while seen < n:
                record = consumer.poll(1.0)
                if record is None or record.error() is not None:
                    continue
                last = time.perf_counter()
                if first is None:
                    first = last
                seen += 1
                if seen % commit_every == 0 or seen == n:
                    consumer.commit(message=record, asynchronous=False)
            assert first is not None
            return (n - 1) / (last - first)
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
        driver.close()
        assert noop.first is not None
        # Up to the last handler call, as for raw: leaving the group is not counted.
        return (n - 1) / (noop.last - noop.first)

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

    rounds: int = args.rounds
    pairs: list[tuple[str, Callable[[], float], Callable[[], float]]] = [
        ("handle, commit each", lambda: raw_handle(1), lambda: hermes_handle(1)),
        ("handle, commit /100", lambda: raw_handle(100), lambda: hermes_handle(100)),
        ("emit, ack each", raw_emit, hermes_emit),
        ("emit, batch", raw_batch, hermes_batch),
    ]
    lines = []
    for name, raw, hermes in pairs:
        # Raw and Hermes alternate, so both see the same load on a shared machine;
        # the ratio is the median of the rounds' ratios.
        results = [(raw(), hermes()) for _ in range(rounds)]
        ratios = sorted(h / r for r, h in results)
        lines.append(
            f"{name:20s} raw {max(r for r, _ in results):9.0f} msg/s   "
            f"Hermes {max(h for _, h in results):9.0f} msg/s   "
            f"Hermes/raw {ratios[len(ratios) // 2]:.2f}x (rounds: "
            + ", ".join(f"{x:.2f}" for x in ratios)
            + ")"
        )
    emitter_driver.purge()
    emitter_driver.close()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
