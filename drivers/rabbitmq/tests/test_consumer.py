"""The RabbitMQ consumer under core's loop: receive, settle, reconnect, on the real broker."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from hermes.core import BrokerUnavailableError, Message, UnknownPriorityError, compat, connect
from hermes.core.driver import Consumer, Received
from hermes.core.drivertools import MessageSerializer
from hermes.core.spi._door import translate_errors
from hermes.drivers.rabbitmq import LazyRabbitMqDriver
from hermes.drivers.rabbitmq._delay import DUE_TOLERANCE_S

MakeDriver = Callable[..., LazyRabbitMqDriver]

#: Long enough for anything that should take milliseconds on a slow shared machine.
GENEROUS_S = 5.0


def receive(consumer: Consumer, what: str, timeout_s: float = GENEROUS_S) -> Received:
    """The next delivery, polled to a deadline; fails naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        received = consumer.receive(0.5)
        if received is not None:
            return received
    pytest.fail(f"nothing received within {timeout_s:g} s: {what}")


def payload(received: Received) -> Any:
    return MessageSerializer().unserialize(received.body).payload["v"]


def ready(channel: Any, queue: str) -> int:
    """Messages in ``queue`` not delivered to any consumer."""
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def test_consumer_checks_priorities_at_once_and_does_no_io() -> None:
    driver = connect("amqp://guest:guest@127.0.0.1:1/?queue=nowhere")
    with pytest.raises(UnknownPriorityError) as info:
        driver.consumer([7])
    assert info.value.priority == 7
    driver.consumer([100]).close()  # nothing was opened, nothing to close


def test_receive_on_an_unreachable_broker_raises_broker_unavailable_naming_it() -> None:
    driver = connect("amqp://guest:guest@127.0.0.1:1/?queue=nowhere")
    with driver.consumer(()) as consumer, pytest.raises(BrokerUnavailableError) as info:
        with translate_errors(driver, "receiving"):  # as core's worker does
            consumer.receive(0.5)
    assert "127.0.0.1:1" in str(info.value)


def test_a_worker_on_an_unreachable_broker_retries_until_it_is_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from hermes_test_support import StopWhen

    driver = connect("amqp://guest:guest@127.0.0.1:1/?queue=nowhere")
    compat.set_shutdown(driver, StopWhen(lambda: caplog.text.count("broker unavailable") >= 2))
    with caplog.at_level(logging.WARNING, logger="hermes"):
        compat.wait(driver, lambda message, priority: True)
    assert "(attempt 2)" in caplog.text


def test_receive_returns_none_within_its_timeout_when_idle(make_driver: MakeDriver) -> None:
    driver = make_driver()
    driver.setup_priority_queue("high", 200)
    for priorities in ((), (100,)):  # several queues (push + basic_get), one queue (push)
        with driver.consumer(priorities) as consumer:
            for _ in range(2):  # the first call also connects
                started = time.monotonic()
                assert consumer.receive(0.2) is None
            assert time.monotonic() - started < GENEROUS_S


