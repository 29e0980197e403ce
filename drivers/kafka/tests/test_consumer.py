"""The Kafka consumer on a real broker: settles from any thread, commits, releases that rewind."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from hermes.core import BrokerUnavailableError, Message, connect
from hermes.core.driver import Consumer as HermesConsumer
from hermes.core.driver import Received
from hermes.core.drivertools import MessageSerializer
from hermes.drivers.kafka import KafkaDriver, _consumer

MakeDriver = Callable[..., KafkaDriver]
#: Generous: the first receive creates the topic and joins the group (about a second here).
WAIT_S = 20.0


def receive(consumer: HermesConsumer, timeout_s: float = WAIT_S) -> Received:
    """The next record, polling to a deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        received = consumer.receive(0.2)
        if received is not None:
            return received
    raise AssertionError(f"nothing received within {timeout_s:g} s")


def payload(received: Received, driver: KafkaDriver) -> Any:
    return MessageSerializer().unserialize(received.body).payload["n"]


def one_partition_with_jobs(make_driver: MakeDriver, count: int) -> KafkaDriver:
    """A driver on a one-partition topic holding jobs 0 .. count - 1, in that order."""
    driver = make_driver("&partitions=1")
    driver.send_batch([Message("job", {"n": i}) for i in range(count)])
    return driver


def committed(driver: KafkaDriver, topic: str | None = None) -> list[int]:
    """The group's committed offset per partition of ``topic`` (-1: none)."""
    consumer = Consumer({"bootstrap.servers": driver.bootstrap, "group.id": driver.group_id})
    try:
        partitions = [TopicPartition(topic or driver.topic, p) for p in range(driver.partitions)]
        return [max(tp.offset, -1) for tp in consumer.committed(partitions, timeout=10)]
    finally:
        consumer.close()


