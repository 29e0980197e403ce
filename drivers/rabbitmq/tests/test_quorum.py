"""Quorum work queues on the real broker: delivery counts, max_deliveries, refused settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
from hermes_test_support import eventually
from pika import exceptions as pika_exc

from hermes.core import ConfigurationError, DeliveryError, Message, connect
from hermes.core.driver import Consumer, Received
from hermes.core.drivertools import MessageSerializer
from hermes.drivers.rabbitmq import LazyRabbitMqDriver
from hermes.drivers.rabbitmq._quorum import NOT_FOR_QUORUM, delivery_count

MakeDriver = Callable[..., LazyRabbitMqDriver]

QUORUM = "x-queue-type=quorum"
#: Nothing listens there: a driver built on it does no I/O before it is used.
NOWHERE = "amqp://guest:guest@127.0.0.1:1/?queue=nowhere"
#: Long enough for what takes milliseconds on a slow shared machine.
GENEROUS_S = 10.0
#: For the worker processes of the max-deliveries test: each start imports Hermes.
WORKERS_S = 120.0


def receive(consumer: Consumer, what: str) -> Received:
    received: Received = eventually(lambda: consumer.receive(0.5), what, timeout_s=GENEROUS_S)
    return received


def message_id(received: Received) -> str:
    return MessageSerializer().unserialize(received.body).id


def test_the_count_is_one_more_than_the_header_and_one_without_it() -> None:
    assert delivery_count(None) == 1
    assert delivery_count({}) == 1
    assert delivery_count({"x-delivery-count": 0}) == 1  # a first basic_get on RabbitMQ 3.10
    assert delivery_count({"x-delivery-count": 2, "other": "x"}) == 3
    assert delivery_count({"x-delivery-count": "2"}) == 1  # not a count the broker made
    assert delivery_count({"x-delivery-count": True}) == 1


def test_classic_queues_count_no_deliveries(make_driver: MakeDriver) -> None:
    driver = make_driver()
    assert not driver.capabilities.counts_deliveries
    message = Message("t")
    driver.send(message)
    with driver.consumer(()) as consumer:
        first = receive(consumer, "the first delivery")
        assert first.delivery_count is None
        consumer.release(first)
        again = receive(consumer, "the released message")
        assert (message_id(again), again.delivery_count) == (message.id, None)
        consumer.ack(again)


def test_a_quorum_queue_counts_one_on_the_first_delivery_and_two_after_a_release(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver(QUORUM)
    assert driver.capabilities.counts_deliveries
    message = Message("t")
    driver.send(message)
    with driver.consumer(()) as consumer:  # one queue: pushed with basic_consume
        counts = []
        for _ in range(3):
            received = receive(consumer, f"delivery {len(counts) + 1}")
            assert message_id(received) == message.id
            counts.append(received.delivery_count)
            consumer.release(received)
        assert counts == [1, 2, 3]
        consumer.ack(receive(consumer, "the last delivery"))


def test_messages_taken_from_several_quorum_priority_queues_are_counted_too(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver(QUORUM)
    driver.setup_priority_queue("high", 200)
    high, low = Message("t"), Message("t")
    driver.send(low)
    driver.send(high, 200)
    with driver.consumer(()) as consumer:  # several queues: taken with basic_get
        first = receive(consumer, "the high-priority message")
        assert (message_id(first), first.priority, first.delivery_count) == (high.id, 200, 1)
        consumer.release(first)
        again = receive(consumer, "the released high-priority message")
        assert (message_id(again), again.delivery_count) == (high.id, 2)
        consumer.ack(again)
        other = receive(consumer, "the low-priority message")
        assert (message_id(other), other.priority, other.delivery_count) == (low.id, 100, 1)
        consumer.ack(other)


def test_a_delayed_message_reaches_a_quorum_queue_as_a_first_delivery(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver(f"{QUORUM}&delay=true")
    assert driver.capabilities.counts_deliveries
    due = time.time() + 0.5
    message = Message("t", execute_at=due)
    driver.send(message)
    with driver.consumer(()) as consumer:
        received = receive(consumer, "the delayed message")
        assert time.time() >= due
        assert (message_id(received), received.delivery_count) == (message.id, 1)
        consumer.ack(received)


def test_a_send_racing_another_connections_declaration_of_a_new_quorum_queue_is_stored(
    amqp_url: str, queue: str
) -> None:
    # RabbitMQ nacks publishes on one of two connections that declare a new
    # quorum queue at once, until the queue has started: without the driver
    # sending them again, several of these rounds raise DeliveryError.
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    try:
        for round_ in range(40):
            name = f"{queue}-{round_}"
            driver = connect(f"{amqp_url}?queue={name}&{QUORUM}")
            driver.queue_stats()  # opens its connection, so both declarations start together
            go = threading.Event()
            failed: list[DeliveryError] = []
            sender = threading.Thread(target=_send_when, args=(go, driver, failed))
            sender.start()
            go.set()
            channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
            sender.join(GENEROUS_S)
            try:
                assert failed == [], f"round {round_}: {failed[0]!r}"
                ready = channel.queue_declare(name, passive=True).method.message_count
                assert ready == 1, f"round {round_}: {ready} messages stored, not 1"
            finally:
                driver.teardown()
                driver.close()
    finally:
        connection.close()


def _send_when(go: threading.Event, driver: Any, failed: list[DeliveryError]) -> None:
    go.wait()
    try:
        driver.send(Message("t"))
    except DeliveryError as exc:  # the nack the driver should have sent again
        failed.append(exc)


def test_a_full_quorum_queue_that_refuses_a_publish_raises_delivery_error(
    make_driver: MakeDriver, queue: str, raw_channel: Any
) -> None:
    # The nack of a full queue is not the nack of a starting one: it raises,
    # once the short window after the declaration has passed.
    driver = make_driver(f"{QUORUM}&x-max-length=1&x-overflow=reject-publish")
    sent = 0
    with pytest.raises(DeliveryError, match="NackError"):
        for _ in range(5):
            driver.send(Message("t"))
            sent += 1
    assert 1 <= sent <= 2  # a quorum queue lets one message past x-max-length
    assert raw_channel.queue_declare(queue, passive=True).method.message_count == sent


def test_quorum_queues_refuse_durable_false_before_connecting() -> None:
    with pytest.raises(ConfigurationError) as info:
        connect(f"{NOWHERE}&{QUORUM}&durable=false")
    assert "x-queue-type=quorum cannot be combined with durable=false" in str(info.value)


@pytest.mark.parametrize("argument", sorted(NOT_FOR_QUORUM))
def test_quorum_queues_refuse_an_argument_rabbitmq_refuses_on_them_naming_it(
    argument: str,
) -> None:
    with pytest.raises(ConfigurationError) as info:
        connect(NOWHERE, queue_arguments={"x-queue-type": "quorum", argument: 1})
    assert f"x-queue-type=quorum cannot be combined with {argument}" in str(info.value)


#: A value RabbitMQ takes for each argument on a queue type that has it.
VALID_VALUES: dict[str, Any] = {
    "x-max-priority": 5,
    "x-queue-mode": "lazy",
    "x-queue-master-locator": "min-masters",
    "x-max-age": "1D",
}


@pytest.mark.parametrize("argument", sorted(NOT_FOR_QUORUM))
def test_rabbitmq_itself_refuses_each_argument_the_driver_refuses_on_quorum_queues(
    argument: str, amqp_url: str, queue: str
) -> None:
    # What the driver refuses up front must be what the broker refuses at the
    # declaration, or the driver would turn away a setting that works.
    value = VALID_VALUES[argument]
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        with pytest.raises(pika_exc.ChannelClosedByBroker) as info:
            connection.channel().queue_declare(
                queue, durable=True, arguments={"x-queue-type": "quorum", argument: value}
            )
        assert info.value.reply_code == 406
        assert argument in info.value.reply_text
    finally:
        if connection.is_open:
            connection.channel().queue_delete(queue)
            connection.close()


HANDLERS = textwrap.dedent(
    """
    import os
    import signal

    OUT = os.environ["HERMES_TEST_OUT"]


    def append(name, message):
        with open(os.path.join(OUT, name), "a") as file:
            file.write(message.id + "\\n")


    def kill(message):
        append("killer", message)
        os.kill(os.getpid(), signal.SIGKILL)


    def record(message):
        append("handled", message)
        return True


    handlers = {"kill": kill, "job": record}
    """
)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_max_deliveries_sets_aside_a_message_that_kills_its_worker_every_time(
    make_driver: MakeDriver, url: str, queue: str, raw_channel: Any, tmp_path: Path
) -> None:
    dead = f"{queue}.dead"
    raw_channel.queue_declare(dead, durable=True)
    query = f"{QUORUM}&x-dead-letter-exchange=&x-dead-letter-routing-key={dead}"
    (tmp_path / "jobs.py").write_text(HANDLERS)
    out = tmp_path / "out"
    out.mkdir()
    driver = make_driver(query)
    jobs = [Message("job", {"n": n}) for n in range(20)]
    killer = Message("kill")
    for message in [*jobs[:10], killer, *jobs[10:]]:
        driver.send(message)

    command = [sys.executable, "-m", "hermes.core.cli", "worker", "--url", f"{url}&{query}",
               "--handlers", "jobs:handlers", "--max-deliveries", "3"]  # fmt: skip
    env = {**os.environ, "HERMES_TEST_OUT": str(out)}
    runs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start() -> None:
        log = tmp_path / f"worker-{len(runs)}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                command, cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT
            )
        runs.append((process, log))

    def dead_letters() -> int:
        return int(raw_channel.queue_declare(dead, passive=True).method.message_count)

    def done() -> bool:
        # The restart loop a supervisor would be: a worker the killer took down is replaced.
        process, log = runs[-1]
        if process.poll() is not None:
            assert process.returncode == -signal.SIGKILL, log.read_text()
            start()
        handled = set(lines(out / "handled"))
        return handled >= {job.id for job in jobs} and dead_letters() == 1

    try:
        start()
        eventually(
            done,
            "every job handled and the killer dead-lettered",
            timeout_s=WORKERS_S,
            interval_s=0.1,
        )
        survivor, log = runs[-1]
        assert survivor.poll() is None, log.read_text()
        # The killer ran three times, and each time took its worker down.
        assert lines(out / "killer") == [killer.id] * 3
        assert [process.returncode for process, _ in runs[:-1]] == [-signal.SIGKILL] * 3
        assert "delivered 4 times, more than max_deliveries=3" in eventually(
            lambda: "max_deliveries" in log.read_text() and log.read_text(),
            "the set-aside line in the last worker's log",
        )
        method, _properties, body = raw_channel.basic_get(dead, auto_ack=True)
        assert method is not None and killer.id.encode() in body
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(GENEROUS_S) == 0, log.read_text()
    finally:
        for process, _ in runs:
            if process.poll() is None:
                process.kill()
            process.wait()
        raw_channel.queue_delete(dead)
