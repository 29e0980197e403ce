"""delivery=at-least-once: leases that are renewed, acknowledged, released, and run out."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

import pytest
import redis
from hermes_test_support import DEADLINE_S

from hermes.core import ConfigurationError, Dispatcher, Message, Worker, compat, connect
from hermes.core.driver import Delivery, Received
from hermes.core.drivertools import outgoing
from hermes.drivers.redis import (
    RedisSetDriver,
    _scripts,
    deliveries_key,
    held_key,
    inflight_key,
    rejected_key,
    wake_key,
)

HIGH = 200


def leasing(
    client: redis.Redis[Any], namespace: str, lease_timeout_s: float = 30
) -> RedisSetDriver:
    return RedisSetDriver(
        client,
        key=namespace,
        schedule_key=f"{namespace}_schedule",
        refresh_interval=0.2,
        delivery="at-least-once",
        lease_timeout_s=lease_timeout_s,
    )


@pytest.fixture
def driver(client, namespace) -> RedisSetDriver:
    return leasing(client, namespace)


def leases(client: redis.Redis[Any], queue: str) -> dict[tuple[bytes, bytes], bytes]:
    """(owner, take number) -> body of what is held on ``queue``.

    Checks that every hash of held messages belongs to an owner with a lease:
    a body in any other would never be put back.
    """
    owners = client.zrange(inflight_key(queue), 0, -1)
    hashes = set(client.scan_iter(match=held_key(queue, "*")))
    orphans = hashes - {held_key(queue, owner).encode() for owner in owners}
    assert not orphans, f"held by no lease: {orphans}"
    return {
        (owner, number): body
        for owner in owners
        for number, body in client.hgetall(held_key(queue, owner)).items()
    }


def unreachable(command: Any, raw: bool) -> Any:
    """An ``execute`` for a Redis that is down."""
    raise redis.ConnectionError("Connection refused")


def lease_of(consumer: Any, received: Received) -> tuple[bytes, bytes]:
    """The key of ``received`` in :func:`leases`."""
    return consumer.owner.encode(), received.token[1]


def server_ms(client: redis.Redis[Any]) -> float:
    seconds, micros = client.time()
    return seconds * 1000 + micros / 1000


def test_a_url_chooses_the_delivery_and_the_lease_and_the_capabilities_follow():
    plain = connect("redis://127.0.0.1:6390/0")
    assert plain.capabilities.delivery is Delivery.AT_MOST_ONCE
    assert plain.capabilities.redelivery_timeout_s == 0
    leased = connect("redis://127.0.0.1:6390/0?delivery=at-least-once&lease_timeout=12")
    assert isinstance(leased, RedisSetDriver)
    assert leased.capabilities.delivery is Delivery.AT_LEAST_ONCE
    assert leased.lease_timeout_s == 12
    assert leased.capabilities.redelivery_timeout_s == 13
    assert "at-least-once" in repr(leased)
    default = connect("redis://127.0.0.1:6390/0?delivery=at-least-once")
    assert default.capabilities.redelivery_timeout_s == 31
    for driver in (plain, leased, default):
        driver.close()


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis://localhost/0?delivery=at_least_once", "'at-most-once' or 'at-least-once'"),
        ("redis://localhost/0?lease_timeout=10", "needs delivery='at-least-once'"),
        ("redis://localhost/0?delivery=at-least-once&lease_timeout=0.5", "from 1 to 86400"),
        ("redis://localhost/0?delivery=at-least-once&lease_timeout=long", "lease_timeout"),
        ("redis://localhost/0?prefetch=4", "prefetch=4 needs delivery='at-least-once'"),
        ("redis://localhost/0?delivery=at-least-once&prefetch=0", "prefetch"),
        ("redis://localhost/0?delivery=at-least-once&prefetch=1001", "from 1 to 1000"),
    ],
)
def test_a_bad_delivery_option_fails_at_connect_naming_the_problem(url, complaint):
    with pytest.raises(ConfigurationError, match=complaint):
        connect(url)


def prefetching(client: redis.Redis[Any], namespace: str, prefetch: int) -> RedisSetDriver:
    return RedisSetDriver(
        client,
        key=namespace,
        schedule_key=f"{namespace}_schedule",
        refresh_interval=0.2,
        delivery="at-least-once",
        prefetch=prefetch,
    )


def test_a_url_sets_the_prefetch_of_an_at_least_once_driver():
    driver = connect("redis://127.0.0.1:6390/0?delivery=at-least-once&prefetch=16")
    assert isinstance(driver, RedisSetDriver)
    assert driver.prefetch == 16
    driver.close()


def test_with_prefetch_one_take_claims_several_bodies_under_the_lease(client, namespace):
    driver = prefetching(client, namespace, 3)
    driver.send_batch([Message("a"), Message("b"), Message("c"), Message("d")])
    with driver.consumer([]) as consumer:
        first = consumer.receive(1)
        assert first is not None
        assert len(leases(client, namespace)) == 3
        assert client.scard(namespace) == 1
        rest = [consumer.receive(1), consumer.receive(1)]
        assert len(leases(client, namespace)) == 3  # handed out without a take
        taken = [first, *rest]
        assert len({r.token for r in taken if r is not None}) == 3
        assert all(r is not None and r.delivery_count == 1 for r in taken)
        for received in taken:
            assert received is not None
            consumer.ack(received)
        last = consumer.receive(1)
        assert last is not None
        assert list(leases(client, namespace).values()) == [last.body]
        consumer.ack(last)
    assert leases(client, namespace) == {}
    assert client.hlen(deliveries_key(namespace)) == 0


def test_close_gives_back_at_once_what_was_claimed_and_never_handed_out(client, namespace):
    driver = prefetching(client, namespace, 5)
    driver.send_batch([Message(str(i)) for i in range(5)])
    with driver.consumer([]) as consumer:
        running = consumer.receive(1)  # a handler still runs it when the worker closes
        assert running is not None
    assert list(leases(client, namespace).values()) == [running.body]
    assert client.scard(namespace) == 4
    assert running.body not in client.smembers(namespace)
    # Given back as if never taken: the next delivery is each body's first, and
    # nothing counts a delivery that has not ended unsettled.
    assert client.hlen(deliveries_key(namespace)) == 0
    with driver.consumer([]) as again:
        received = again.receive(1)
        assert received is not None and received.delivery_count == 1
        again.ack(received)


def test_with_prefetch_an_ack_does_not_wait_long_for_the_next_take(client, namespace):
    driver = prefetching(client, namespace, 3)
    driver.send_batch([Message("a"), Message("b"), Message("c")])
    with driver.consumer([]) as consumer:
        first = consumer.receive(1)
        assert first is not None
        consumer.ack(first)
        time.sleep(0.15)  # a slow handler: longer than an acknowledgement may wait
        second = consumer.receive(1)
        assert second is not None
        assert first.body not in leases(client, namespace).values()
        consumer.ack(second)


def test_a_worker_with_prefetch_handles_every_message_once(client, namespace):
    driver = prefetching(client, namespace, 16)
    driver.send_batch([Message("n", {"i": i}) for i in range(50)])
    seen: list[int] = []
    lock = threading.Lock()

    def handle(message: Message, priority: int) -> bool:
        with lock:
            seen.append(message.payload["i"])
        return True

    Worker(driver, handle, concurrency=4, max_items=50, handle_signals=False).run()
    assert sorted(seen) == list(range(50))
    assert leases(client, namespace) == {}
    assert client.scard(namespace) == 0


def test_a_worker_that_stops_at_max_items_gives_back_what_it_prefetched(client, namespace):
    driver = prefetching(client, namespace, 16)
    driver.send_batch([Message("n", {"i": i}) for i in range(20)])
    Worker(driver, lambda message, priority: True, max_items=5, handle_signals=False).run()
    assert leases(client, namespace) == {}
    assert client.scard(namespace) == 15


def test_a_received_message_is_held_under_a_lease_naming_its_worker(driver, client, namespace):
    message = Message("held")
    driver.send(message)
    body = outgoing(message).body
    with driver.consumer([]) as consumer:
        before = server_ms(client)
        received = consumer.receive(1)
        assert received is not None and received.body == body
        assert client.scard(namespace) == 0
        [(owner, deadline)] = client.zrange(inflight_key(namespace), 0, -1, withscores=True)
        assert leases(client, namespace) == {(owner, b"1"): body}
        host, pid, _ = owner.decode().rsplit(":", 2)
        assert (host, int(pid)) == (socket.gethostname(), os.getpid())
        assert before + 29_000 < deadline < server_ms(client) + 30_000 + 1
        consumer.ack(received)
    assert leases(client, namespace) == {}
    assert client.scard(namespace) == 0
    assert client.zcard(inflight_key(namespace)) == 0  # closed holding nothing: no lease left


def test_a_worker_that_closes_holding_a_message_keeps_its_lease_until_it_runs_out(
    client, namespace, eventually
):
    driver = leasing(client, namespace, lease_timeout_s=1)
    driver.send(Message("long"))
    consumer = driver.consumer([])
    received = consumer.receive(1)
    assert received is not None
    consumer.close()  # its handler outlived the grace period: the message stays held
    assert list(leases(client, namespace)) == [lease_of(consumer, received)]
    assert client.scard(namespace) == 0
    with driver.consumer([]) as live:
        got = eventually(lambda: live.receive(0.2), "the message once the lease ran out")
        assert got.body == received.body
        live.ack(got)
    assert leases(client, namespace) == {}
    assert client.zcard(inflight_key(namespace)) == 0


def test_a_worker_holding_many_messages_has_one_lease(driver, client, namespace):
    driver.send_batch([Message("m", {"i": i}) for i in range(5)])
    with driver.consumer([]) as consumer:
        taken = [consumer.receive(1) for _ in range(5)]
        assert client.zcard(inflight_key(namespace)) == 1
        assert set(leases(client, namespace)) == {lease_of(consumer, r) for r in taken}
        for received in taken:
            consumer.ack(received)
    assert leases(client, namespace) == {}


def test_an_ack_on_the_receiving_thread_is_sent_with_the_next_receive(driver, client, namespace):
    driver.send_batch([Message("a"), Message("b")])
    with driver.consumer([]) as consumer:
        first = consumer.receive(1)
        consumer.ack(first)
        assert len(leases(client, namespace)) == 1  # not sent yet
        second = consumer.receive(1)
        assert list(leases(client, namespace)) == [lease_of(consumer, second)]
        consumer.ack(second)
        assert consumer.receive(0.2) is None
        assert leases(client, namespace) == {}


def test_an_ack_from_another_thread_goes_with_the_next_take(driver, client, namespace):
    driver.send(Message("a"))
    driver.send(Message("b"))
    with driver.consumer([]) as consumer:
        received = consumer.receive(1)
        thread = threading.Thread(target=consumer.ack, args=(received,))
        thread.start()
        thread.join(DEADLINE_S)
        assert len(leases(client, namespace)) == 1  # deferred: no round trip of its own
        second = consumer.receive(1)
        assert second is not None
        assert list(leases(client, namespace).values()) == [second.body]
        consumer.ack(second)


def test_an_ack_made_while_the_worker_waits_idle_is_sent_at_once(driver, client, namespace):
    driver.send(Message("a"))
    client.delete(wake_key(namespace))  # or the wait ends at once on the send's token
    with driver.consumer([]) as consumer:
        received = consumer.receive(1)
        waiting = threading.Thread(target=consumer.receive, args=(3,))
        waiting.start()
        deadline = time.monotonic() + DEADLINE_S
        while not consumer.acks.is_idle and time.monotonic() < deadline:
            time.sleep(0.01)
        consumer.ack(received)
        assert leases(client, namespace) == {}
        waiting.join(DEADLINE_S)


def test_acks_still_unsent_are_sent_before_an_idle_wait(driver, client, namespace):
    driver.send(Message("a"))
    with driver.consumer([]) as consumer:
        received = consumer.receive(1)
        consumer.ack(received)
        assert consumer.receive(0.2) is None
        assert leases(client, namespace) == {}


def test_release_puts_the_body_back_at_once_and_wakes_a_worker(driver, client, namespace):
    message = Message("again")
    driver.send(message)
    client.delete(wake_key(namespace))
    with driver.consumer([]) as consumer:
        received = consumer.receive(1)
        consumer.release(received)
        assert leases(client, namespace) == {}
        assert client.smembers(namespace) == {received.body}
        assert client.llen(wake_key(namespace)) == 1
        again = consumer.receive(1)
        assert again is not None and again.body == received.body
        assert again.token != received.token
        consumer.ack(again)


def test_a_callback_that_raises_puts_its_message_back(driver, client, namespace):
    class Boom(Exception):
        pass

    def explode(message: Message, priority: int) -> bool:
        raise Boom(message.id)

    message = Message("x")
    driver.send(message)
    with pytest.raises(Boom):
        compat.wait(driver, explode)
    assert client.smembers(namespace) == {outgoing(message).body}
    assert leases(client, namespace) == {}


def test_a_lease_that_runs_out_is_put_back_and_delivered_to_another_worker(
    client, namespace, caplog, eventually
):
    caplog.set_level(logging.WARNING, logger="hermes")
    driver = leasing(client, namespace, lease_timeout_s=1)
    message = Message("orphan")
    driver.send(message)
    dead = driver.consumer([])
    taken = dead.receive(1)
    assert taken is not None
    dead.leases.stop()  # the worker "dies": no more renewals, no acknowledgement
    with driver.consumer([]) as live:
        got = eventually(lambda: live.receive(0.2), "the run-out lease to be delivered again")
        assert got.body == taken.body and got.delivery_count == 2
        live.ack(got)
    assert "put back 1 message(s) held by workers whose lease ran out" in caplog.text
    assert leases(client, namespace) == {}
    dead.close()


def test_a_handler_longer_than_the_lease_keeps_its_message(client, namespace, eventually):
    driver = leasing(client, namespace, lease_timeout_s=1)
    driver.send(Message("slow"))
    other_got: list[Received] = []
    stop = threading.Event()

    def compete() -> None:  # another worker, looking at the leases all the while
        with leasing(client, namespace, lease_timeout_s=1).consumer([]) as other:
            while not stop.is_set():
                received = other.receive(0.2)
                if received is not None:
                    other_got.append(received)

    with driver.consumer([]) as consumer:
        received = consumer.receive(1)
        assert received is not None
        competitor = threading.Thread(target=compete, daemon=True)
        competitor.start()
        time.sleep(2.5)  # the "handler": 2.5 leases long
        consumer.ack(received)
        stop.set()
        competitor.join(DEADLINE_S)
    assert other_got == []
    assert leases(client, namespace) == {}
    assert client.scard(namespace) == 0


def test_a_renewal_that_finds_its_lease_gone_says_so_and_leases_again(
    driver, client, namespace, caplog
):
    caplog.set_level(logging.WARNING, logger="hermes")
    driver.send(Message("x"))
    with driver.consumer([]) as consumer:
        received = consumer.receive(1)
        # As if it ran out and another worker put back what it held.
        client.delete(inflight_key(namespace), held_key(namespace, consumer.owner))
        consumer._renew()
        assert "ran out before it was renewed" in caplog.text
        assert client.zscore(inflight_key(namespace), consumer.owner) is not None
        caplog.clear()
        consumer._renew()
        assert "ran out" not in caplog.text
        consumer.ack(received)


def test_a_worker_whose_lease_ran_out_leases_again_when_it_takes(driver, client, namespace):
    driver.send_batch([Message("a"), Message("b")])
    with driver.consumer([]) as consumer:
        first = consumer.receive(1)
        # Its lease ran out (a stall longer than the lease), what it held was put
        # back, and it goes on taking before its renewer notices.
        client.delete(inflight_key(namespace), held_key(namespace, consumer.owner))
        second = consumer.receive(1)
        assert second is not None and second.body != first.body
        assert client.zscore(inflight_key(namespace), consumer.owner) is not None
        assert list(leases(client, namespace)) == [lease_of(consumer, second)]
        consumer.ack(first)  # gone already: harmless
        consumer.ack(second)
    assert leases(client, namespace) == {}


def test_the_same_body_taken_twice_is_held_twice_and_each_lease_settles_alone(
    client, namespace, eventually
):
    driver = leasing(client, namespace, lease_timeout_s=1)
    message = Message("twin")
    driver.send(message)
    with driver.consumer([]) as one, driver.consumer([]) as two:
        first = one.receive(1)
        driver.send(message)  # the very same body again, while the first is held
        second = two.receive(1)
        assert first.body == second.body
        assert len(leases(client, namespace)) == 2
        for _ in range(2):  # from a handler thread, twice: harmless
            thread = threading.Thread(target=one.ack, args=(first,))
            thread.start()
            thread.join(DEADLINE_S)
        assert one.receive(0.1) is None  # which sends the acknowledgements
        assert list(leases(client, namespace)) == [lease_of(two, second)]
        two.leases.stop()  # the second worker dies: its lease runs out
        got = eventually(lambda: one.receive(0.2), "the second lease to be put back")
        assert got.body == second.body
        one.ack(got)
    assert leases(client, namespace) == {}


def test_a_body_that_is_not_a_message_goes_from_its_lease_to_the_rejected_list(
    driver, client, namespace
):
    driver.send_raw(b"not json")
    with driver.consumer([]) as consumer:
        received = consumer.receive(1)
        consumer.reject(received, "not a message")
        assert leases(client, namespace) == {}
        assert client.lrange(rejected_key(namespace), 0, -1) == [b"not json"]
        consumer.reject(received, "not a message")  # twice: listed once
    assert client.lrange(rejected_key(namespace), 0, -1) == [b"not json"]


def test_priorities_are_read_highest_first_and_settle_on_their_own_sets(
    driver, client, namespace, eventually
):
    high = f"{namespace}-high"
    driver.setup_priority_queue(high, HIGH)
    driver.send(Message("low"))
    driver.send(Message("high"), HIGH)
    with driver.consumer([]) as consumer:
        first, second = consumer.receive(1), consumer.receive(1)
        assert (first.priority, second.priority) == (HIGH, 100)
        assert len(leases(client, high)) == 1 and len(leases(client, namespace)) == 1
        consumer.release(first)
        assert client.scard(high) == 1
        consumer.ack(second)
    assert leases(client, high) == {} and leases(client, namespace) == {}


def test_a_run_out_lease_goes_back_to_the_set_it_came_from(client, namespace, eventually):
    driver = leasing(client, namespace, lease_timeout_s=1)
    high = f"{namespace}-high"
    driver.setup_priority_queue(high, HIGH)
    driver.send(Message("high"), HIGH)
    dead = driver.consumer([])
    assert dead.receive(1) is not None
    dead.leases.stop()
    with driver.consumer([]) as live:
        got = eventually(lambda: live.receive(0.2), "the high-priority message again")
        assert got.priority == HIGH
        live.ack(got)
    dead.close()


def test_max_items_returns_with_every_handled_message_acknowledged(driver, client, namespace):
    driver.send_batch([Message("m", {"i": i}) for i in range(5)])
    compat.set_max_process_items(driver, 3)
    handled: list[Message] = []
    compat.wait(driver, lambda message, priority: handled.append(message) is None)
    assert len(handled) == 3
    assert client.scard(namespace) == 2
    assert leases(client, namespace) == {}


def test_several_handlers_at_once_hold_several_leases_and_acknowledge_each(
    driver, client, namespace, eventually
):
    driver.send_batch([Message("c", {"i": i}) for i in range(40)])
    started, gate = threading.Semaphore(0), threading.Event()
    handled: list[int] = []
    lock = threading.Lock()

    class Handler:
        def handle(self, message: Message) -> bool:
            started.release()
            gate.wait(DEADLINE_S)
            with lock:
                handled.append(message.payload["i"])
            return True

    dispatcher = Dispatcher(driver, concurrency=4)
    dispatcher.register_handler("c", Handler())
    worker = Worker(driver, dispatcher, max_items=40, handle_signals=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    for _ in range(4):
        assert started.acquire(timeout=DEADLINE_S)
    assert len(leases(client, namespace)) == 4  # one per handler thread
    gate.set()
    thread.join(DEADLINE_S * 3)
    assert not thread.is_alive()
    assert sorted(handled) == list(range(40))
    assert leases(client, namespace) == {}


def test_the_take_works_on_a_server_that_does_not_know_the_script_yet(
    driver, client, namespace, monkeypatch
):
    # A script of its own (another SHA1): the first packed EVALSHA meets NOSCRIPT.
    fresh = _scripts.LuaScript(_scripts.CLAIM.source + f"\n-- {namespace}\n")
    monkeypatch.setattr(_scripts, "CLAIM", fresh)
    driver.send_batch([Message("a"), Message("b")])
    with driver.consumer([]) as consumer:
        first = consumer.receive(1)
        consumer.ack(first)
        assert len(leases(client, namespace)) == 1
        second = consumer.receive(1)  # the packed call again, now that the server has it
        assert second is not None and second.body != first.body
        assert list(leases(client, namespace)) == [lease_of(consumer, second)]
        consumer.ack(second)
    assert leases(client, namespace) == {}


def test_teardown_deletes_the_leases_too(driver, client, namespace):
    driver.send(Message("a"))
    consumer = driver.consumer([])
    assert consumer.receive(1) is not None
    consumer.leases.stop()
    held = held_key(namespace, consumer.owner)
    assert client.exists(inflight_key(namespace), held) == 2
    driver.teardown()
    assert client.exists(inflight_key(namespace), held) == 0
    consumer.close()


def test_a_renewal_that_cannot_reach_redis_is_logged_once_until_it_works_again(
    driver, namespace, caplog, monkeypatch
):
    caplog.set_level(logging.INFO, logger="hermes")
    driver.send(Message("x"))
    with driver.consumer([]) as consumer:
        received = consumer.receive(1)
        reachable = driver._execute

        keeper = consumer.leases
        monkeypatch.setattr(driver, "_execute", unreachable)
        keeper.renew_now()
        keeper.renew_now()
        assert caplog.text.count("could not renew the lease of") == 1
        assert "unavailable while renewing the lease" in caplog.text
        monkeypatch.setattr(driver, "_execute", reachable)
        keeper.renew_now()
        assert f"renews the lease of {consumer.owner}" in caplog.text
        consumer.ack(received)


def test_a_close_that_cannot_reach_redis_says_what_will_be_delivered_again(
    driver, client, namespace, caplog, monkeypatch
):
    caplog.set_level(logging.INFO, logger="hermes")
    driver.send_batch([Message("a"), Message("b")])
    consumer = driver.consumer([])
    first = consumer.receive(1)
    consumer.ack(first)  # deferred to the next take, which never comes

    monkeypatch.setattr(consumer, "_execute", unreachable)
    consumer.close()
    assert "could not acknowledge 1 message(s), which are delivered again" in caplog.text
    assert list(leases(client, namespace)) == [lease_of(consumer, first)]


def test_each_take_counts_a_delivery_until_the_message_is_acknowledged(
    client, namespace, eventually
):
    driver = leasing(client, namespace, lease_timeout_s=1)
    assert driver.capabilities.counts_deliveries
    driver.send(Message("counted"))
    with driver.consumer([]) as consumer:
        first = consumer.receive(1)
        assert first is not None and first.delivery_count == 1
        consumer.release(first)  # given back: the next take is a redelivery
        second = consumer.receive(1)
        assert second is not None and second.delivery_count == 2
    # Closed holding it, as a killed worker would: its lease runs out.
    with driver.consumer([]) as live:
        third = eventually(lambda: live.receive(0.2), "the run-out lease to be delivered again")
        assert third.delivery_count == 3
        live.ack(third)
        assert live.receive(0.1) is None  # sends the deferred acknowledgement
    assert client.hlen(deliveries_key(namespace)) == 0


def test_an_ack_or_reject_from_another_thread_forgets_the_count(driver, client, namespace):
    driver.send_batch([Message("a"), Message("b")])
    with driver.consumer([]) as consumer:
        for settle in (consumer.ack, lambda r: consumer.reject(r, "test")):
            received = consumer.receive(1)
            thread = threading.Thread(target=settle, args=(received,))
            thread.start()
            thread.join(DEADLINE_S)
    assert client.hlen(deliveries_key(namespace)) == 0
    assert leases(client, namespace) == {}


def test_an_at_most_once_driver_does_not_count(client, namespace):
    driver = RedisSetDriver(client, key=namespace, schedule_key=f"{namespace}_schedule")
    assert not driver.capabilities.counts_deliveries
    driver.send(Message("once"))
    with driver.consumer([]) as consumer:
        received = consumer.receive(1)
        assert received is not None and received.delivery_count is None


def test_a_take_whose_reply_was_lost_loses_nothing(driver, client, namespace) -> None:
    # The connection breaks after Redis ran a take: the worker never saw the body it
    # claimed. A later take must not reuse its number, or it overwrites that body.
    driver.send_batch([Message("job", {"n": n}) for n in range(3)])
    consumer = driver.consumer([])
    delivered = []

    def take() -> Received | None:
        received = consumer.receive(0)
        if received is not None:
            delivered.append(received.decoded().payload["n"])
            consumer.ack(received)
        return received

    try:
        assert take() is not None
        real = consumer._execute

        def reply_lost(command: Any, raw: bool) -> Any:
            consumer._execute = real
            real(command, raw)  # the take runs on the server...
            raise redis.ConnectionError("Connection closed by server.")  # ...its reply is lost

        consumer._execute = reply_lost
        with pytest.raises(Exception, match="Connection closed"):
            consumer.receive(0)
        deadline = time.monotonic() + DEADLINE_S
        while len(delivered) < 3 and time.monotonic() < deadline:
            take()
    finally:
        consumer.close()

    assert sorted(delivered) == [0, 1, 2]
    assert client.scard(namespace) == 0
    assert leases(client, namespace) == {}
