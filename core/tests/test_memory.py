"""The memory driver: the reference every other driver is measured against."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from hermes_test_support import StopWhen

from hermes.core import (
    DEFAULT_PRIORITY,
    ConfigurationError,
    DeliveryError,
    Message,
    UnknownPriorityError,
    compat,
    connect,
)
from hermes.core.driver import Delay, Delivery, SupportsPurge, SupportsTeardown
from hermes.core.drivertools import MemoryDriver, MessageSerializer, isolated_url
from hermes.core.run._worker import StopConditions


class Collect:
    """A wait() callback that keeps what it receives."""

    def __init__(self) -> None:
        self.received: list[tuple[Message, int]] = []
        self.at: list[float] = []

    def __call__(self, message: Message, priority: int) -> bool:
        self.received.append((message, priority))
        self.at.append(time.time())
        return True

    @property
    def ids(self) -> list[str]:
        return [message.id for message, _ in self.received]


def drain(driver: MemoryDriver, count: int, priorities: tuple[int, ...] = ()) -> Collect:
    """Run ``wait()`` until it handled ``count`` messages (or 10 s passed)."""
    collect = Collect()
    compat.set_shutdown(driver, StopWhen())
    compat.set_max_process_items(driver, count)  # counted per wait() call
    compat.wait(driver, collect, priorities)
    return collect


def test_the_memory_driver_declares_what_it_does() -> None:
    capabilities = MemoryDriver.capabilities

    assert capabilities.delivery is Delivery.AT_LEAST_ONCE
    assert capabilities.delay is Delay.NATIVE
    assert capabilities.priorities is True
    assert capabilities.competing_consumers is True
    assert capabilities.cross_process is False


def test_the_memory_driver_offers_purge_and_teardown(driver: MemoryDriver) -> None:
    assert isinstance(driver, SupportsPurge)
    assert isinstance(driver, SupportsTeardown)


def test_a_sent_message_comes_back_equal(driver: MemoryDriver) -> None:
    message = Message("job", {"a": [1, "ž"]}, execute_at=time.time() - 5, retries=3)
    driver.send(message)

    collect = drain(driver, 1)

    assert collect.received == [(message, DEFAULT_PRIORITY)]


def test_the_highest_priority_is_read_first_and_fifo_within_a_priority(
    driver: MemoryDriver,
) -> None:
    driver.setup_priority_queue("low", 50)
    driver.setup_priority_queue("high", 300)
    sent: dict[int, list[str]] = {50: [], DEFAULT_PRIORITY: [], 300: []}
    for n in range(4):
        for priority in (DEFAULT_PRIORITY, 50, 300):
            message = Message("job", {"n": n})
            driver.send(message, priority)
            sent[priority].append(message.id)

    collect = drain(driver, 12)

    assert collect.ids == sent[300] + sent[DEFAULT_PRIORITY] + sent[50]
    assert [p for _, p in collect.received] == [300] * 4 + [DEFAULT_PRIORITY] * 4 + [50] * 4


def test_priority_order_does_not_depend_on_the_order_queues_were_set_up(
    driver: MemoryDriver,
) -> None:
    driver.setup_priority_queue("high", 300)
    driver.setup_priority_queue("low", 50)
    low, high = Message("job"), Message("job")
    driver.send(low, 50)
    driver.send(high, 300)

    assert drain(driver, 2).ids == [high.id, low.id]


def test_the_priorities_filter_reads_only_those_queues(driver: MemoryDriver, peek: Any) -> None:
    driver.setup_priority_queue("high", 300)
    driver.setup_priority_queue("low", 50)
    messages = {p: Message("job") for p in (50, DEFAULT_PRIORITY, 300)}
    for priority, message in messages.items():
        driver.send(message, priority)

    collect = drain(driver, 2, priorities=(50, 300))

    assert collect.ids == [messages[300].id, messages[50].id]
    assert peek.queued(driver) == [messages[DEFAULT_PRIORITY]]


def test_sending_to_a_priority_without_a_queue_raises(driver: MemoryDriver, peek: Any) -> None:
    with pytest.raises(UnknownPriorityError, match="200") as caught:
        driver.send(Message("job"), 200)

    assert caught.value.priority == 200
    assert peek.total(driver) == 0


def test_waiting_on_a_priority_without_a_queue_raises(driver: MemoryDriver) -> None:
    with pytest.raises(UnknownPriorityError, match="known priorities: \\[100\\]"):
        compat.wait(driver, Collect(), (DEFAULT_PRIORITY, 7))


def test_an_unknown_priority_error_names_the_driver_the_known_priorities_and_the_fix(
    driver: MemoryDriver,
) -> None:
    driver.setup_priority_queue("high", 300)

    with pytest.raises(UnknownPriorityError) as caught:
        driver.send(Message("job"), 7)

    assert str(caught.value) == (
        f"<MemoryDriver memory://{driver.name}> has no queue for priority 7; "
        "known priorities: [300, 100]; add one with setup_priority_queue()"
    )


def test_a_runs_pause_sleeps_its_time_unless_the_run_must_stop() -> None:
    started = time.monotonic()
    StopConditions(0, (), time.time()).pause(0.2, step_s=0.05)
    assert time.monotonic() - started >= 0.2

    stop = StopWhen()
    stop.shutdown()
    started = time.monotonic()
    StopConditions(0, (stop,), time.time()).pause(60, step_s=0.05)
    assert time.monotonic() - started < 30  # returned at once, not after 60 s


def test_a_message_due_later_is_held_while_due_ones_are_delivered(
    driver: MemoryDriver, peek: Any
) -> None:
    later = Message("job", execute_at=time.time() + 3600)
    now = Message("job")
    driver.send(later)
    driver.send(now)

    collect = drain(driver, 1)

    assert collect.ids == [now.id]
    assert peek.scheduled(driver) == [(DEFAULT_PRIORITY, later)]


def test_a_delayed_message_is_delivered_once_due_and_not_before(driver: MemoryDriver) -> None:
    execute_at = time.time() + 0.3
    message = Message("job", execute_at=execute_at)
    driver.send(message)

    collect = drain(driver, 1)

    assert collect.ids == [message.id]
    assert collect.at[0] >= execute_at


def test_a_message_due_in_the_past_is_delivered_at_once(driver: MemoryDriver, peek: Any) -> None:
    driver.send(Message("job", execute_at=time.time() - 60))

    assert peek.scheduled(driver) == []
    assert len(peek.queued(driver)) == 1


def test_a_delayed_message_keeps_its_priority(driver: MemoryDriver) -> None:
    driver.setup_priority_queue("high", 300)
    message = Message("job", execute_at=time.time() + 0.2)
    driver.send(message, 300)

    collect = drain(driver, 1)

    assert collect.received == [(message, 300)]


def test_wait_returns_after_max_items(driver: MemoryDriver, peek: Any) -> None:
    for _ in range(5):
        driver.send(Message("job"))

    collect = drain(driver, 3)

    assert len(collect.received) == 3
    assert len(peek.queued(driver)) == 2


def test_wait_returns_without_taking_anything_once_shutdown_is_asked(
    driver: MemoryDriver, peek: Any
) -> None:
    driver.send(Message("job"))
    stop = StopWhen()
    stop.shutdown()
    compat.set_shutdown(driver, stop)
    collect = Collect()

    compat.wait(driver, collect)

    assert collect.received == []
    assert len(peek.queued(driver)) == 1


def test_an_idle_wait_notices_a_shutdown_asked_from_another_thread(driver: MemoryDriver) -> None:
    stop = StopWhen()
    compat.set_shutdown(driver, stop)
    waiting = threading.Thread(target=compat.wait, args=(driver, Collect()))
    waiting.start()

    stop.shutdown()
    waiting.join(timeout=10)

    assert not waiting.is_alive()


def test_an_idle_wait_picks_up_a_message_sent_from_another_thread(driver: MemoryDriver) -> None:
    message = Message("job")
    sender = threading.Timer(0.05, driver.send, args=(message,))
    sender.start()

    collect = drain(driver, 1)
    sender.join()

    assert collect.ids == [message.id]


def test_a_body_that_is_not_a_message_is_set_aside_and_logged_and_the_next_is_delivered(
    driver: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="hermes")
    good = Message("job")
    driver.send_raw(b"\xff not json")
    driver.send_raw(b'{"message":{"id":"no type"}}')
    driver.send(good)

    collect = drain(driver, 1)

    assert collect.ids == [good.id]
    assert [reason.split(" from ")[0] for _, reason in driver._broker.dead_letters] == [
        "Cannot unserialize message",
        'Invalid message format in \'{"message":{"id":"no type"}}\': type must be a '
        "non-empty string, got null",
    ]
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2
    assert "Cannot unserialize message from '\\xff not json'" in logged[0]
    assert "Invalid message format" in logged[1]


@pytest.mark.parametrize("error", [RuntimeError("callback failed"), KeyboardInterrupt()])
def test_a_callback_that_raises_leaves_its_message_for_the_next_wait(
    driver: MemoryDriver, error: BaseException
) -> None:
    first, second = Message("job"), Message("job")
    driver.send(first)
    driver.send(second)

    def explode(message: Message, priority: int) -> bool:
        raise error

    with pytest.raises(type(error)):
        compat.wait(driver, explode)

    assert drain(driver, 2).ids == [first.id, second.id]


def test_drivers_with_the_same_name_share_one_broker(broker_name: str) -> None:
    emitting, waiting = MemoryDriver(broker_name), MemoryDriver(broker_name)
    try:
        emitting.setup_priority_queue("high", 300)
        message = Message("job")
        emitting.send(message, 300)

        assert drain(waiting, 1).received == [(message, 300)]
    finally:
        waiting.teardown()


def test_drivers_with_different_names_share_nothing(broker_name: str, peek: Any) -> None:
    one, other = MemoryDriver(broker_name + "-a"), MemoryDriver(broker_name + "-b")
    try:
        one.setup_priority_queue("high", 300)
        one.send(Message("job"))

        assert peek.total(other) == 0
        with pytest.raises(UnknownPriorityError):
            other.send(Message("job"), 300)
    finally:
        one.teardown()
        other.teardown()


def test_purge_empties_every_queue_and_forgets_extra_priorities(
    driver: MemoryDriver, peek: Any
) -> None:
    driver.setup_priority_queue("high", 300)
    driver.send(Message("job"), 300)
    driver.send(Message("job", execute_at=time.time() + 3600))
    driver.send_raw(b"junk")

    driver.teardown()

    assert peek.total(driver) == 0
    with pytest.raises(UnknownPriorityError):
        driver.send(Message("job"), 300)


def test_purge_empties_the_broker_for_every_driver_object_of_that_name(
    broker_name: str, peek: Any
) -> None:
    emitting, waiting = MemoryDriver(broker_name), MemoryDriver(broker_name)
    emitting.send(Message("job"))

    waiting.teardown()

    assert peek.total(emitting) == 0
    message = Message("job")
    emitting.send(message)
    assert drain(waiting, 1).ids == [message.id]
    waiting.teardown()


def test_a_priority_queue_set_up_while_a_worker_waits_is_read_too(broker_name: str) -> None:
    waiting = MemoryDriver(broker_name)
    message = Message("job")

    def emit_on_a_new_priority() -> None:
        emitting = MemoryDriver(broker_name)
        emitting.setup_priority_queue("urgent", 500)
        emitting.send(message, 500)

    emitter = threading.Timer(0.05, emit_on_a_new_priority)
    emitter.start()
    try:
        assert drain(waiting, 1).received == [(message, 500)]
    finally:
        emitter.join()
        waiting.teardown()


def test_competing_waits_get_every_message_exactly_once(broker_name: str) -> None:
    messages = [Message("job", {"n": n}) for n in range(200)]
    MemoryDriver(broker_name).setup_priority_queue("high", 300)
    for n, message in enumerate(messages):
        MemoryDriver(broker_name).send(message, 300 if n % 3 == 0 else DEFAULT_PRIORITY)
    received: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def worker() -> None:
        driver = MemoryDriver(broker_name)

        def callback(message: Message, priority: int) -> bool:
            with lock:
                received.append(message.id)
                if len(received) == len(messages):
                    done.set()
            return True

        compat.set_shutdown(driver, StopWhen(done.is_set))
        compat.wait(driver, callback)

    workers = [threading.Thread(target=worker) for _ in range(4)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=15)
    MemoryDriver(broker_name).teardown()

    assert sorted(received) == sorted(m.id for m in messages)


def test_send_is_safe_from_many_threads(driver: MemoryDriver) -> None:
    def send_many() -> None:
        for _ in range(100):
            driver.send(Message("job"))

    senders = [threading.Thread(target=send_many) for _ in range(8)]
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join()

    assert len(set(drain(driver, 800).ids)) == 800


def test_connect_builds_a_memory_driver_named_by_the_url(broker_name: str) -> None:
    with connect(f"memory://{broker_name}") as driver:
        assert isinstance(driver, MemoryDriver)
        assert driver.name == broker_name


def test_connect_to_memory_rejects_options() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown option.*colour.*no options"):
        connect("memory://jobs?colour=blue")


def test_an_isolated_memory_url_names_its_own_broker() -> None:
    assert isolated_url("memory://jobs", "kit-test-1") == "memory://kit-test-1"


def test_max_process_items_cannot_be_negative(driver: MemoryDriver) -> None:
    with pytest.raises(ValueError, match="-1"):
        compat.set_max_process_items(driver, -1)


def test_a_consumer_closed_with_a_message_unsettled_keeps_it_until_its_lease_runs_out(
    broker_name: str,
) -> None:
    driver = MemoryDriver(broker_name, redelivery_timeout_s=0.3)
    driver.send(Message("job"))
    consumer = driver.consumer(())
    held = consumer.receive(1)
    assert held is not None

    consumer.close()
    closed_at = time.monotonic()

    other = driver.consumer(())
    assert other.receive(0.1) is None, "handed to another worker while its handler may run"
    again = other.receive(2)
    assert again is not None and again.body == held.body
    assert time.monotonic() - closed_at >= 0.3
    consumer.ack(held)  # a late settle of a lease that ran out changes nothing
    assert driver.queue_stats()[0].in_flight == 1


def test_a_message_over_max_message_bytes_is_refused_before_it_reaches_the_broker(
    broker_name: str,
) -> None:
    class Small(MemoryDriver):
        capabilities = replace(MemoryDriver.capabilities, max_message_bytes=200)

    driver = Small(broker_name)
    fits = Message("job", {"blob": ""})
    overhead = len(MessageSerializer().serialize(fits).encode())
    over = fits.replace(payload={"blob": "x" * (201 - overhead)})

    with pytest.raises(DeliveryError, match=r"is 201 bytes serialized, over .* of 200"):
        driver.send(over)
    with pytest.raises(DeliveryError, match="201 bytes"):
        driver.send_batch([fits, over])
    driver.send_raw(b"x" * 500)  # the kit's poison is not held to it
    assert driver.queue_stats()[0].ready == 1
