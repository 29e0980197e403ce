"""LazyRabbitMqDriver against the real RabbitMQ on 127.0.0.1:5672."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pika
import pytest
from pika import exceptions as pika_exc

from hermes.core import (
    BrokerUnavailableError,
    ConfigurationError,
    DeliveryError,
    Dispatcher,
    Message,
    UnknownPriorityError,
    compat,
    connect,
)
from hermes.core.driver import Delay, Delivery, QueueStats
from hermes.drivers.rabbitmq import LazyRabbitMqDriver
from hermes.drivers.rabbitmq._delay import DUE_TOLERANCE_S

MakeDriver = Callable[..., LazyRabbitMqDriver]


def test_nothing_connects_before_the_first_send_and_then_an_unreachable_broker_raises() -> None:
    driver = connect("amqp://guest:guest@127.0.0.1:1/?queue=nowhere")
    with pytest.raises(BrokerUnavailableError) as info:
        driver.send(Message("t"))
    assert "127.0.0.1:1" in str(info.value)
    assert isinstance(info.value.__cause__, pika_exc.AMQPConnectionError)


def test_a_message_sent_before_the_worker_starts_is_handled(
    make_driver: MakeDriver, collector: Any
) -> None:
    sender = make_driver()
    message = Message("greet", {"name": "Ada", "list": [1, 2.5, None]}, execute_at=123.5)
    sender.send(message)
    worker = make_driver()
    compat.set_max_process_items(worker, 1)
    compat.wait(worker, collector)
    assert [got for got, _, _ in collector.got] == [message]
    assert collector.got[0][1] == 100


def test_queues_are_durable_and_messages_persistent_by_default(
    make_driver: MakeDriver, queue: str, raw_channel: Any
) -> None:
    make_driver().send(Message("t"))
    method, properties, body = raw_channel.basic_get(queue, auto_ack=True)
    assert method is not None and b'"type":"t"' in body
    assert properties.delivery_mode == 2
    assert properties.content_type == "application/json"
    # Declaring it non-durable fails only because it exists as durable.
    with pytest.raises(pika_exc.ChannelClosedByBroker) as info:
        raw_channel.queue_declare(queue, durable=False)
    assert info.value.reply_code == 406


def test_durable_false_gives_a_transient_queue_and_messages(
    make_driver: MakeDriver, queue: str, amqp_url: str
) -> None:
    make_driver("durable=false").send(Message("t"))
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=False)  # same settings: accepted
        _, properties, _ = channel.basic_get(queue, auto_ack=True)
        assert properties.delivery_mode == 1
    finally:
        connection.close()


def test_a_queue_declared_with_other_arguments_is_a_clear_configuration_error(
    make_driver: MakeDriver,
) -> None:
    make_driver().send(Message("t"))
    other = make_driver("x-max-length=5")
    with pytest.raises(ConfigurationError, match=r"x-max-length|PRECONDITION_FAILED"):
        other.send(Message("t"))


def test_a_queue_deleted_behind_the_drivers_back_is_declared_again_on_send(
    make_driver: MakeDriver, queue: str, raw_channel: Any
) -> None:
    driver = make_driver()
    driver.send(Message("first"))
    raw_channel.queue_delete(queue)
    driver.send(Message("second"))
    method, _, body = raw_channel.basic_get(queue, auto_ack=True)
    assert method is not None and b'"second"' in body


def test_a_publish_the_broker_refuses_raises_delivery_error(make_driver: MakeDriver) -> None:
    driver = make_driver("x-max-length=1&x-overflow=reject-publish")
    driver.send(Message("fits"))
    with pytest.raises(DeliveryError, match="NACKed") as info:
        driver.send(Message("overflows"))
    assert isinstance(info.value.__cause__, pika_exc.NackError)


def test_a_callback_that_raises_leaves_its_message_for_the_next_wait(
    make_driver: MakeDriver, collector: Any
) -> None:
    driver = make_driver()
    message = Message("t", {"n": 1})
    driver.send(message)

    def explode(message: Message, priority: int) -> bool:
        raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError, match="handler bug"):
        compat.wait(driver, explode)
    compat.set_max_process_items(driver, 1)
    compat.wait(driver, collector)
    assert [got.id for got, _, _ in collector.got] == [message.id]


def test_max_items_returns_and_prefetched_messages_stay_on_the_broker(
    make_driver: MakeDriver, collector: Any
) -> None:
    driver = make_driver("prefetch=10")
    for n in range(5):
        driver.send(Message("t", {"v": n}))
    compat.set_max_process_items(driver, 2)
    compat.wait(driver, collector)
    assert collector.payloads == [0, 1]
    compat.set_max_process_items(driver, 3)  # each wait() counts from 0
    compat.wait(driver, collector)
    assert collector.payloads == [0, 1, 2, 3, 4]


def test_a_body_that_is_not_a_message_is_dead_lettered_and_the_worker_goes_on(
    make_driver: MakeDriver,
    queue: str,
    raw_channel: Any,
    collector: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = f"{queue}.dead"
    raw_channel.queue_declare(dead, durable=False, auto_delete=False)
    try:
        driver = make_driver(f"x-dead-letter-exchange=&x-dead-letter-routing-key={dead}")
        driver.send_raw(b"\xff not json")
        driver.send(Message("good"))
        compat.set_max_process_items(driver, 1)
        with caplog.at_level(logging.ERROR, logger="hermes"):
            compat.wait(driver, collector)
        assert [m.type for m, _, _ in collector.got] == ["good"]
        assert "not a Hermes message" in caplog.text and queue in caplog.text
        method, _, body = raw_channel.basic_get(dead, auto_ack=True)
        assert method is not None and body == b"\xff not json"
    finally:
        raw_channel.queue_delete(dead)


def test_a_quorum_queue_dead_letters_a_message_after_its_delivery_limit(
    make_driver: MakeDriver, queue: str, raw_channel: Any
) -> None:
    dead = f"{queue}.dead"
    raw_channel.queue_declare(dead, durable=True)
    try:
        driver = make_driver(
            "x-queue-type=quorum&x-delivery-limit=2"
            f"&x-dead-letter-exchange=&x-dead-letter-routing-key={dead}"
        )
        driver.send(Message("doomed"))

        def explode(message: Message, priority: int) -> bool:
            raise RuntimeError("always fails")

        failures = 0
        deadline = time.monotonic() + 20
        while raw_channel.queue_declare(dead, passive=True).method.message_count == 0:
            assert time.monotonic() < deadline, "the broker never dead-lettered the message"
            compat.set_shutdown(driver, _StopAfter(2.0))  # in case the message is already gone
            try:
                compat.wait(driver, explode)
            except RuntimeError:
                failures += 1
        assert failures >= 2
    finally:
        raw_channel.queue_delete(dead)


class _StopAfter:
    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def should_shutdown(self, start_time: float) -> bool:
        return time.monotonic() > self.until

    def shutdown(self, at: float | None = None) -> bool:
        return False


def test_priorities_are_read_highest_first(make_driver: MakeDriver, collector: Any) -> None:
    driver = make_driver()
    driver.setup_priority_queue("low", 50)
    driver.setup_priority_queue("high", 200)
    for priority in (50, 100, 200, 50, 100, 200):
        driver.send(Message("t", {"v": priority}), priority)
    compat.set_max_process_items(driver, 6)
    compat.wait(driver, collector)
    assert collector.payloads == [200, 200, 100, 100, 50, 50]
    assert [p for _, p, _ in collector.got] == [200, 200, 100, 100, 50, 50]
    assert driver.priority_queues()[200] == f"{driver.queue}.high"


def test_handle_with_priorities_reads_only_those_queues(
    make_driver: MakeDriver, collector: Any
) -> None:
    driver = make_driver()
    driver.setup_priority_queue("high", 200)
    driver.setup_priority_queue("low", 50)
    for priority in (50, 100, 200):
        driver.send(Message("t", {"v": priority}), priority)
    compat.set_max_process_items(driver, 1)
    compat.wait(driver, collector, [50])
    compat.set_max_process_items(driver, 2)  # each wait() counts from 0
    compat.wait(driver, collector, [200, 100])
    assert collector.payloads == [50, 200, 100]


def test_a_worker_idle_on_several_priorities_wakes_for_a_new_message(
    make_driver: MakeDriver, collector: Any, worker: Any, eventually: Any
) -> None:
    driver = make_driver()
    driver.setup_priority_queue("high", 200)
    sender = make_driver()
    sender.setup_priority_queue("high", 200)
    with worker(driver, collector):
        time.sleep(0.3)  # let it go idle; correctness does not depend on it
        sender.send(Message("t", {"v": "low-after-idle"}))
        eventually(lambda: len(collector.got) == 1, "the first message")
        sender.send(Message("t", {"v": "high-after-idle"}), 200)
        eventually(lambda: len(collector.got) == 2, "the second message")
    assert collector.payloads == ["low-after-idle", "high-after-idle"]


def test_a_worker_whose_queue_is_deleted_declares_it_again_and_goes_on(
    make_driver: MakeDriver,
    queue: str,
    raw_channel: Any,
    collector: Any,
    worker: Any,
    eventually: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = make_driver()
    sender = make_driver()
    sender.send(Message("t", {"v": "before"}))
    with caplog.at_level(logging.INFO, logger="hermes"), worker(driver, collector):
        eventually(lambda: collector.payloads == ["before"], "the first message")
        raw_channel.queue_delete(queue)
        eventually(lambda: "broker is back" in caplog.text, "the worker to resubscribe")
        sender.send(Message("t", {"v": "after"}))
        eventually(lambda: collector.payloads == ["before", "after"], "the second message")
    assert "cancelled the consumer" in caplog.text


def test_an_unknown_priority_raises_before_anything_is_sent(make_driver: MakeDriver) -> None:
    driver = make_driver()
    with pytest.raises(UnknownPriorityError) as info:
        driver.send(Message("t"), 7)
    assert info.value.priority == 7
    with pytest.raises(UnknownPriorityError):
        compat.wait(driver, lambda m, p: True, [7])


def test_two_priorities_cannot_share_a_queue(make_driver: MakeDriver) -> None:
    driver = make_driver()
    driver.setup_priority_queue("high", 200)
    with pytest.raises(ConfigurationError, match="already holds priority 200"):
        driver.setup_priority_queue("high", 300)


def test_send_is_safe_from_many_threads_at_once(make_driver: MakeDriver, queue: str) -> None:
    driver = make_driver()
    errors: list[BaseException] = []

    def emit(thread: int) -> None:
        try:
            for n in range(25):
                driver.send(Message("t", [thread, n]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=emit, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    collector: list[Any] = []
    compat.set_max_process_items(driver, 200)
    compat.wait(driver, lambda m, p: collector.append(tuple(m.payload)) or True)
    assert sorted(collector) == sorted((t, n) for t in range(8) for n in range(25))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_driver_used_before_fork_sends_from_the_child_on_its_own_connection(
    make_driver: MakeDriver, collector: Any
) -> None:
    driver = make_driver()
    driver.send(Message("t", {"v": "parent-before"}))
    parent_publisher = driver._publishers.peek()
    assert parent_publisher is not None
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            assert driver._publishers.peek() is None
            driver.send(Message("t", {"v": "child"}))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert driver._publishers.peek() is parent_publisher
    driver.send(Message("t", {"v": "parent-after"}))  # the parent's connection still works
    compat.set_max_process_items(driver, 3)
    compat.wait(driver, collector)
    assert sorted(collector.payloads) == ["child", "parent-after", "parent-before"]


def test_send_batch_publishes_every_message_in_one_transaction(
    make_driver: MakeDriver, collector: Any
) -> None:
    driver = make_driver()
    driver.send_batch([Message("t", {"v": n}) for n in range(50)])
    driver.send_batch([Message("t", {"v": n}) for n in range(50, 60)])
    compat.set_max_process_items(driver, 60)
    compat.wait(driver, collector)
    assert collector.payloads == list(range(60))


def test_send_batch_redeclares_a_queue_that_vanished(
    make_driver: MakeDriver, queue: str, raw_channel: Any
) -> None:
    driver = make_driver()
    driver.send_batch([Message("t", {"v": 0}), Message("t", {"v": 1})])
    raw_channel.queue_delete(queue)
    driver.send_batch([Message("t", {"v": 2}), Message("t", {"v": 3})])
    assert raw_channel.queue_declare(queue, passive=True).method.message_count == 2


def test_teardown_deletes_the_work_queues_and_the_delay_queues(
    make_driver: MakeDriver, queue: str, raw_channel: Any, amqp_url: str
) -> None:
    driver = make_driver("delay=true")
    driver.setup_priority_queue("high", 200)
    driver.send(Message("t"), 200)
    driver.send(Message("t", execute_at=time.time() + 60))
    names = [queue, f"{queue}.high", *driver._delay_queues]
    assert len(names) == 3
    driver.teardown()
    for name in names:
        connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            with pytest.raises(pika_exc.ChannelClosedByBroker) as info:
                connection.channel().queue_declare(name, passive=True)
            assert info.value.reply_code == 404, name
        finally:
            connection.close()


def _rows(driver: LazyRabbitMqDriver) -> dict[int, QueueStats]:
    return {row.priority: row for row in driver.queue_stats()}


def test_stats_name_each_queue_highest_first_and_count_a_queue_not_declared_yet_as_empty(
    make_driver: MakeDriver, queue: str
) -> None:
    driver = make_driver()
    driver.setup_priority_queue("high", 200)
    assert driver.queue_stats() == [
        QueueStats(200, f"{queue}.high", ready=0, scheduled=0, in_flight=None, set_aside=None),
        QueueStats(100, queue, ready=0, scheduled=0, in_flight=None, set_aside=None),
    ]
    # The broker closed a channel for each missing queue; sending still works.
    driver.send(Message("t"), 200)
    assert _rows(driver)[200].ready == 1


def test_with_delay_the_scheduled_count_is_unknown_not_zero(make_driver: MakeDriver) -> None:
    driver = make_driver("delay=true")
    driver.send(Message("t", execute_at=time.time() + 60))
    assert _rows(driver)[100].scheduled is None


def test_purge_of_one_priority_deletes_its_ready_and_delayed_messages_sent_by_another_driver(
    make_driver: MakeDriver, queue: str, raw_channel: Any
) -> None:
    sender = make_driver("delay=true")
    sender.setup_priority_queue("high", 200)
    later = time.time() + 60
    for priority in (100, 100, 200):
        sender.send(Message("t"), priority)
        sender.send(Message("t", execute_at=later), priority)
    operator = make_driver("delay=true")
    operator.setup_priority_queue("high", 200)

    assert operator.purge(200) == 2
    rows = _rows(operator)
    assert (rows[200].ready, rows[100].ready) == (0, 2)
    # The delay queue that held a message is still there for the sender, empty.
    (high_delay,) = (name for name in sender._delay_queues if name.startswith(f"{queue}.high."))
    assert raw_channel.queue_declare(high_delay, passive=True).method.message_count == 0
    sender.send(Message("t", execute_at=later), 200)

    assert operator.purge() == 5
    assert [row.ready for row in operator.queue_stats()] == [0, 0]


def test_a_sender_finds_again_an_empty_delay_queue_purge_deleted(
    make_driver: MakeDriver, raw_channel: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sender = make_driver("delay=true")
    later = time.time() + 159.5  # the 150 s bucket for the next 9.5 s
    sender.send(Message("t", execute_at=later))
    (delay_queue,) = sender._delay_queues
    raw_channel.queue_purge(delay_queue)
    assert make_driver("delay=true").purge() == 0
    with caplog.at_level(logging.WARNING, logger="hermes"):
        sender.send(Message("t", execute_at=later))  # declared by it moments ago
    assert "declaring it again" in caplog.text
    assert raw_channel.queue_declare(delay_queue, passive=True).method.message_count == 1


def test_purge_leaves_a_message_a_worker_holds(make_driver: MakeDriver, worker: Any) -> None:
    driver = make_driver()
    for n in range(3):
        driver.send(Message("t", {"v": n}))
    started, release = threading.Event(), threading.Event()
    handled: list[int] = []

    def block(message: Message, priority: int) -> bool:
        started.set()
        release.wait(10)
        handled.append(message.payload["v"])
        return True

    consumer = make_driver()
    compat.set_max_process_items(consumer, 1)
    with worker(consumer, block):
        assert started.wait(10), "the worker never started the handler"
        try:
            assert driver.purge() == 2
        finally:
            release.set()
    assert handled == [0]
    assert _rows(driver)[100].ready == 0


def test_purge_of_an_unknown_priority_raises_and_deletes_nothing(make_driver: MakeDriver) -> None:
    driver = make_driver()
    driver.send(Message("t"))
    with pytest.raises(UnknownPriorityError, match="priority 300"):
        driver.purge(300)
    assert _rows(driver)[100].ready == 1


def test_set_aside_counts_the_dead_letter_queue_on_the_default_row_and_purge_keeps_it(
    make_driver: MakeDriver, queue: str, raw_channel: Any, collector: Any
) -> None:
    dead = f"{queue}.dead"
    raw_channel.queue_declare(dead, durable=True)
    try:
        driver = make_driver(f"x-dead-letter-exchange=&x-dead-letter-routing-key={dead}")
        driver.setup_priority_queue("high", 200)
        driver.send_raw(b"\xff not json")
        driver.send(Message("good"))
        compat.set_max_process_items(driver, 1)
        compat.wait(driver, collector)
        deadline = time.monotonic() + 10
        while (rows := _rows(driver))[100].set_aside != 1:
            assert time.monotonic() < deadline, f"set_aside never reached 1: {rows}"
            time.sleep(0.05)
        assert rows[200].set_aside is None
        assert driver.purge() == 0
        assert _rows(driver)[100].set_aside == 1
    finally:
        raw_channel.queue_delete(dead)


def test_set_aside_is_unknown_when_dead_letters_go_to_a_named_exchange(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver("x-dead-letter-exchange=dlx")
    assert _rows(driver)[100].set_aside is None


def test_ignored_delay_delivers_at_once_and_keeps_execute_at(
    make_driver: MakeDriver, collector: Any
) -> None:
    driver = make_driver()
    assert driver.capabilities.delay is Delay.IGNORED
    due = time.time() + 3600
    driver.send(Message("t", execute_at=due))
    compat.set_max_process_items(driver, 1)
    compat.wait(driver, collector)
    assert collector.got[0][0].execute_at == due


def test_native_delay_holds_a_message_until_execute_at_even_when_the_bucket_rounds_down(
    make_driver: MakeDriver, collector: Any, worker: Any, eventually: Any
) -> None:
    driver = make_driver("delay=true")
    assert driver.capabilities.delay is Delay.NATIVE
    assert driver.capabilities.delivery is Delivery.AT_LEAST_ONCE
    now = time.time()
    # 1.99 s goes to the 1900 ms queue, comes back early and goes round again.
    late = Message("t", {"v": "late"}, execute_at=now + 1.99)
    soon = Message("t", {"v": "soon"}, execute_at=now + 0.5)
    driver.send(late)
    driver.send(soon)
    driver.send(Message("t", {"v": "now"}))
    with worker(driver, collector):
        eventually(lambda: len(collector.got) == 3, "three messages", timeout_s=20)
    assert collector.payloads == ["now", "soon", "late"]
    for message, _, handled_at in collector.got:
        if message.execute_at:
            # Due within DUE_TOLERANCE_S counts as due (no 0 ms round trips).
            early = message.execute_at - handled_at
            assert early <= DUE_TOLERANCE_S, f"{message.payload} handled {early:.4f} s early"


def test_a_retry_copy_waits_in_a_delay_queue(make_driver: MakeDriver, raw_channel: Any) -> None:
    driver = make_driver("delay=true")
    driver.send(Message("t", {"v": "retry"}, retries=1, execute_at=time.time() + 30))
    (delay_queue,) = driver._delay_queues
    assert delay_queue.startswith(f"{driver.queue}.delay.")
    assert 20000 <= int(delay_queue.rsplit(".", 1)[1]) <= 30000
    assert raw_channel.queue_declare(delay_queue, passive=True).method.message_count == 1
    assert raw_channel.queue_declare(driver.queue, passive=True).method.message_count == 0


def test_a_dispatcher_runs_handlers_and_stops_on_shutdown(
    make_driver: MakeDriver, worker: Any, eventually: Any
) -> None:
    driver = make_driver()
    seen: list[str] = []

    class Handler:
        def handle(self, message: Message) -> bool:
            seen.append(message.payload["v"])
            return True

    dispatcher = Dispatcher(driver).register_handler("job", Handler())
    driver.send(Message("job", {"v": "a"}))
    with worker(driver, dispatcher.handle_message):
        eventually(lambda: seen == ["a"], "the handler")
        make_driver().send(Message("job", {"v": "b"}))
        eventually(lambda: seen == ["a", "b"], "the second message")


def test_the_repr_names_the_broker_and_queue_but_never_the_password(amqp_url: str) -> None:
    driver = connect("amqp://guest:hunter2@127.0.0.1:5672/%2F?queue=jobs")
    assert "hunter2" not in repr(driver)
    assert repr(driver) == "<LazyRabbitMqDriver amqp://guest@127.0.0.1:5672/%2F queue='jobs'>"
