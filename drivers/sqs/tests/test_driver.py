"""AmazonSqsDriver against a real SQS-compatible server (moto on 127.0.0.1)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError
from hermes_test_support import StopWhen, eventually

from hermes.core import (
    BrokerRefusedError,
    BrokerUnavailableError,
    DeliveryError,
    DriverError,
    Message,
    UnknownPriorityError,
    compat,
)
from hermes.core.cli import main
from hermes.core.driver import (
    Capabilities,
    Consumer,
    Delay,
    Delivery,
    Outgoing,
    QueueStats,
    Received,
)
from hermes.core.drivertools import MessageSerializer
from hermes.core.spi._door import translate_errors
from hermes.drivers.sqs import AmazonSqsDriver, SqsDelivery, current_delivery
from hermes.drivers.sqs import _driver as driver_module

MakeDriver = Callable[..., AmazonSqsDriver]
Handled = list[tuple[Message, int, SqsDelivery | None]]


def queue_counts(sqs: Any, name: str) -> tuple[int, int, int]:
    """(visible, in flight, delayed) messages of queue ``name``, as SQS reports them."""
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        int(attributes["ApproximateNumberOfMessagesDelayed"]),
    )


def receive_within(consumer: Consumer, timeout_s: float = 10.0) -> Received:
    """The next message ``consumer`` hands out, asked for a second at a time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        received = consumer.receive(1.0)
        if received is not None:
            return received
    raise AssertionError(f"nothing received within {timeout_s} s")


def recorder(received: Handled) -> Callable[[Message, int], bool]:
    def callback(message: Message, priority: int) -> bool:
        received.append((message, priority, current_delivery()))
        return True

    return callback


def handle_until(
    driver: AmazonSqsDriver, count: int, timeout_s: float = 15.0, **wait: Any
) -> Handled:
    """Run ``driver.wait`` until ``count`` messages were handled (or the timeout passed)."""
    received: Handled = []
    compat.set_shutdown(driver, StopWhen(lambda: len(received) >= count, timeout_s))
    compat.wait(driver, recorder(received), **wait)
    return received


class Boom(Exception):
    pass


# Round trip -------------------------------------------------------------------


def test_a_sent_message_is_handled_with_its_fields_and_then_deleted(
    make_driver: MakeDriver, sqs: Any
) -> None:
    driver = make_driver()
    sent = Message("mail", {"to": "a@example.com", "n": [1, 2.5, None]}, retries=3)
    driver.send(sent)

    received = handle_until(driver, 1)

    assert [(m.id, m.type, m.payload, m.retries, m.created) for m, _, _ in received] == [
        (sent.id, "mail", sent.payload, 3, sent.created)
    ]
    assert received[0][1] == 100
    assert queue_counts(sqs, driver.queue_name) == (0, 0, 0)


def test_capabilities_declare_at_least_once_and_the_visibility_timeout(
    make_driver: MakeDriver, sqs_url: str
) -> None:
    driver = make_driver(sqs_url + "&visibility_timeout=7")
    assert driver.capabilities == Capabilities(
        delivery=Delivery.AT_LEAST_ONCE,
        delay=Delay.IGNORED,
        priorities=True,
        competing_consumers=True,
        max_message_bytes=256 * 1024,
        redelivery_timeout_s=7.0,
        counts_deliveries=True,  # ApproximateReceiveCount
        wake_up_s=0.0,  # long polling
    )
    assert make_driver(sqs_url + "&delay=true").capabilities.delay is Delay.NATIVE