def test_receive_returns_none_within_its_timeout_when_nothing_comes(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()
    with driver.consumer([]) as consumer:
        assert consumer.receive(0.2) is None  # creates the topic and starts joining
        started = time.monotonic()
        assert consumer.receive(0.3) is None
        assert time.monotonic() - started < 0.3 + 2.0


def test_a_first_receive_the_broker_does_not_answer_is_unavailable_within_its_timeout() -> None:
    driver = connect("kafka://127.0.0.1:9/nowhere?message.timeout.ms=500")
    try:
        with driver.consumer([]) as consumer:
            started = time.monotonic()
            with pytest.raises(BrokerUnavailableError, match="creation of topic 'nowhere'"):
                consumer.receive(0.3)  # the worker backs off and calls again
            assert time.monotonic() - started < 0.3 + 5.0
    finally:
        driver.close()


def test_a_released_record_comes_back_before_the_records_after_it(
    make_driver: MakeDriver,
) -> None:
    driver = one_partition_with_jobs(make_driver, 3)
    with driver.consumer([]) as consumer:
        first = receive(consumer)
        consumer.ack(first)
        second = receive(consumer)
        assert [payload(first, driver), payload(second, driver)] == [0, 1]

        consumer.release(second)
        again = [receive(consumer) for _ in range(2)]

        assert [payload(r, driver) for r in again] == [1, 2]
        assert again[0].token.offset == second.token.offset
        for received in again:
            consumer.ack(received)
    assert committed(driver) == [3]


def test_records_after_a_released_one_that_are_still_running_are_not_handed_out_twice(
    make_driver: MakeDriver,
) -> None:
    driver = one_partition_with_jobs(make_driver, 3)
    with driver.consumer([]) as consumer:
        running = [receive(consumer) for _ in range(2)]  # two handlers at once
        consumer.release(running[0])

        again = [receive(consumer) for _ in range(2)]
        assert [payload(r, driver) for r in again] == [0, 2]
        assert consumer.receive(0.5) is None  # 1 is still running: not read twice

        for received in [running[1], *again]:
            consumer.ack(received)
    assert committed(driver) == [3]


def test_commits_cover_only_the_finished_records_before_the_oldest_open_one(
    make_driver: MakeDriver,
) -> None:
    driver = one_partition_with_jobs(make_driver, 4)
    with driver.consumer([]) as consumer:
        taken = [receive(consumer) for _ in range(4)]
        for index in (0, 2, 3):  # 1 is still running
            consumer.ack(taken[index])
    # Closed with 1 open: the commit stops there, and the next worker gets 1, 2 and 3.
    assert committed(driver) == [1]
    with driver.consumer([]) as consumer:
        assert [payload(receive(consumer), driver) for _ in range(3)] == [1, 2, 3]


def test_acks_from_other_threads_in_any_order_are_all_committed(
    make_driver: MakeDriver, eventually: Callable[..., Any]
) -> None:
    driver = one_partition_with_jobs(make_driver, 20)
    with driver.consumer([]) as consumer:
        taken = [receive(consumer) for _ in range(20)]
        threads = [
            threading.Thread(target=lambda part=part: [consumer.ack(r) for r in part])
            for part in (taken[1::2][::-1], taken[0::2])
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        # The receiving thread applies the acknowledgements between its polls.
        eventually(
            lambda: consumer.receive(0.2) is None and committed(driver) == [20],
            "all 20 offsets committed",
            WAIT_S,
        )


def test_a_release_drops_the_buffered_records_behind_it_so_they_come_in_order(
    make_driver: MakeDriver,
) -> None:
    # Priority topics buffer what one poll brings: the records behind a released
    # one come again after it, not before.
    driver = make_driver("&priority_topics=true&partitions=1")
    driver.setup_priority_queue("high", 200)
    for i in range(3):
        driver.send(Message("low", {"n": i}))
    with driver.consumer([]) as consumer:
        first = receive(consumer)
        assert payload(first, driver) == 0
        consumer.release(first)

        again = [receive(consumer) for _ in range(3)]

        assert [payload(r, driver) for r in again] == [0, 1, 2]
        for received in again:
            consumer.ack(received)
    assert committed(driver) == [3]


def test_a_settle_after_close_is_logged_and_not_committed(
    make_driver: MakeDriver, caplog: Any
) -> None:
    driver = one_partition_with_jobs(make_driver, 1)
    consumer = driver.consumer([])
    received = receive(consumer)
    consumer.close()

    consumer.ack(received)

    assert any("after the consumer closed" in r.getMessage() for r in caplog.records)
    assert committed(driver) == [-1]


# A broker that stops answering commits ------------------------------------------
# Killing the session's broker would break every other test, so a stand-in
# librdkafka consumer plays the broker that goes away and comes back.


class _Record:
    def __init__(self, topic: str, offset: int, value: bytes) -> None:
        self._topic, self._offset, self._value = topic, offset, value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


class _GoneBroker:
    """A stand-in librdkafka consumer whose broker stops answering, then answers again."""

    answering = True

    def __init__(self, config: dict[str, Any]) -> None:
        self.records: list[_Record] = []
        self.commits: list[list[tuple[int, bool]]] = []
        self.probes = 0

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.topic = topics[0]

    def poll(self, timeout: float) -> _Record | None:
        if self.records:
            return self.records.pop(0)
        time.sleep(timeout)
        return None

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        self.commits.append([(tp.offset, asynchronous) for tp in offsets])
        if not self.answering:
            error = KafkaError(KafkaError._WAIT_COORD, "Waiting for coordinator")
            raise KafkaException(error)
        return offsets

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.probes += 1
        if not self.answering:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Timed out"))
        return partitions

    def close(self) -> None:
        pass


def test_once_a_commit_goes_unanswered_none_is_sent_until_a_probe_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_consumer, "Client", _GoneBroker)
    monkeypatch.setattr(_consumer, "_PROBE_INTERVAL_S", 0.0)
    # The driver's real clients (the producer, the consumer connect() checks its
    # settings with) find nobody on port 9 and may report it before the first
    # receive, which would then raise it. The stand-in client is what this test
    # is about: the real clients' reports go unheard.
    monkeypatch.setattr(KafkaDriver, "log_client_error", lambda self, error: None)
    driver = connect("kafka://127.0.0.1:9/jobs?create_topics=false")
    assert isinstance(driver, KafkaDriver)
    body = MessageSerializer().serialize(Message("job")).encode()
    try:
        consumer = driver.consumer([])
        consumer.receive(0.01)  # joins: the stand-in client exists now
        client = consumer._sessions.get().client
        client.records = [_Record("jobs", offset, body) for offset in range(3)]

        # Each acknowledgement is committed by the next receive.
        consumer.ack(receive(consumer))
        second = receive(consumer)
        client.answering = False
        consumer.ack(second)
        third = receive(consumer)  # its commit goes unanswered
        consumer.ack(third)
        consumer.receive(0.05)  # this one is not even sent: the broker is asked instead
        assert client.commits == [[(1, False)], [(2, False)]]
        assert client.probes >= 1

        client.answering = True
        consumer.receive(0.05)
        assert client.commits == [[(1, False)], [(2, False)], [(3, False)]]
        consumer.close()
    finally:
        driver.close()