def test_refresh_interval_never_stretches_receive_beyond_its_timeout(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver("refresh_interval=30")
    with driver.consumer(()) as consumer:
        assert consumer.receive(0.2) is None  # connects
        started = time.monotonic()
        assert consumer.receive(0.2) is None
        assert time.monotonic() - started < GENEROUS_S


def test_a_released_message_comes_back(make_driver: MakeDriver) -> None:
    driver = make_driver()
    driver.send(Message("t", {"v": "again"}))
    with driver.consumer(()) as consumer:
        first = receive(consumer, "the message")
        consumer.release(first)
        second = receive(consumer, "the released message")
        assert second.body == first.body
        consumer.ack(second)
        assert consumer.receive(0.2) is None


def test_ack_and_release_from_another_thread_reach_the_broker(make_driver: MakeDriver) -> None:
    driver = make_driver()  # prefetch 1: nothing more comes until the first is settled
    driver.send(Message("t", {"v": 1}))
    driver.send(Message("t", {"v": 2}))
    with driver.consumer(()) as consumer:
        first = receive(consumer, "the first message")

        def ack_later() -> None:
            time.sleep(0.2)  # let the receiving thread block; correctness does not depend on it
            consumer.ack(first)

        acker = threading.Thread(target=ack_later)
        acker.start()
        started = time.monotonic()
        # One long receive: the ack handed over must wake it, or nothing comes for 30 s.
        second = consumer.receive(30)
        assert time.monotonic() - started < GENEROUS_S
        acker.join()
        assert second is not None
        assert (payload(first), payload(second)) == (1, 2)
        releaser = threading.Thread(target=consumer.release, args=(second,))
        releaser.start()
        again = receive(consumer, "the second message, released from another thread")
        releaser.join()
        assert again.body == second.body
        consumer.ack(again)
    checker = driver.consumer(())
    with checker:
        assert checker.receive(0.3) is None


def test_messages_arriving_together_at_an_idle_worker_come_out_highest_first(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()
    driver.setup_priority_queue("low", 50)
    driver.setup_priority_queue("high", 200)
    sender = make_driver()
    sender.setup_priority_queue("low", 50)
    sender.setup_priority_queue("high", 200)
    with driver.consumer(()) as consumer:
        assert consumer.receive(0.2) is None  # every queue empty: now consuming them all
        for priority in (50, 100, 200):
            sender.send(Message("t", {"v": priority}), priority)
        got = [receive(consumer, f"message {n}") for n in range(3)]
        assert [r.priority for r in got] == [200, 100, 50]
        assert [payload(r) for r in got] == [200, 100, 50]
        for received in got:
            consumer.ack(received)


def test_the_buffer_holds_at_most_prefetch_and_close_gives_it_back_in_order(
    make_driver: MakeDriver, queue: str, raw_channel: Any, eventually: Any
) -> None:
    driver = make_driver("prefetch=3")
    for n in range(6):
        driver.send(Message("t", {"v": n}))
    with driver.consumer(()) as consumer:
        first = receive(consumer, "the first message")
        consumer.ack(first)
        # With the first acknowledged, the next three are delivered (the
        # prefetch) and two stay on the broker.
        eventually(lambda: ready(raw_channel, queue) == 2, "two messages left ready")
        assert consumer.receive(0.1) is not None  # handed out, never settled: back on close
    eventually(lambda: ready(raw_channel, queue) == 5, "the buffered messages back on the queue")
    with driver.consumer(()) as consumer:
        rest = []
        for n in range(1, 6):
            rest.append(receive(consumer, f"message {n}"))
            consumer.ack(rest[-1])
    assert [payload(r) for r in rest] == [1, 2, 3, 4, 5]


def _cut_and_take_what_comes_back(
    broker_link: Any, link_url: str, make_driver: MakeDriver, consumer: Consumer
) -> list[int]:
    """Cut the consumer's connection; the payloads RabbitMQ then delivers to a new consumer.

    What the consumer had not sent when its connection was cut is lost with it.
    """
    broker_link.cut()
    consumer.close()
    broker_link.restore()
    back = []
    with make_driver().consumer(()) as fresh:
        while (received := fresh.receive(0.5)) is not None:
            back.append(payload(received))
            fresh.ack(received)
    return sorted(back)


def test_acknowledgements_made_together_never_cover_a_delivery_still_in_a_handler(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver("prefetch=8")  # acknowledgements go out four at a time
    for n in range(1, 9):
        driver.send(Message("t", {"v": n}))
    with driver.consumer(()) as consumer:
        held = receive(consumer, "message 1")
        for n in range(2, 6):
            consumer.ack(receive(consumer, f"message {n}"))
        # 2-5 went out, each on its own: 1 is still in its handler, and one frame
        # acknowledging "up to 5" would have settled it too. Closing leaves 1 to
        # RabbitMQ, which requeues it, and gives back the buffered 6-8.
    assert payload(held) == 1
    back = []
    with driver.consumer(()) as fresh:
        while (received := fresh.receive(0.5)) is not None:
            back.append(payload(received))
            fresh.ack(received)
    assert sorted(back) == [1, 6, 7, 8]


def test_acknowledgements_waiting_to_go_together_go_before_the_consumer_waits_idle(
    make_driver: MakeDriver, link_url: str, broker_link: Any
) -> None:
    sender = make_driver()
    for n in range(1, 4):
        sender.send(Message("t", {"v": n}))
    driver = connect(f"{link_url}&prefetch=50")  # 25 would be sent together
    consumer = driver.consumer(())
    for n in range(1, 4):
        consumer.ack(receive(consumer, f"message {n}"))
    assert consumer.receive(0.3) is None  # waits on the socket: the three acks go first
    back = _cut_and_take_what_comes_back(broker_link, link_url, make_driver, consumer)
    assert back == []


def test_a_stale_delivery_from_a_lost_connection_is_not_settled_on_the_new_one(
    make_driver: MakeDriver,
    link_url: str,
    broker_link: Any,
    queue: str,
    raw_channel: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    make_driver().send(Message("t", {"v": "only"}))  # also purges the queue afterwards
    driver = connect(link_url)
    with driver.consumer(()) as consumer:
        stale = receive(consumer, "the message")
        broker_link.cut()
        with pytest.raises(BrokerUnavailableError), translate_errors(driver, "receiving"):
            receive(consumer, "nothing: the connection is gone")
        broker_link.restore()
        again = receive(consumer, "the message, delivered again on a new connection")
        assert again.body == stale.body
        # Both carry delivery tag 1, each on its own channel: acking the stale
        # one on the new channel would settle the wrong delivery.
        with caplog.at_level(logging.INFO, logger="hermes"):
            consumer.ack(stale)
        assert "skipped acknowledging a message" in caplog.text
        consumer.ack(again)
        assert consumer.receive(0.2) is None
    assert ready(raw_channel, queue) == 0


def test_a_worker_reconnects_after_losing_the_broker_and_loses_nothing(
    make_driver: MakeDriver,
    link_url: str,
    broker_link: Any,
    worker: Any,
    eventually: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sender = make_driver()
    driver = connect(link_url)
    handled: list[str] = []
    in_handler = threading.Event()
    carry_on = threading.Event()

    def callback(message: Message, priority: int) -> bool:
        if message.payload["v"] == "in-flight" and not carry_on.is_set():
            in_handler.set()
            carry_on.wait(GENEROUS_S)
        handled.append(message.payload["v"])
        return True

    sender.send(Message("t", {"v": "before"}))
    sender.send(Message("t", {"v": "in-flight"}))
    with caplog.at_level(logging.INFO, logger="hermes"), worker(driver, callback):
        assert in_handler.wait(GENEROUS_S), "the worker never started the second message"
        broker_link.cut()
        carry_on.set()  # its ack cannot reach the broker now
        eventually(lambda: "broker unavailable" in caplog.text, "the worker to notice")
        broker_link.restore()
        eventually(lambda: "broker is back" in caplog.text, "the worker to reconnect")
        sender.send(Message("t", {"v": "after"}))
        eventually(lambda: "after" in handled, "the message sent after the reconnect")
    # The unacknowledged message came back; the acknowledged one did not.
    assert handled.count("before") == 1
    assert handled.count("in-flight") == 2
    assert handled[-1] == "after"


def test_a_message_not_yet_due_goes_back_to_a_delay_queue_and_never_reaches_core(
    make_driver: MakeDriver, queue: str, raw_channel: Any
) -> None:
    driver = make_driver("delay=true")
    due = time.time() + 1.5
    # As if it came back from a delay queue early: straight onto the work queue.
    driver.send_raw(
        MessageSerializer().serialize(Message("t", {"v": "later"}, execute_at=due)).encode()
    )
    with driver.consumer(()) as consumer:
        assert consumer.receive(0.3) is None
        assert ready(raw_channel, queue) == 0
        assert any(ready(raw_channel, name) == 1 for name in driver._delay_queues)
        received = receive(consumer, "the message, once due")
        assert time.time() >= due - DUE_TOLERANCE_S
        assert payload(received) == "later"
        consumer.ack(received)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_consumer_used_before_fork_is_left_alone_by_the_child(make_driver: MakeDriver) -> None:
    driver = make_driver()
    driver.send(Message("t", {"v": "parent's"}))
    with driver.consumer(()) as consumer:
        held = receive(consumer, "the message")
        pid = os.fork()
        if pid == 0:  # child: settling or closing must not touch the parent's socket
            code = 1
            try:
                consumer.ack(held)
                consumer.close()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        consumer.release(held)  # the parent's connection still works
        again = receive(consumer, "the message, released by the parent")
        assert again.body == held.body
        consumer.ack(again)
