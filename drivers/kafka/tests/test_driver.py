"""KafkaDriver against a real Kafka-protocol broker (Tansu on 127.0.0.1)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from hermes.core import (
    DEFAULT_PRIORITY,
    BrokerUnavailableError,
    DeliveryError,
    Message,
    NotSupportedError,
    UnknownPriorityError,
    compat,
    connect,
)
from hermes.core.driver import Delay, Delivery
from hermes.drivers.kafka import KafkaDriver

MakeDriver = Callable[..., KafkaDriver]
Handle = Callable[..., Any]
Poll = Callable[..., Any]


def read_topic(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, dict[str, bytes]]]:
    """The first ``count`` records of ``topic`` (value, headers), read without a group."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[tuple[bytes, dict[str, bytes]]] = []
        deadline = time.monotonic() + 15
        while len(records) < count and time.monotonic() < deadline:
            record = consumer.poll(0.2)
            if record is not None and record.error() is None:
                pairs = record.headers() or []
                items = pairs.items() if isinstance(pairs, dict) else pairs
                headers = {key: value if isinstance(value, bytes) else b"" for key, value in items}
                records.append((record.value() or b"", headers))
        return records
    finally:
        consumer.close()


def committed_total(driver: KafkaDriver) -> int:
    """The sum of the group's committed offsets over the driver's topic."""
    consumer = Consumer({"bootstrap.servers": driver.bootstrap, "group.id": driver.group_id})
    try:
        partitions = [TopicPartition(driver.topic, p) for p in range(driver.partitions)]
        return sum(max(tp.offset, 0) for tp in consumer.committed(partitions, timeout=10))
    finally:
        consumer.close()


def test_a_message_sent_before_the_worker_starts_arrives_with_every_field_intact(
    make_driver: MakeDriver, handle: Handle
) -> None:
    driver = make_driver()
    sent = Message(
        "order.paid",
        {"id": 7, "name": "Žofia \u2603", "nested": [1, 2.5, None]},
        created=1764480000.125,
        execute_at=1764480016.5,
        retries=3,
    )
    driver.send(sent)

    received = handle(driver, 1)

    assert received.messages == [sent]
    assert received.priorities == [DEFAULT_PRIORITY]


def test_the_default_driver_is_at_least_once_without_delay_or_priorities(
    make_driver: MakeDriver,
) -> None:
    capabilities = make_driver().capabilities

    assert capabilities.delivery is Delivery.AT_LEAST_ONCE
    assert capabilities.delay is Delay.IGNORED
    assert capabilities.priorities is False
    assert capabilities.competing_consumers is True
    # session.timeout.ms=2000 in the test URL: a dead member is replaced within 2 x 2 s + 2 s.
    assert capabilities.redelivery_timeout_s == pytest.approx(6.0)


