"""RedisSetDriver against the real Redis: sets, priorities, schedule, wake-up, bad input."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hermes_test_support import DEADLINE_S

from hermes.core import (
    BrokerRefusedError,
    BrokerUnavailableError,
    ConfigurationError,
    DeliveryError,
    DriverError,
    Message,
    SerializeError,
    UnknownPriorityError,
    compat,
    connect,
)
from hermes.core.driver import Consumer, Delivery, Received, SupportsTeardown
from hermes.core.drivertools import MessageSerializer, outgoing
from hermes.core.spi._door import translate_errors
from hermes.drivers.redis import RedisSetDriver, rejected_key, wake_key
from hermes.drivers.redis import _driver as redis_driver
from hermes.drivers.redis._driver import WAKE_LIST_CAP

HIGH, LOW = 200, 50


def test_a_message_sent_before_the_worker_starts_is_handled(driver, start_worker, eventually):
    message = Message("greet", {"name": "Žofia", "n": 1})
    driver.send(message)
    worker = start_worker(driver)
    eventually(lambda: worker.handled, "the message to be handled")
    worker.join()
    [(got, priority)] = worker.handled
    assert (got.id, got.type, got.payload, got.created) == (
        message.id,
        message.type,
        message.payload,
        message.created,
    )
    assert priority == 100


def test_the_message_is_one_member_of_the_default_set_in_the_php_envelope(
    driver, client, namespace
):
    message = Message("greet", {"a/b": "Ž"})
    driver.send(message)
    [body] = client.smembers(namespace)
    assert body == outgoing(message).body
    assert list(json.loads(body)["message"]) == [
        "id",
        "type",
        "created",
        "payload",
        "execute_at",
        "retries",
    ]


@pytest.fixture
def slow_driver(redis_url, namespace) -> Iterator[RedisSetDriver]:
    """A driver whose idle waits last 60 s unless woken, on a client named after the test."""
    blocking: redis.Redis[Any] = redis.Redis.from_url(
        redis_url, socket_timeout=None, client_name=namespace
    )
    yield RedisSetDriver(
        blocking, key=namespace, schedule_key=f"{namespace}_schedule", refresh_interval=60
    )
    blocking.close()


def blocked_receive(
    consumer: Consumer, client: redis.Redis[Any], namespace: str, eventually: Any
) -> Callable[[], Received | None]:
    """Start ``consumer.receive(60)`` in a thread, once blocked in BLPOP; returns its join."""
    got: list[Received | None] = []
    thread = threading.Thread(target=lambda: got.append(consumer.receive(60)), daemon=True)
    thread.start()
    eventually(
        lambda: any(c["name"] == namespace and c["cmd"] == "blpop" for c in client.client_list()),
        "the consumer to block in BLPOP",
    )

    def join() -> Received | None:
        thread.join(DEADLINE_S)
        assert not thread.is_alive(), "receive() was not woken"
        [received] = got
        return received

    return join


def test_an_idle_consumer_is_woken_by_a_send_rather_than_by_its_refresh(
    slow_driver, client, namespace, eventually
):
    # A 60 s refresh and a 60 s receive: only the wake-up token can deliver within the deadline.
    with slow_driver.consumer([]) as consumer:
        join = blocked_receive(consumer, client, namespace, eventually)
        message = Message("wake")
        slow_driver.send(message)
        received = join()
    assert received is not None
    assert received.body == outgoing(message).body
    assert (received.priority, received.token) == (100, namespace)


def test_an_idle_receive_returns_none_within_its_timeout(client, namespace):
    # A 60 s refresh: only receive's own timeout can end the wait within the deadline.
    driver = RedisSetDriver(
        client, key=namespace, schedule_key=f"{namespace}_schedule", refresh_interval=60
    )
    with driver.consumer([]) as consumer:
        started = time.monotonic()
        assert consumer.receive(0.3) is None
        assert time.monotonic() - started < DEADLINE_S


def test_a_message_added_without_a_wake_token_is_found_by_the_refresh(
    driver, client, namespace, start_worker, eventually
):
    worker = start_worker(driver)
    time.sleep(0.3)
    client.sadd(namespace, MessageSerializer().serialize(Message("php-like")))
    eventually(lambda: worker.handled, "the message to be found without a wake-up token")


def test_the_wake_list_is_capped_so_a_burst_does_not_grow_it(driver, client, namespace):
    driver.send_batch([Message("burst") for _ in range(3 * WAKE_LIST_CAP)])
    for _ in range(5):
        driver.send(Message("more"))
    assert client.llen(wake_key(namespace)) == WAKE_LIST_CAP
    assert client.scard(namespace) == 3 * WAKE_LIST_CAP + 5


def test_higher_priorities_are_read_first_whatever_the_setup_order(
    driver, namespace, start_worker, eventually
):
    driver.setup_priority_queue(f"{namespace}-low", LOW)
    driver.setup_priority_queue(f"{namespace}-high", HIGH)
    for priority in (LOW, 100, HIGH) * 5:
        driver.send(Message("p", {"priority": priority}), priority)
    worker = start_worker(driver)
    eventually(lambda: len(worker.handled) == 15, "15 messages")
    worker.join()
    assert [p for _, p in worker.handled] == [HIGH] * 5 + [100] * 5 + [LOW] * 5
    assert [m.payload["priority"] for m, _ in worker.handled] == [p for _, p in worker.handled]


def test_a_worker_restricted_to_priorities_leaves_the_others_alone(
    driver, client, namespace, start_worker, eventually
):
    driver.setup_priority_queue(f"{namespace}-high", HIGH)
    driver.send(Message("default"))
    driver.send(Message("high"), HIGH)
    worker = start_worker(driver, priorities=[HIGH])
    eventually(lambda: worker.handled, "the high-priority message")
    time.sleep(0.3)
    worker.join()
    assert [(m.type, p) for m, p in worker.handled] == [("high", HIGH)]
    assert client.scard(namespace) == 1


def test_an_unknown_priority_is_refused_by_send_and_by_wait(driver, client, namespace):
    with pytest.raises(UnknownPriorityError, match="priority 7") as info:
        driver.send(Message("x"), 7)
    assert info.value.priority == 7
    with pytest.raises(UnknownPriorityError):
        compat.wait(driver, lambda message, priority: True, [7])
    assert client.scard(namespace) == 0


@pytest.mark.parametrize("priority", ["200", 200.0, True, None])
def test_a_priority_that_is_not_an_int_is_refused_by_setup(driver, priority):
    with pytest.raises(ConfigurationError, match=f"priority must be an int, got {priority!r}"):
        driver.setup_priority_queue("high", priority)
    with pytest.raises(UnknownPriorityError):  # nothing was set up
        driver.send(Message("x"), priority)


def test_a_future_message_waits_in_the_schedule_until_it_is_due(
    driver, client, namespace, start_worker, eventually
):
    execute_at = time.time() + 0.8
    message = Message("later", execute_at=execute_at)
    driver.send(message)
    assert client.zscore(f"{namespace}_schedule", MessageSerializer().serialize(message)) == (
        pytest.approx(execute_at)
    )
    assert client.scard(namespace) == 0
    worker = start_worker(driver)
    eventually(lambda: worker.handled, "the scheduled message")
    handled_at = time.time()
    worker.join()
    assert handled_at >= execute_at
    assert worker.handled[0][0].execute_at == pytest.approx(execute_at)
    assert client.zcard(f"{namespace}_schedule") == 0


def test_a_due_message_sent_with_a_priority_moves_to_the_default_set(
    driver, namespace, start_worker, eventually
):
    driver.setup_priority_queue(f"{namespace}-high", HIGH)
    driver.send(Message("later", execute_at=time.time() + 0.3), HIGH)
    worker = start_worker(driver)
    eventually(lambda: worker.handled, "the scheduled message")
    worker.join()
    assert worker.handled[0][1] == 100


def test_a_message_whose_time_has_passed_goes_straight_to_its_set(driver, client, namespace):
    driver.send(Message("late", execute_at=time.time() - 5))
    assert client.scard(namespace) == 1
    assert client.zcard(f"{namespace}_schedule") == 0


def test_a_batch_larger_than_one_script_call_arrives_whole(
    driver, client, namespace, start_worker, eventually
):
    now = time.time()
    messages = [Message("b", {"i": i}) for i in range(1200)]
    messages += [Message("s", {"i": i}, execute_at=now + 0.5) for i in range(300)]
    driver.send_batch(messages)
    assert client.scard(namespace) == 1200
    assert client.zcard(f"{namespace}_schedule") == 300
    worker = start_worker(driver)
    eventually(lambda: len(worker.handled) == 1500, "1500 messages")
    worker.join()
    assert sorted(worker.ids()) == sorted(m.id for m in messages)


def test_max_items_makes_wait_return_with_the_rest_left_in_redis(driver, client, namespace):
    driver.send_batch([Message("m", {"i": i}) for i in range(5)])
    compat.set_max_process_items(driver, 3)
    handled: list[Message] = []
    compat.wait(driver, lambda message, priority: handled.append(message) is None)
    assert len(handled) == 3
    assert client.scard(namespace) == 2


def test_an_idle_worker_returns_soon_after_shutdown(driver, start_worker, eventually):
    worker = start_worker(driver)
    time.sleep(0.3)
    worker.stop.shutdown()
    eventually(lambda: not worker.thread.is_alive(), "wait() to return after shutdown")
    assert worker.handled == []


def test_a_body_that_is_not_a_message_is_logged_and_set_aside_and_the_worker_goes_on(
    driver, client, namespace, caplog, start_worker, eventually
):
    caplog.set_level(logging.ERROR, logger="hermes")
    driver.send_raw(b"this is not json")
    driver.send_raw(b'{"message":{"id":"no-type"}}')
    driver.send_raw(b"\xff\xfe\x00 not utf-8")
    good = Message("good")
    driver.send(good)
    worker = start_worker(driver)
    eventually(lambda: worker.handled and not client.scard(namespace), "the set to be emptied")
    worker.join()
    assert worker.ids() == [good.id]
    texts = [r.getMessage() for r in caplog.records]
    assert sum("not a Hermes message" in text for text in texts) == 3
    assert any("Cannot unserialize message from 'this is not json'" in text for text in texts)
    assert any("Invalid message format" in text for text in texts)
    assert set(client.lrange(rejected_key(namespace), 0, -1)) == {
        b"this is not json",
        b'{"message":{"id":"no-type"}}',
        b"\xff\xfe\x00 not utf-8",
    }


def test_a_payload_that_cannot_be_encoded_never_reaches_redis(driver, client, namespace):
    with pytest.raises(SerializeError, match="Cannot serialize message"):
        driver.send(Message("bad", {"x": object()}))
    with pytest.raises(SerializeError):
        driver.send_batch([Message("ok"), Message("bad", {"x": {1, 2}})])
    assert client.exists(namespace, f"{namespace}_schedule", wake_key(namespace)) == 0


def test_an_exception_from_the_callback_propagates_and_the_message_is_gone(
    driver, client, namespace
):
    class Boom(Exception):
        pass

    def explode(message: Message, priority: int) -> bool:
        raise Boom(message.id)

    driver.send(Message("x"))
    assert driver.capabilities.delivery is Delivery.AT_MOST_ONCE
    with pytest.raises(Boom):
        compat.wait(driver, explode)
    assert client.scard(namespace) == 0


def test_release_does_not_put_a_popped_message_back(driver, client, namespace):
    # At most once: a handler that raised may have done part of its work; it does not run again.
    driver.send(Message("x"))
    with driver.consumer([]) as consumer:
        received = consumer.receive(1)
        assert received is not None
        consumer.release(received)
        assert client.scard(namespace) == 0
        assert consumer.receive(0.2) is None


def test_a_consumer_for_many_handlers_pops_several_bodies_in_one_round_trip(
    driver, client, namespace
):
    driver.send_batch([Message("m", {"i": i}) for i in range(10)])
    with driver.consumer([], concurrency=128) as consumer:  # 128 / 32: four at a time
        first = consumer.receive(1)
        assert first is not None
        assert client.scard(namespace) == 6
        rest = [consumer.receive(1) for _ in range(3)]
        assert client.scard(namespace) == 6  # handed out without a pop
        fifth = consumer.receive(1)
        assert client.scard(namespace) == 2
        taken = [first, *rest, fifth]
        assert all(received is not None for received in taken)
        assert len({received.body for received in taken if received is not None}) == 5


def test_a_consumer_pops_at_most_a_few_bodies_however_many_handlers(driver, client, namespace):
    most = redis_driver._RedisConsumer.MOST_POPPED
    driver.send_batch([Message("m", {"i": i}) for i in range(most + 10)])
    with driver.consumer([], concurrency=100_000) as consumer:
        assert consumer.receive(1) is not None
        assert client.scard(namespace) == 10


def test_a_consumer_with_few_handlers_pops_one_body_at_a_time(driver, client, namespace):
    driver.send_batch([Message("m", {"i": i}) for i in range(5)])
    with driver.consumer([], concurrency=63) as consumer:
        assert consumer.receive(1) is not None
        assert client.scard(namespace) == 4


def test_closing_puts_back_what_was_popped_and_never_handed_out(driver, client, namespace):
    driver.send_batch([Message("m", {"i": i}) for i in range(10)])
    with driver.consumer([], concurrency=256) as consumer:  # eight at a time
        running = consumer.receive(1)  # its handler runs: it is not put back
        assert running is not None
        assert client.scard(namespace) == 2
    assert client.scard(namespace) == 9
    assert running.body not in client.smembers(namespace)
    assert client.llen(wake_key(namespace)) >= 7  # an idle worker is woken for them


def test_several_bodies_are_popped_from_the_highest_priority_set_that_has_any(
    driver, client, namespace
):
    driver.setup_priority_queue(f"{namespace}-low", LOW)
    driver.setup_priority_queue(f"{namespace}-high", HIGH)
    driver.send_batch([Message("low") for _ in range(3)], LOW)
    driver.send_batch([Message("high") for _ in range(2)], HIGH)
    with driver.consumer([], concurrency=1000) as consumer:
        taken = [consumer.receive(1) for _ in range(5)]
        assert consumer.receive(0.2) is None
    assert [received.priority for received in taken if received is not None] == [
        HIGH,
        HIGH,
        LOW,
        LOW,
        LOW,
    ]
    assert [received.token for received in taken if received is not None] == [
        f"{namespace}-high"
    ] * 2 + [f"{namespace}-low"] * 3


def test_the_rejected_list_keeps_only_the_newest_bodies(driver, client, namespace, monkeypatch):
    monkeypatch.setattr(redis_driver, "REJECTED_CAP", 3)
    with driver.consumer([]) as consumer:
        for i in range(5):
            consumer.reject(Received(b"bad %d" % i, 100, namespace), "not a message")
    assert client.lrange(rejected_key(namespace), 0, -1) == [b"bad 4", b"bad 3", b"bad 2"]


def test_a_reject_from_another_thread_leaves_a_blocked_receive_alone(
    slow_driver, client, namespace, eventually
):
    with slow_driver.consumer([]) as consumer:
        join = blocked_receive(consumer, client, namespace, eventually)
        consumer.reject(Received(b"bad", 100, namespace), "not a message")
        assert client.lrange(rejected_key(namespace), 0, -1) == [b"bad"]
        slow_driver.send(Message("after"))
        received = join()
    assert received is not None
    assert MessageSerializer().unserialize(received.body).type == "after"


def test_purge_deletes_every_key_the_driver_uses(driver, client, namespace):
    driver.setup_priority_queue(f"{namespace}-high", HIGH)
    driver.send(Message("a"))
    driver.send(Message("b"), HIGH)
    driver.send(Message("c", execute_at=time.time() + 60))
    keys = [
        namespace,
        f"{namespace}-high",
        f"{namespace}_schedule",
        wake_key(namespace),
        wake_key(f"{namespace}-high"),
    ]
    assert client.exists(*keys) == 5
    assert isinstance(driver, SupportsTeardown)
    driver.teardown()
    assert client.exists(*keys) == 0


def test_a_prefix_puts_every_key_of_the_driver_under_it(client, namespace):
    driver = RedisSetDriver(client, prefix=f"{namespace}:")
    driver.setup_priority_queue("high", HIGH)
    driver.send(Message("a"))
    driver.send(Message("b"), HIGH)
    driver.send(Message("c", execute_at=time.time() + 60))
    assert sorted(k.decode() for k in client.scan_iter(match=f"{namespace}:*")) == [
        f"{namespace}:hermes",
        f"{namespace}:hermes_schedule",
        f"{namespace}:hermes_wakeup",
        f"{namespace}:high",
        f"{namespace}:high_wakeup",
    ]
    driver.teardown()
    assert list(client.scan_iter(match=f"{namespace}:*")) == []


def test_send_from_many_threads_at_once_loses_nothing(driver, start_worker, eventually):
    sent: list[str] = []
    lock = threading.Lock()

    def emit() -> None:
        for _ in range(50):
            message = Message("t")
            driver.send(message)
            with lock:
                sent.append(message.id)

    threads = [threading.Thread(target=emit) for _ in range(8)]
    for thread in threads:
        thread.start()
    worker = start_worker(driver)
    for thread in threads:
        thread.join()
    eventually(lambda: len(worker.handled) == 400, "400 messages")
    worker.join()
    assert sorted(worker.ids()) == sorted(sent)


def test_a_driver_made_before_fork_works_in_the_child_on_its_own_connections(
    driver, client, namespace
):
    driver.send(Message("parent-before"))  # the parent now has a pooled connection
    parent_connection = driver.client.connection_pool.get_connection()

    def child() -> None:
        pool = driver.client.connection_pool
        driver.send(Message("child"))
        handled: list[str] = []
        compat.set_max_process_items(driver, 2)
        compat.wait(driver, lambda message, priority: handled.append(message.type) is None)
        ok = pool.pid == os.getpid() and parent_connection not in pool._available_connections
        os._exit(0 if ok and sorted(handled) == ["child", "parent-before"] else 3)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(30)
    assert process.exitcode == 0
    # The parent's own connection was not disturbed by the child.
    parent_connection.send_command("PING")
    assert parent_connection.read_response() == b"PONG"
    driver.client.connection_pool.release(parent_connection)
    driver.send(Message("parent-after"))
    assert client.scard(namespace) == 1


def test_a_decode_responses_client_still_gets_bytes_and_sets_non_utf8_bodies_aside(
    redis_url, namespace, client, caplog, start_worker, eventually
):
    caplog.set_level(logging.ERROR, logger="hermes")
    text_client: redis.Redis[Any] = redis.Redis.from_url(redis_url, decode_responses=True)
    driver = RedisSetDriver(
        text_client, key=namespace, schedule_key=f"{namespace}_schedule", refresh_interval=0.2
    )
    driver.send_raw(b"\xc3\x28 broken utf-8")
    driver.send(Message("ok", {"text": "ščť"}))
    worker = start_worker(driver)
    eventually(lambda: worker.handled and not client.scard(namespace), "the set to be emptied")
    worker.join()
    text_client.close()
    assert [m.payload for m, _ in worker.handled] == [{"text": "ščť"}]
    assert any("not a Hermes message" in r.getMessage() for r in caplog.records)
    assert client.lrange(rejected_key(namespace), 0, -1) == [b"\xc3\x28 broken utf-8"]


def test_send_to_a_redis_that_is_not_there_raises_broker_unavailable():
    import hermes_test_services

    driver = connect(f"redis://127.0.0.1:{hermes_test_services.free_port()}/0")
    with pytest.raises(BrokerUnavailableError, match="unavailable") as info:
        driver.send(Message("lost?"))
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    with driver.consumer([]) as consumer:  # connects on the first receive, not before
        with pytest.raises(BrokerUnavailableError, match="unavailable while receiving"):
            with translate_errors(driver, "receiving"):  # as the Worker calls it
                consumer.receive(0.1)
    driver.close()


def test_refused_credentials_fail_a_send_and_stop_a_worker_naming_the_cause(redis_url):
    driver = connect(redis_url.replace("redis://", "redis://hermes-nobody:wrong@", 1))
    with pytest.raises(BrokerRefusedError, match="refused while sending") as sent:
        driver.send(Message("x"))
    assert isinstance(sent.value.__cause__, redis.AuthenticationError)
    # No reconnect fixes a wrong password: the worker stops instead of retrying forever.
    with pytest.raises(BrokerRefusedError, match="password in the URL") as info:
        compat.wait(driver, lambda message, priority: True)
    assert not isinstance(info.value, BrokerUnavailableError)
    driver.close()


def test_a_wrong_type_at_the_queue_key_raises_a_driver_error_naming_it(driver, client, namespace):
    client.set(namespace, "a string, not a set")
    with pytest.raises(DeliveryError, match="WRONGTYPE"):
        driver.send(Message("x"))
    with pytest.raises(DriverError, match="WRONGTYPE"):
        compat.wait(driver, lambda m, p: True)