def test_the_handler_sees_its_delivery_and_nothing_outside_a_handler(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()
    driver.send(Message("a"))

    received = handle_until(driver, 1)

    delivery = received[0][2]
    assert delivery is not None
    assert delivery.receive_count == 1
    assert delivery.queue_name == driver.queue_name
    assert delivery.priority == 100
    assert delivery.sent_at is not None and abs(delivery.sent_at - time.time()) < 600
    assert current_delivery() is None and driver.current_delivery is None


def test_a_message_as_large_as_declared_goes_through(make_driver: MakeDriver) -> None:
    driver = make_driver()
    # The same id and created time: a float's repr varies in length, and so would the body.
    probe = Message("big", {"x": ""})
    envelope = len(MessageSerializer().serialize(probe))
    limit = driver.capabilities.max_message_bytes
    fill = "y" * (limit - envelope)
    driver.send(Message("big", {"x": fill}, id=probe.id, created=probe.created))

    received = handle_until(driver, 1)

    assert len(received[0][0].payload["x"]) == limit - envelope


def test_send_batch_sends_every_message_in_calls_of_ten(make_driver: MakeDriver) -> None:
    driver = make_driver()
    messages = [Message("n", {"i": i}) for i in range(23)]
    driver.send_batch(messages)

    received = handle_until(driver, 23)

    assert sorted(m.payload["i"] for m, _, _ in received) == list(range(23))


def test_sends_from_many_threads_all_arrive(make_driver: MakeDriver) -> None:
    driver = make_driver()
    errors: list[BaseException] = []

    def emit(thread: int) -> None:
        try:
            for i in range(5):
                driver.send(Message("n", {"id": f"{thread}-{i}"}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=emit, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    received = handle_until(driver, 40)
    assert errors == []
    assert sorted(m.payload["id"] for m, _, _ in received) == sorted(
        f"{t}-{i}" for t in range(8) for i in range(5)
    )


def test_a_driver_created_before_fork_gets_its_own_client_in_the_child(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()
    driver.send(Message("parent"))  # the parent's client now has pooled connections
    parent_client = driver._client.get()

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            child_client = driver._client.get()
            driver.send(Message("child"))
            code = 0 if child_client is not parent_client else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert driver._client.get() is parent_client
    assert sorted(m.type for m, _, _ in handle_until(driver, 2)) == ["child", "parent"]


# Failures and stopping --------------------------------------------------------


def test_a_callback_that_raises_gives_back_its_message_at_once(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()  # visibility timeout 30 s: only a give-back is this fast
    driver.send_batch([Message("n", {"i": i}) for i in range(3)])
    failed: list[str] = []

    def explode(message: Message, priority: int) -> bool:
        failed.append(message.id)
        raise Boom(message.id)

    with pytest.raises(Boom):
        compat.wait(driver, explode)
    received = handle_until(driver, 3, timeout_s=10)

    assert sorted(m.payload["i"] for m, _, _ in received) == [0, 1, 2]
    counts = {m.id: d.receive_count for m, _, d in received if d is not None}
    # Only the failed one was taken before: a worker with one handler takes one at a time.
    assert counts == {m.id: 2 if m.id in failed else 1 for m, _, _ in received}


def test_a_worker_with_one_handler_takes_one_message_at_a_time_and_no_more_than_max_items(
    make_driver: MakeDriver, sqs: Any
) -> None:
    first, second = make_driver(), make_driver()
    first.send_batch([Message("n", {"i": i}) for i in range(5)])
    seen: list[tuple[int, int, int]] = []
    handled_first: Handled = []

    def note(message: Message, priority: int) -> bool:
        seen.append(queue_counts(sqs, first.queue_name))
        handled_first.append((message, priority, current_delivery()))
        return True

    compat.set_max_process_items(first, 2)
    compat.wait(first, note)
    handled_second = handle_until(second, 3, timeout_s=10)

    # Taking more and giving it back would count a receipt against the redrive limit.
    assert [visible for visible, _, _ in seen] == [4, 3]
    assert all(d is not None and d.receive_count == 1 for _, _, d in handled_second)
    assert sorted(m.payload["i"] for m, _, _ in handled_first + handled_second) == list(range(5))
    eventually(lambda: queue_counts(sqs, first.queue_name) == (0, 0, 0), "an empty queue", 15.0)


def test_an_idle_worker_returns_soon_after_shutdown(make_driver: MakeDriver) -> None:
    driver = make_driver()
    stop = threading.Event()
    compat.set_shutdown(driver, StopWhen(stop.is_set, timeout_s=30))
    worker = threading.Thread(target=compat.wait, args=(driver, recorder([])))
    worker.start()
    time.sleep(0.3)  # let it enter its long poll; the result does not depend on it
    stop.set()
    worker.join(timeout=10)
    assert not worker.is_alive()


def test_an_unreachable_endpoint_raises_broker_unavailable_with_the_cause(
    make_driver: MakeDriver, queue_name: str
) -> None:
    driver = make_driver(
        f"sqs://{queue_name}?region=us-east-1&endpoint_url=http%3A%2F%2F127.0.0.1%3A9"
    )
    with pytest.raises(BrokerUnavailableError) as caught:
        driver.send(Message("lost"))
    assert caught.value.__cause__ is not None
    driver.teardown = lambda: None  # type: ignore[method-assign]  # nothing to clean up there


# The consumer ------------------------------------------------------------------------


def test_a_released_message_comes_back_at_once_with_a_higher_receive_count(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()  # visibility timeout 30 s: only the release brings it back this soon
    driver.send(Message("again"))

    with driver.consumer([]) as consumer:
        first = receive_within(consumer)
        consumer.release(first)
        second = receive_within(consumer)
        consumer.ack(second)

    assert MessageSerializer().unserialize(second.body).type == "again"
    assert first.token.delivery.receive_count == 1
    assert second.token.delivery.receive_count == 2
    assert (first.delivery_count, second.delivery_count) == (1, 2)


def test_receive_on_an_idle_queue_returns_none_and_never_long_polls_past_its_timeout(
    make_driver: MakeDriver, sqs_url: str
) -> None:
    driver = make_driver(sqs_url + "&wait_time=20")
    waits: list[int] = []
    driver._client.get().meta.events.register(
        "before-parameter-build.sqs.ReceiveMessage",
        lambda params, **kwargs: waits.append(params["WaitTimeSeconds"]),
    )

    with driver.consumer([]) as consumer:
        for timeout_s in (1.0, 1.0, 0.3):
            started = time.monotonic()
            assert consumer.receive(timeout_s) is None
            assert time.monotonic() - started < timeout_s + 5  # generous: a busy machine

    # A second is the longest SQS wait within a 1 s receive; 0.3 s rounds to a short poll.
    assert waits[1:] == [1, 0]
    assert waits[0] <= 1


def test_close_gives_back_at_once_what_was_received_but_not_handed_out(
    make_driver: MakeDriver, sqs: Any
) -> None:
    driver = make_driver()  # visibility timeout 30 s: only a give-back is this fast
    driver.send_batch([Message("n", {"i": i}) for i in range(3)])

    with driver.consumer([], concurrency=3) as consumer:
        received = receive_within(consumer)
        assert queue_counts(sqs, driver.queue_name) == (0, 3, 0)  # one batch took all three
        consumer.ack(received)

    eventually(lambda: queue_counts(sqs, driver.queue_name) == (2, 0, 0), "two messages back", 10.0)


def test_a_consumer_takes_no_more_messages_than_the_worker_has_handlers(
    make_driver: MakeDriver, sqs: Any
) -> None:
    driver = make_driver()
    driver.send_batch([Message("n", {"i": i}) for i in range(5)])

    with driver.consumer([], concurrency=2) as consumer:
        first = receive_within(consumer)
        assert queue_counts(sqs, driver.queue_name) == (3, 2, 0)
        consumer.ack(first)
        consumer.ack(receive_within(consumer))


def test_close_leaves_a_message_whose_handler_still_runs_hidden(
    make_driver: MakeDriver, sqs: Any
) -> None:
    driver = make_driver()  # visibility timeout 30 s: a give-back would show it at once
    driver.send_batch([Message("n", {"i": i}) for i in range(2)])
    timeouts: list[int] = []
    driver._client.get().meta.events.register(
        "before-parameter-build.sqs.ChangeMessageVisibilityBatch",
        lambda params, **kwargs: timeouts.extend(e["VisibilityTimeout"] for e in params["Entries"]),
    )

    consumer = driver.consumer([], concurrency=2)
    receive_within(consumer)  # its handler is still running when the run ends
    buffered_or_taken = receive_within(consumer)
    consumer.release(buffered_or_taken)  # settled: given back
    consumer.close()  # the grace period ended with ``still_running`` in its handler

    eventually(lambda: queue_counts(sqs, driver.queue_name) == (1, 1, 0), "one back", 10.0)
    assert timeouts == [0]  # only the released one was made visible


def test_the_heartbeat_keeps_buffered_messages_hidden_too(
    make_driver: MakeDriver, sqs_url: str, sqs: Any, queue_name: str
) -> None:
    driver = make_driver(sqs_url + "&visibility_timeout=2")
    driver.send_batch([Message("n", {"i": i}) for i in range(2)])
    seen: list[tuple[int, int, int]] = []

    with driver.consumer([], concurrency=2) as consumer:
        first = receive_within(consumer)
        # A handler of the first runs for more than two visibility timeouts.
        until = time.monotonic() + 5
        while time.monotonic() < until:
            seen.append(queue_counts(sqs, queue_name))
            time.sleep(0.25)
        consumer.ack(first)
        second = receive_within(consumer)
        consumer.ack(second)

    assert set(seen) == {(0, 2, 0)}  # neither the handled one nor the buffered one showed
    assert second.token.delivery.receive_count == 1


def test_a_high_priority_message_does_not_wait_behind_a_buffered_low_priority_batch(
    make_driver: MakeDriver, sqs: Any, queue_name: str
) -> None:
    driver = make_driver()
    driver.setup_priority_queue("high", 200)
    driver.send_batch([Message("low", {"i": i}) for i in range(3)])

    with driver.consumer([], concurrency=3) as consumer:
        consumer.recheck_higher_s = 0  # type: ignore[attr-defined]  # look up before each one
        order = [receive_within(consumer)]
        assert queue_counts(sqs, queue_name) == (0, 3, 0)  # two low ones wait in the buffer
        driver.send(Message("high"), 200)
        for _ in range(4):
            consumer.ack(order[-1])
            if len(order) < 4:
                order.append(receive_within(consumer))

    assert [received.priority for received in order] == [100, 200, 100, 100]


def test_each_handler_thread_sees_the_delivery_of_its_own_message(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()
    driver.send_batch([Message("job", {"n": n}) for n in range(4)])
    seen: dict[int, str] = {}
    lock = threading.Lock()
    both_running = threading.Barrier(2)

    def callback(message: Message, priority: int) -> bool:
        delivery = current_delivery()
        assert delivery is not None
        if message.payload["n"] < 2:
            both_running.wait(30)  # two handlers at once, each on its own thread
        with lock:
            seen[message.payload["n"]] = delivery.message_id
        return True

    compat.set_max_process_items(driver, 4)
    compat.wait(driver, callback, concurrency=2)

    assert sorted(seen) == [0, 1, 2, 3]
    assert len(set(seen.values())) == 4  # each saw its own SQS message
    assert current_delivery() is None  # outside a handler


# The article's cases ------------------------------------------------------------

_DYING_WORKER = """
import sys, time
from hermes.core import compat, connect
driver = connect(sys.argv[1])
def handle(message, priority):
    print("handling", flush=True)
    time.sleep(3600)
    return True
compat.wait(driver, handle)
"""


def test_a_message_of_a_worker_killed_mid_handler_comes_back_with_receive_count_2(
    make_driver: MakeDriver, sqs_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = sqs_url + "&visibility_timeout=2"
    driver = make_driver(url)
    sent = Message("job")
    driver.send(sent)
    with subprocess.Popen(
        [sys.executable, "-c", _DYING_WORKER, url], stdout=subprocess.PIPE, text=True
    ) as worker:
        try:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "handling"
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()

    with caplog.at_level(logging.WARNING, logger="hermes.drivers.sqs"):
        received = handle_until(driver, 1)

    assert [m.id for m, _, _ in received] == [sent.id]
    delivery = received[0][2]
    assert delivery is not None and delivery.receive_count == 2
    assert f"message {delivery.message_id} received 2 times - delivered again" in caplog.text


def _long_handler_run(make_driver: MakeDriver, url: str, *, heartbeat: bool) -> Handled:
    """A handler longer than twice the 3 s visibility timeout, while a rival worker polls.

    Returns what the rival received.
    """
    worker = make_driver(url + f"&visibility_timeout=3&heartbeat={str(heartbeat).lower()}")
    rival = make_driver(url + "&visibility_timeout=3")
    worker.send(Message("slow"))
    rival_got: Handled = []
    finished = threading.Event()

    def slow(message: Message, priority: int) -> bool:
        if heartbeat:
            time.sleep(6.5)  # the scenario itself: more than two visibility timeouts
        else:
            eventually(lambda: rival_got, "the duplicate", 10.0)  # ends as soon as it shows
        return True

    compat.set_shutdown(rival, StopWhen(finished.is_set, timeout_s=30))
    rival_thread = threading.Thread(target=compat.wait, args=(rival, recorder(rival_got)))
    compat.set_max_process_items(worker, 1)
    rival_thread.start()
    try:
        compat.wait(worker, slow)
    finally:
        finished.set()
        rival_thread.join()
    return rival_got


def test_a_long_handler_with_the_heartbeat_is_never_delivered_twice(
    make_driver: MakeDriver, sqs_url: str, sqs: Any, queue_name: str
) -> None:
    assert _long_handler_run(make_driver, sqs_url, heartbeat=True) == []
    assert queue_counts(sqs, queue_name) == (0, 0, 0)


def test_without_the_heartbeat_a_long_handler_is_delivered_twice(
    make_driver: MakeDriver, sqs_url: str
) -> None:
    rival_got = _long_handler_run(make_driver, sqs_url, heartbeat=False)
    assert [m.type for m, _, _ in rival_got] == ["slow"]


def test_a_message_received_max_receive_count_times_ends_in_the_dead_letter_queue(
    make_driver: MakeDriver, sqs_url: str, sqs: Any, queue_name: str
) -> None:
    dead = f"{queue_name}-dlq"
    driver = make_driver(sqs_url + f"&dead_letter_queue={dead}&max_receive_count=2")
    sent = Message("doomed")
    driver.send(sent)
    counts: list[int] = []

    def fail(message: Message, priority: int) -> bool:
        delivery = current_delivery()
        assert delivery is not None
        counts.append(delivery.receive_count)
        raise Boom("handler failed")

    compat.set_shutdown(driver, StopWhen(lambda: queue_counts(sqs, dead)[0] > 0, timeout_s=15))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            compat.wait(driver, fail)
            break
        except Boom:
            continue

    assert counts == [1, 2]
    dead_url = sqs.get_queue_url(QueueName=dead)["QueueUrl"]
    bodies = [m["Body"] for m in sqs.receive_message(QueueUrl=dead_url).get("Messages", [])]
    assert [MessageSerializer().unserialize(b).id for b in bodies] == [sent.id]
    assert queue_counts(sqs, queue_name) == (0, 0, 0)


# Bodies that are not messages ---------------------------------------------------


def test_a_body_that_is_not_a_message_is_logged_and_deleted_without_a_redrive_policy(
    make_driver: MakeDriver, sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    driver = make_driver()
    driver.send_raw(b"not json \xe2\x9c\x93")
    driver.send(Message("good"))

    with caplog.at_level(logging.INFO, logger="hermes"):
        received = handle_until(driver, 1)

    assert [m.type for m, _, _ in received] == ["good"]
    assert "not a Hermes message" in caplog.text  # core's line, with the reason
    assert "Cannot unserialize message from 'not json" in caplog.text
    assert "(received 1 times); no redrive policy keeps it" in caplog.text
    eventually(lambda: queue_counts(sqs, driver.queue_name) == (0, 0, 0), "an empty queue", 15.0)


def test_a_body_that_is_not_a_message_is_left_for_the_redrive_policy(
    make_driver: MakeDriver,
    sqs_url: str,
    sqs: Any,
    queue_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = f"{queue_name}-dlq"
    driver = make_driver(
        sqs_url + f"&dead_letter_queue={dead}&max_receive_count=1&visibility_timeout=2"
    )
    driver.send_raw(b"{not a message")
    driver.send(Message("good"))
    received: Handled = []

    compat.set_shutdown(driver, StopWhen(lambda: queue_counts(sqs, dead)[0] > 0, timeout_s=15))
    with caplog.at_level(logging.INFO, logger="hermes"):
        compat.wait(driver, recorder(received))

    assert [m.type for m, _, _ in received] == ["good"]
    assert "(received 1 times) for the redrive policy" in caplog.text
    dead_url = sqs.get_queue_url(QueueName=dead)["QueueUrl"]
    bodies = [m["Body"] for m in sqs.receive_message(QueueUrl=dead_url).get("Messages", [])]
    assert bodies == ["{not a message"]


def test_put_refuses_bytes_sqs_cannot_carry_before_sending_any(make_driver: MakeDriver) -> None:
    driver = make_driver()
    calls: list[str] = []
    driver._client.get().meta.events.register(
        "before-call.sqs.*", lambda model, **kwargs: calls.append(model.name)
    )
    good = Outgoing(b'{"message": {}}')
    with pytest.raises(DeliveryError, match="not UTF-8"):
        driver.send_raw(b"\xff\xfe")
    with pytest.raises(DeliveryError, match=r"XML 1\.0 characters only"):
        driver.send_raw(b"nul \x00 inside")
    with pytest.raises(DeliveryError, match="not UTF-8"):
        driver.put([good, Outgoing(b"\xff")])
    assert calls == []


# Delay ----------------------------------------------------------------------------


def test_by_default_a_future_execute_at_is_delivered_at_once_and_kept(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()
    execute_at = time.time() + 120
    driver.send(Message("later", execute_at=execute_at))

    received = handle_until(driver, 1)

    assert received[0][0].execute_at == execute_at
    assert time.time() < execute_at


def test_in_delay_mode_a_message_is_held_until_execute_at(
    make_driver: MakeDriver, sqs_url: str
) -> None:
    driver = make_driver(sqs_url + "&delay=true")
    execute_at = time.time() + 2
    driver.send(Message("later", execute_at=execute_at))
    driver.send(Message("now"))
    handled_at: dict[str, float] = {}

    def note(message: Message, priority: int) -> bool:
        handled_at[message.type] = time.time()
        return True

    compat.set_shutdown(driver, StopWhen(lambda: len(handled_at) == 2, timeout_s=15))
    compat.wait(driver, note)

    assert handled_at["now"] < execute_at <= handled_at["later"]


def test_in_delay_mode_a_message_that_arrives_early_is_hidden_again_not_handled(
    make_driver: MakeDriver, sqs_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    driver = make_driver(sqs_url + "&delay=true")
    execute_at = time.time() + 2
    # send_raw skips DelaySeconds: the message arrives early, as after clock skew.
    driver.send_raw(MessageSerializer().serialize(Message("early", execute_at=execute_at)).encode())

    with caplog.at_level(logging.INFO, logger="hermes.drivers.sqs"):
        received = handle_until(driver, 1)

    assert time.time() >= execute_at
    delivery = received[0][2]
    assert delivery is not None and delivery.receive_count == 2
    # Not a worker failure: the second receipt is the one it was held back for.
    (line,) = [r for r in caplog.records if "received 2 times" in r.getMessage()]
    assert line.levelno == logging.INFO and "earlier receipts may have held it back" in line.message


def test_in_delay_mode_a_delay_beyond_15_minutes_is_hidden_on_receipt(
    make_driver: MakeDriver, sqs_url: str, sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    driver = make_driver(sqs_url + "&delay=true")
    far = Message("far", execute_at=time.time() + 3600)
    driver.send_raw(MessageSerializer().serialize(far).encode())
    received: Handled = []

    with caplog.at_level(logging.DEBUG, logger="hermes.drivers.sqs"):
        compat.set_shutdown(driver, StopWhen(lambda: "hid message" in caplog.text, timeout_s=15))
        compat.wait(driver, recorder(received))

    assert received == []
    assert f"hid message #{far.id} again, due in 3" in caplog.text
    assert queue_counts(sqs, driver.queue_name) == (0, 1, 0)


def test_in_delay_mode_send_caps_delay_seconds_at_15_minutes(
    make_driver: MakeDriver, sqs_url: str, sqs: Any
) -> None:
    driver = make_driver(sqs_url + "&delay=true")
    driver.send(Message("far", execute_at=time.time() + 3600))
    assert queue_counts(sqs, driver.queue_name) == (0, 0, 1)


def test_in_delay_mode_holding_back_near_the_redrive_limit_resends_instead(
    make_driver: MakeDriver, sqs_url: str, sqs: Any, queue_name: str
) -> None:
    dead = f"{queue_name}-dlq"
    driver = make_driver(sqs_url + f"&delay=true&dead_letter_queue={dead}&max_receive_count=1")
    execute_at = time.time() + 2
    driver.send_raw(MessageSerializer().serialize(Message("early", execute_at=execute_at)).encode())

    received = handle_until(driver, 1)

    assert time.time() >= execute_at
    delivery = received[0][2]
    assert delivery is not None and delivery.receive_count == 1
    assert queue_counts(sqs, dead) == (0, 0, 0)


# Priorities -----------------------------------------------------------------------


def test_higher_priority_queues_are_read_first(make_driver: MakeDriver, sqs: Any) -> None:
    driver = make_driver()
    driver.setup_priority_queue("high", 200)
    for i in range(3):
        driver.send(Message("low", {"i": i}))
    for i in range(3):
        driver.send(Message("high", {"i": i}), 200)

    received = handle_until(driver, 6)

    assert [m.type for m, _, _ in received] == ["high"] * 3 + ["low"] * 3
    assert [p for _, p, _ in received] == [200] * 3 + [100] * 3
    assert queue_counts(sqs, f"{driver.queue_name}-high") == (0, 0, 0)


def test_a_worker_restricted_to_a_priority_reads_only_that_queue(
    make_driver: MakeDriver, sqs: Any
) -> None:
    driver = make_driver()
    driver.setup_priority_queue("high", 200)
    driver.send(Message("low"))
    driver.send(Message("high"), 200)

    received = handle_until(driver, 1, priorities=[200])

    assert [m.type for m, _, _ in received] == ["high"]
    assert queue_counts(sqs, driver.queue_name) == (1, 0, 0)


def test_an_unknown_priority_is_refused(make_driver: MakeDriver) -> None:
    driver = make_driver()
    with pytest.raises(UnknownPriorityError) as caught:
        driver.send(Message("x"), 300)
    assert caught.value.priority == 300


# Queues ---------------------------------------------------------------------------


def test_an_existing_queue_gets_the_redrive_policy_and_retention_it_lacks(
    make_driver: MakeDriver, sqs_url: str, sqs: Any, queue_name: str
) -> None:
    sqs.create_queue(QueueName=queue_name)
    driver = make_driver(
        sqs_url + f"&dead_letter_queue={queue_name}-dlq&max_receive_count=4&retention=3600"
    )
    driver.send(Message("x"))

    url = sqs.get_queue_url(QueueName=queue_name)["QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    policy = json.loads(attributes["RedrivePolicy"])
    assert str(policy["maxReceiveCount"]) == "4"
    assert policy["deadLetterTargetArn"].endswith(f":{queue_name}-dlq")
    assert attributes["MessageRetentionPeriod"] == "3600"


def test_the_dead_letter_queue_is_looked_up_once_for_every_priority_queue(
    make_driver: MakeDriver, sqs_url: str, sqs: Any, queue_name: str
) -> None:
    dead = f"{queue_name}-dlq"
    driver = make_driver(sqs_url + f"&dead_letter_queue={dead}")
    driver.setup_priority_queue("high", 200)
    driver.setup_priority_queue("low", 50)
    asked: list[str] = []
    driver._client.get().meta.events.register(
        "before-parameter-build.sqs.GetQueueUrl",
        lambda params, **kwargs: asked.append(params["QueueName"]),
    )

    for priority in (100, 200, 50):
        driver.send(Message("x"), priority)

    assert asked.count(dead) == 1
    for name in (queue_name, f"{queue_name}-high", f"{queue_name}-low"):
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
        policy = json.loads(attributes["Attributes"]["RedrivePolicy"])
        assert policy["deadLetterTargetArn"].endswith(f":{dead}")


def test_a_torn_down_driver_creates_its_dead_letter_queue_again(
    make_driver: MakeDriver, sqs_url: str, sqs: Any, queue_name: str
) -> None:
    driver = make_driver(sqs_url + f"&dead_letter_queue={queue_name}-dlq")
    driver.send(Message("x"))
    driver.teardown()

    driver.send(Message("y"))

    assert sqs.get_queue_url(QueueName=f"{queue_name}-dlq")["QueueUrl"]


def test_teardown_deletes_every_queue_of_the_driver(
    make_driver: MakeDriver, sqs_url: str, sqs: Any, queue_name: str
) -> None:
    driver = make_driver(sqs_url + f"&dead_letter_queue={queue_name}-dlq")
    driver.setup_priority_queue("high", 200)
    driver.send(Message("x"))
    driver.send(Message("y"), 200)

    driver.teardown()

    names = [url.rsplit("/", 1)[1] for url in sqs.list_queues().get("QueueUrls", [])]
    assert not {queue_name, f"{queue_name}-high", f"{queue_name}-dlq"} & set(names)


# Counting and purging --------------------------------------------------------------


def calls_to(driver: AmazonSqsDriver, operation: str) -> list[str]:
    """The queue URLs (or names) of every ``operation`` call ``driver`` makes from now on."""
    calls: list[str] = []
    driver._client.get().meta.events.register(
        f"before-parameter-build.sqs.{operation}",
        lambda params, **kwargs: calls.append(params.get("QueueUrl") or params["QueueName"]),
    )
    return calls


def test_stats_count_ready_delayed_and_in_flight_per_queue_highest_first(
    make_driver: MakeDriver, sqs_url: str, queue_name: str
) -> None:
    emitter = make_driver(sqs_url + "&delay=true")
    emitter.setup_priority_queue("high", 200)
    emitter.send_batch([Message("now") for _ in range(4)])
    emitter.send_batch([Message("later", execute_at=time.time() + 600) for _ in range(2)])
    emitter.send(Message("urgent"), 200)
    worker = make_driver(sqs_url + "&delay=true", batch_size=1)
    counter = make_driver(sqs_url + "&delay=true")
    counter.setup_priority_queue("high", 200)
    attribute_calls = calls_to(counter, "GetQueueAttributes")

    with worker.consumer([100]) as consumer:
        held = receive_within(consumer)
        rows = counter.queue_stats()
        consumer.ack(held)

    assert rows == [
        QueueStats(200, f"{queue_name}-high", ready=1, scheduled=0, in_flight=0),
        QueueStats(100, queue_name, ready=3, scheduled=2, in_flight=1),
    ]
    assert len(attribute_calls) == 2  # one call per queue
    assert counter.queue_stats()[1].in_flight == 0  # acknowledged: deleted


def test_stats_of_a_queue_nothing_was_sent_to_are_zero_and_create_no_queue(
    make_driver: MakeDriver, sqs: Any, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    driver = make_driver()
    driver.setup_priority_queue("high", 200)

    with caplog.at_level(logging.WARNING, logger="hermes.drivers.sqs"):
        first = driver.queue_stats()
        second = driver.queue_stats()

    assert (
        first
        == second
        == [
            QueueStats(200, f"{queue_name}-high", ready=0, scheduled=0, in_flight=0),
            QueueStats(100, queue_name, ready=0, scheduled=0, in_flight=0),
        ]
    )
    names = [url.rsplit("/", 1)[1] for url in sqs.list_queues().get("QueueUrls", [])]
    assert not {queue_name, f"{queue_name}-high"} & set(names)
    # Once per queue, not once per refresh of hermes stats --watch.
    assert caplog.text.count(f"SQS queue {queue_name!r} does not exist") == 1


def test_stats_count_the_dead_letter_queue_once_on_the_default_priority_row(
    make_driver: MakeDriver, sqs_url: str, sqs: Any, queue_name: str
) -> None:
    dead = f"{queue_name}-dlq"
    driver = make_driver(sqs_url + f"&dead_letter_queue={dead}")
    driver.setup_priority_queue("high", 200)
    driver.send(Message("x"), 200)
    driver.send(Message("y"))
    dead_url = sqs.get_queue_url(QueueName=dead)["QueueUrl"]
    for n in range(3):
        sqs.send_message(QueueUrl=dead_url, MessageBody=f"dead {n}")
    # Someone looks at one of them (the AWS console receives it): still set aside.
    assert sqs.receive_message(QueueUrl=dead_url, VisibilityTimeout=60).get("Messages")
    counter = make_driver(sqs_url + f"&dead_letter_queue={dead}")
    counter.setup_priority_queue("high", 200)
    attribute_calls = calls_to(counter, "GetQueueAttributes")

    rows = counter.queue_stats()

    assert [(row.priority, row.set_aside) for row in rows] == [(200, None), (100, 3)]
    assert len(attribute_calls) == 3  # two queues, and their dead-letter queue once


def test_stats_say_set_aside_is_unknown_without_a_redrive_policy(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()
    driver.send(Message("x"))
    assert [row.set_aside for row in driver.queue_stats()] == [None]


def test_stats_of_a_redrive_policy_whose_dead_letter_queue_is_gone_say_unknown(
    make_driver: MakeDriver,
    sqs_url: str,
    sqs: Any,
    queue_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = f"{queue_name}-dlq"
    driver = make_driver(sqs_url + f"&dead_letter_queue={dead}")
    driver.send(Message("x"))
    sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=dead)["QueueUrl"])

    with caplog.at_level(logging.WARNING, logger="hermes.drivers.sqs"):
        (row,) = driver.queue_stats()

    assert (row.ready, row.set_aside) == (1, None)
    assert f"SQS queue {dead!r} does not exist" in caplog.text


def test_in_delay_mode_a_message_hidden_until_due_counts_as_in_flight(
    make_driver: MakeDriver, sqs_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    driver = make_driver(sqs_url + "&delay=true")
    far = Message("far", execute_at=time.time() + 3600)
    # As SQS shows it once its 15 minutes of DelaySeconds are over: visible, not due.
    driver.send_raw(MessageSerializer().serialize(far).encode())
    with caplog.at_level(logging.DEBUG, logger="hermes.drivers.sqs"):
        compat.set_shutdown(driver, StopWhen(lambda: "hid message" in caplog.text, timeout_s=15))
        compat.wait(driver, recorder([]))

    (row,) = driver.queue_stats()

    assert (row.ready, row.scheduled, row.in_flight) == (0, 0, 1)


def test_purge_of_one_priority_deletes_only_its_queue_and_counts_exactly(
    make_driver: MakeDriver, sqs: Any, queue_name: str
) -> None:
    driver = make_driver()
    driver.setup_priority_queue("high", 200)
    driver.send_batch([Message("high") for _ in range(23)], 200)
    driver.send_batch([Message("normal") for _ in range(4)])

    assert driver.purge(200) == 23

    assert queue_counts(sqs, f"{queue_name}-high") == (0, 0, 0)
    assert queue_counts(sqs, queue_name) == (4, 0, 0)
    assert driver.purge() == 4
    assert queue_counts(sqs, queue_name) == (0, 0, 0)


def test_purge_of_an_unknown_priority_raises_and_deletes_nothing(
    make_driver: MakeDriver, sqs: Any
) -> None:
    driver = make_driver()
    driver.send(Message("x"))

    with pytest.raises(UnknownPriorityError) as caught:
        driver.purge(300)

    assert caught.value.priority == 300
    assert queue_counts(sqs, driver.queue_name) == (1, 0, 0)


def test_purge_of_a_queue_nothing_was_sent_to_deletes_nothing_and_creates_nothing(
    make_driver: MakeDriver, sqs: Any, queue_name: str
) -> None:
    driver = make_driver()
    creates = calls_to(driver, "CreateQueue")

    assert driver.purge() == 0

    assert creates == []
    names = [url.rsplit("/", 1)[1] for url in sqs.list_queues().get("QueueUrls", [])]
    assert queue_name not in names


def test_purge_leaves_a_message_in_flight_to_its_worker(make_driver: MakeDriver, sqs: Any) -> None:
    driver = make_driver()
    driver.send(Message("held"))
    worker = make_driver(batch_size=1)

    with worker.consumer([]) as consumer:
        held = receive_within(consumer)
        driver.send_batch([Message("waiting") for _ in range(5)])
        assert driver.purge() == 5
        assert queue_counts(sqs, driver.queue_name) == (0, 1, 0)
        consumer.ack(held)

    eventually(lambda: queue_counts(sqs, driver.queue_name) == (0, 0, 0), "the ack's delete")


def test_purge_stops_at_a_receive_that_brings_only_messages_sent_after_it_began(
    make_driver: MakeDriver, sqs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With SQS's clock at 0 every message looks sent after purge() began, as
    # with an emitter sending faster than purge deletes: the first batch ends it.
    monkeypatch.setattr(driver_module, "_server_time_ms", lambda response: 0)
    driver = make_driver()
    driver.send_batch([Message("x") for _ in range(25)])

    deleted = driver.purge()

    assert 1 <= deleted <= 10
    assert queue_counts(sqs, driver.queue_name) == (25 - deleted, 0, 0)


def test_purge_purges_delayed_messages_when_none_are_in_flight_once_a_minute(
    make_driver: MakeDriver, sqs_url: str, sqs: Any
) -> None:
    driver = make_driver(sqs_url + "&delay=true")
    driver.send_batch([Message("now") for _ in range(3)])
    driver.send_batch([Message("later", execute_at=time.time() + 600) for _ in range(2)])

    assert driver.purge() == 5
    assert queue_counts(sqs, driver.queue_name) == (0, 0, 0)

    # SQS (and the local server) allow one PurgeQueue per queue every 60 s.
    driver.send(Message("now"))
    driver.send(Message("later", execute_at=time.time() + 600))
    with pytest.raises(DriverError) as caught:
        driver.purge()

    text = str(caught.value)
    assert text.startswith("deleted 1 waiting message(s), but not all: ")
    assert "still holds about 1 delayed message(s)" in text
    assert "one PurgeQueue per queue every 60 s" in text
    assert queue_counts(sqs, driver.queue_name) == (0, 0, 1)


def test_purge_leaves_delayed_messages_while_some_are_in_flight_and_says_so(
    make_driver: MakeDriver, sqs_url: str, sqs: Any
) -> None:
    driver = make_driver(sqs_url + "&delay=true")
    driver.send(Message("held"))
    worker = make_driver(sqs_url + "&delay=true", batch_size=1)

    with worker.consumer([]) as consumer:
        held = receive_within(consumer)
        driver.send_batch([Message("now") for _ in range(2)])
        driver.send_batch([Message("later", execute_at=time.time() + 600) for _ in range(3)])
        with pytest.raises(DriverError) as caught:
            driver.purge()
        assert queue_counts(sqs, driver.queue_name) == (0, 1, 3)
        consumer.ack(held)

    text = str(caught.value)
    assert text.startswith("deleted 2 waiting message(s), but not all: ")
    assert "about 3 delayed message(s)" in text
    assert "also delete the 1 message(s) in flight (in delay mode" in text
    assert "aws sqs purge-queue --queue-url http" in text


def test_hermes_purge_prints_what_it_deleted_and_what_it_could_not(
    make_driver: MakeDriver, sqs_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    driver = make_driver(sqs_url + "&delay=true")
    driver.send_batch([Message("now") for _ in range(2)])
    driver.send(Message("later", execute_at=time.time() + 600))

    assert main(["purge", "--url", sqs_url + "&delay=true", "--yes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Deleted 3 waiting messages from ")
    assert "AmazonSqsDriver cannot list its queues" in out and out.count("\n") == 1

    driver.send(Message("later", execute_at=time.time() + 600))
    assert main(["purge", "--url", sqs_url + "&delay=true", "--yes"]) != 0
    error = capsys.readouterr().err
    assert error.startswith("hermes: error: broker error: deleted 0 waiting message(s), but not")
    assert "purge again in a minute" in error


# What boto3's errors mean ------------------------------------------------------------


def _client_error(code: str, query_code: str | None = None) -> ClientError:
    error: dict[str, Any] = {"Code": code, "Message": f"{code} happened"}
    if query_code:
        error["QueryErrorCode"] = query_code
    return ClientError({"Error": error}, "ReceiveMessage")


@pytest.mark.parametrize(
    "code",
    [
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "UnrecognizedClientException",
    ],
)
def test_rejected_credentials_or_permissions_mean_the_broker_refused(
    make_driver: MakeDriver, code: str
) -> None:
    assert make_driver().classify_error(_client_error(code)) is BrokerRefusedError


@pytest.mark.parametrize(
    "exc",
    [
        _client_error("ThrottlingException"),
        _client_error("RequestThrottled"),
        _client_error("ServiceUnavailable"),
        EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
    ],
    ids=repr,
)
def test_throttling_and_unreachable_endpoints_mean_the_broker_is_unavailable(
    make_driver: MakeDriver, exc: Exception
) -> None:
    assert make_driver().classify_error(exc) is BrokerUnavailableError


def test_a_missing_queue_is_a_driver_error_and_so_is_an_unknown_code(
    make_driver: MakeDriver,
) -> None:
    driver = make_driver()
    missing = _client_error("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")
    assert driver.classify_error(missing) is DriverError
    assert driver.classify_error(_client_error("SomethingNew")) is DriverError
    assert driver.classify_error(ValueError("not boto3's")) is None


def test_missing_credentials_stop_the_worker_with_the_cause(make_driver: MakeDriver) -> None:
    driver = make_driver()
    with pytest.raises(BrokerRefusedError) as caught:
        with translate_errors(driver, "sending"):
            raise NoCredentialsError()
    assert isinstance(caught.value.__cause__, NoCredentialsError)