def test_a_batch_and_sends_from_many_threads_all_arrive_once(
    make_driver: MakeDriver, handle: Handle
) -> None:
    driver = make_driver()
    driver.send_batch([Message("batch", {"v": i}) for i in range(20)])

    def emit(thread: int) -> None:
        for i in range(10):
            driver.send(Message("thread", {"v": thread * 100 + i}))

    threads = [threading.Thread(target=emit, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    received = handle(driver, 80)

    assert sorted(m.payload["v"] for m in received.messages if m.type == "batch") == list(range(20))
    threaded = [m.payload["v"] for m in received.messages if m.type == "thread"]
    assert sorted(threaded) == sorted(t * 100 + i for t in range(6) for i in range(10))


def test_a_driver_created_before_fork_sends_from_the_child(
    make_driver: MakeDriver, handle: Handle
) -> None:
    driver = make_driver()
    driver.send(Message("from.parent"))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            driver.send(Message("from.child"))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    driver.send(Message("parent.again"))

    received = handle(driver, 3)

    assert sorted(m.type for m in received.messages) == [
        "from.child",
        "from.parent",
        "parent.again",
    ]


def test_a_driver_created_before_fork_works_as_a_worker_in_the_child(
    make_driver: MakeDriver, handle: Handle
) -> None:
    driver = make_driver()
    driver.send(Message("job"))  # the parent's producer and admin client exist now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            received = handle(driver, 1)
            code = 0 if [m.type for m in received.messages] == ["job"] else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    driver.send(Message("parent.again"))  # the parent's clients were left alone
    assert [m.type for m in handle(driver, 1).messages] == ["parent.again"]


def test_an_oversized_message_is_refused_before_it_reaches_the_producer(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()

    with pytest.raises(DeliveryError, match=r"over this driver's max_message_bytes") as raised:
        driver.send(Message("huge", {"v": "x" * 1_100_000}))

    assert raised.value.__cause__ is None  # core's own check: librdkafka never saw it


def test_a_send_nobody_confirms_raises_broker_unavailable_after_the_message_timeout() -> None:
    driver = connect("kafka://127.0.0.1:9/nowhere?create_topics=false&message.timeout.ms=500")
    try:
        with pytest.raises(BrokerUnavailableError, match=r"timed out|did not confirm") as raised:
            driver.send(Message("lost"))
    finally:
        driver.close()

    assert raised.value.__cause__ is not None


class SharedProducer:
    """A stand-in Producer holding another thread's record that is not delivered yet.

    Like librdkafka's, ``poll`` serves the reports that are ready and ``flush``
    also waits (up to its timeout) until every record of the producer is out.
    """

    def __init__(self) -> None:
        self.ready: list[Callable[[Any, Any], None]] = []
        self.others_outstanding = 1

    def produce(self, topic: str, value: bytes, headers: Any, on_delivery: Any) -> None:
        self.ready.append(on_delivery)

    def poll(self, timeout: float) -> int:
        served, self.ready = self.ready, []
        for report in served:
            report(None, None)
        return len(served)

    def flush(self, timeout: float) -> int:
        self.poll(0)
        time.sleep(timeout)
        return self.others_outstanding


def test_a_send_waits_for_its_own_records_not_for_other_threads_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = connect("kafka://127.0.0.1:9/jobs?create_topics=false")
    assert isinstance(driver, KafkaDriver)
    monkeypatch.setattr(driver, "_producer", SharedProducer)
    try:
        started = time.monotonic()
        driver.send_batch([Message("mine"), Message("mine too")])
        assert time.monotonic() - started < 0.5
    finally:
        driver.close()


def test_an_unreachable_broker_fails_send_with_broker_unavailable_naming_it() -> None:
    driver = connect("kafka://127.0.0.1:9/nowhere?message.timeout.ms=500")
    try:
        with pytest.raises(BrokerUnavailableError, match=r"127\.0\.0\.1:9"):
            driver.send(Message("lost"))
    finally:
        driver.close()


def test_a_record_that_is_not_a_message_is_logged_set_aside_and_copied_to_dead_letters(
    make_driver: MakeDriver,
    kafka_bootstrap: str,
    caplog: pytest.LogCaptureFixture,
    handle: Handle,
    eventually: Poll,
) -> None:
    # One partition: the poison records come before "after", so all are done when it is.
    driver = make_driver(f"&partitions=1&dead_letter_topic=dl-{os.getpid()}-{time.monotonic_ns()}")
    dead_letters = driver.dead_letter_topic
    assert dead_letters is not None
    driver.send(Message("before"))
    driver.send_raw(b"\xff not json")
    driver.send_raw(b'{"message": {"id": "no type"}}')
    driver.send(Message("after"))

    with caplog.at_level(logging.WARNING, logger="hermes"):
        received = handle(driver, 2)
        eventually(lambda: committed_total(driver) == 4, "4 offsets committed", 20.0)

    assert sorted(m.type for m in received.messages) == ["after", "before"]
    # The worker logs why; the driver logs where the record was and where it went.
    errors = [r.getMessage() for r in caplog.records if "not a Hermes message" in r.getMessage()]
    assert len(errors) == 2
    assert any("Cannot unserialize" in text for text in errors)
    assert any("Invalid message format" in text for text in errors)
    set_aside = [r.getMessage() for r in caplog.records if "set aside (" in r.getMessage()]
    assert sorted(set_aside) == [
        f"Kafka record {driver.topic}[0]@{offset} set aside "
        f"(copied to dead-letter topic {dead_letters}) and committed past"
        for offset in (1, 2)
    ]
    copies = read_topic(kafka_bootstrap, dead_letters, 2)
    assert sorted(value for value, _ in copies) == sorted(
        [b"\xff not json", b'{"message": {"id": "no type"}}']
    )
    assert all(headers["hermes-origin"].startswith(driver.topic.encode()) for _, headers in copies)


def test_a_callback_that_raises_leaves_its_record_for_the_next_wait(
    make_driver: MakeDriver, handle: Handle, eventually: Poll
) -> None:
    driver = make_driver()
    driver.send(Message("fragile"))

    def explode(message: Message, priority: int) -> bool:
        raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError, match="handler bug"):
        compat.wait(driver, explode)
    received = handle(driver, 1)

    assert [m.type for m in received.messages] == ["fragile"]
    eventually(lambda: committed_total(driver) == 1, "1 offset committed", 20.0)


def test_commit_every_n_still_commits_what_was_handled_when_wait_returns(
    make_driver: MakeDriver, handle: Handle
) -> None:
    driver = make_driver("&commit_every=100&commit_interval_s=60")
    for i in range(5):
        driver.send(Message("counted", {"v": i}))

    received = handle(driver, 5)

    assert len(received) == 5
    assert committed_total(driver) == 5


def test_max_items_returns_after_that_many_and_the_rest_stay_for_the_next_worker(
    make_driver: MakeDriver, handle: Handle
) -> None:
    driver = make_driver()
    for i in range(4):
        driver.send(Message("item", {"v": i}))
    compat.set_max_process_items(driver, 1)

    first = handle(driver, 4)  # max items ends it after 1
    second = handle(make_driver(), 3)

    assert len(first) == 1
    assert sorted(first.payloads + second.payloads) == [0, 1, 2, 3]


#: A worker's first receive on topics that exist, in a fresh interpreter: prints how
#: many producers and admin clients the driver made, and whether the admin module
#: (0.4 MB a worker does not need) was imported.
_IDLE_WORKER = """
import sys
import time
from hermes.core import connect
from hermes.drivers.kafka import _driver

made = {"producer": 0, "admin": 0}
class Producer(_driver.Producer):
    def __init__(self, *args, **kwargs):
        made["producer"] += 1
        super().__init__(*args, **kwargs)
_driver.Producer = Producer
new_admin = _driver.KafkaDriver._new_admin
def counted(driver):
    made["admin"] += 1
    return new_admin(driver)
_driver.KafkaDriver._new_admin = counted

driver = connect(sys.argv[1])
consumer = driver.consumer(list(driver.topics))
deadline = time.monotonic() + 30
received = None
while received is None and time.monotonic() < deadline:
    received = consumer.receive(1)
consumer.ack(received)
consumer.close()
driver.close()
print(received.decoded().payload["v"], made["producer"], made["admin"],
      "confluent_kafka.admin" in sys.modules)
"""


def test_a_worker_on_topics_that_exist_makes_no_producer_and_no_admin_client(
    make_driver: MakeDriver, kafka_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[KafkaDriver] = []
    new_admin = KafkaDriver._new_admin

    def counted(driver: KafkaDriver) -> AdminClient:
        made.append(driver)
        return new_admin(driver)

    monkeypatch.setattr(KafkaDriver, "_new_admin", counted)
    first = make_driver()
    first.send(Message("job", {"v": 1}))
    assert made == [first], "the first driver creates the topics with an admin client"

    worker = subprocess.run(
        [sys.executable, "-c", _IDLE_WORKER, kafka_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert worker.returncode == 0, worker.stderr[-2000:]
    value, producers, admins, admin_module = worker.stdout.split()
    assert value == "1"
    assert (producers, admins, admin_module) == ("0", "0", "False"), (
        "a worker on topics that exist needs neither a producer nor the admin client"
    )


def test_teardown_deletes_the_topic_and_forgets_it(
    make_driver: MakeDriver, handle: Handle, eventually: Poll
) -> None:
    driver = make_driver()
    driver.send(Message("doomed"))
    admin = AdminClient({"bootstrap.servers": driver.bootstrap})
    assert driver.topic in admin.list_topics(timeout=10).topics

    driver.teardown()

    eventually(
        lambda: driver.topic not in admin.list_topics(timeout=10).topics,
        "the topic to be deleted",
        20.0,
    )
    driver.send(Message("reborn"))
    assert [m.type for m in handle(driver, 1).messages] == ["reborn"]


def test_without_priority_topics_priorities_are_refused(make_driver: MakeDriver) -> None:
    driver = make_driver()

    with pytest.raises(NotSupportedError, match="priority_topics"):
        driver.setup_priority_queue("high", 200)
    with pytest.raises(UnknownPriorityError, match="200"):
        driver.send(Message("urgent"), 200)


def test_priority_topics_are_read_highest_priority_first(
    make_driver: MakeDriver, handle: Handle
) -> None:
    driver = make_driver("&priority_topics=true")
    driver.setup_priority_queue("high", 200)
    driver.setup_priority_queue("low", 50)
    assert driver.capabilities.priorities is True
    for i in range(3):
        driver.send(Message("low", {"v": i}), 50)
        driver.send(Message("normal", {"v": i}))
        driver.send(Message("high", {"v": i}), 200)

    received = handle(driver, 9)

    assert received.priorities == [200] * 3 + [100] * 3 + [50] * 3
    assert [m.type for m in received.messages[:3]] == ["high"] * 3


def test_a_worker_restricted_to_a_priority_reads_only_its_topic(
    make_driver: MakeDriver, handle: Handle
) -> None:
    driver = make_driver("&priority_topics=true")
    driver.setup_priority_queue("high", 200)
    driver.send(Message("normal"))
    driver.send(Message("high"), 200)

    received = handle(driver, 1, priorities=[200])

    assert [m.type for m in received.messages] == ["high"]
    assert [m.type for m in handle(driver, 1).messages] == ["normal"]


def test_a_worker_on_an_unreachable_broker_logs_it_and_still_stops_on_shutdown(
    handle: Handle, caplog: pytest.LogCaptureFixture
) -> None:
    driver = connect("kafka://127.0.0.1:9/nowhere?create_topics=false")
    assert isinstance(driver, KafkaDriver)
    try:
        with caplog.at_level(logging.WARNING, logger="hermes.drivers.kafka"):
            received = handle(driver, 1, timeout_s=2.0)
    finally:
        driver.close()

    assert len(received) == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "hermes.drivers.kafka"]
    assert any("127.0.0.1:9" in text for text in warnings)
    assert len(warnings) == len(set(warnings)), "a repeated complaint was logged twice"


def test_queue_stats_is_the_groups_lag_and_purge_skips_it(make_driver) -> None:
    from hermes.core import UnknownPriorityError

    driver = make_driver("&priority_topics=true&partitions=2")
    driver.setup_priority_queue("high", 200)
    for n in range(3):  # one by one: Tansu (the test broker) counts a batch as one offset
        driver.send(Message("job", {"n": n}))
    driver.send(Message("job", {"n": 9}), 200)

    rows = {row.priority: row for row in driver.queue_stats()}
    assert [rows[200].ready, rows[100].ready] == [1, 3]
    assert rows[100].in_flight is None  # the lag cannot tell held from waiting
    assert rows[100].scheduled == 0  # delivered at once: nothing is ever held

    with pytest.raises(UnknownPriorityError):
        driver.purge(300)
    assert driver.purge(100) == 3
    rows = {row.priority: row for row in driver.queue_stats()}
    assert [rows[200].ready, rows[100].ready] == [1, 0]
