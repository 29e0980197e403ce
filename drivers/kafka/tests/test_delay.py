"""``execute_at``: delivered at once by default, held until due with ``delay=true``."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from hermes.core import Message
from hermes.core.driver import Delay
from hermes.drivers.kafka import KafkaDriver

MakeDriver = Callable[..., KafkaDriver]
Handle = Callable[..., Any]
#: Broker and client timestamps may differ by a few milliseconds.
EARLY_S = 0.05


@contextlib.contextmanager
def joined_worker(driver: KafkaDriver, count: int, handle: Handle, received: Any) -> Iterator[None]:
    """A worker thread handling ``count`` messages, the first a "ping" that shows it has joined.

    A group join takes a second or more: a delay sent before it would be due
    before the worker ever saw it.
    """
    worker = threading.Thread(target=handle, args=(driver, count, received))
    worker.start()
    try:
        driver.send(Message("ping"))
        deadline = time.monotonic() + 20
        while not len(received) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(received), "the worker did not join within 20 s"
        yield
    finally:
        worker.join()


def test_by_default_a_future_message_is_delivered_at_once_with_execute_at_kept(
    make_driver: MakeDriver, handle: Handle
) -> None:
    driver = make_driver()
    assert driver.capabilities.delay is Delay.IGNORED
    execute_at = time.time() + 3600
    driver.send(Message("later", execute_at=execute_at))

    received = handle(driver, 1)

    assert [m.execute_at for m in received.messages] == [execute_at]
    assert received.times[0] < execute_at


def test_with_delay_messages_wait_until_due_and_come_in_execute_at_order(
    make_driver: MakeDriver, handle: Handle, received: Any
) -> None:
    # One partition: the messages sit behind each other in the reverse of their order.
    driver = make_driver("&delay=true&partitions=1")
    assert driver.capabilities.delay is Delay.NATIVE
    with joined_worker(driver, 5, handle, received):
        now = time.time()
        for name, delay_s in (("third", 1.5), ("second", 1.0), ("first", 0.5)):
            driver.send(Message(name, execute_at=now + delay_s))
        driver.send(Message("now"))

    assert [m.type for m in received.messages] == ["ping", "now", "first", "second", "third"]
    for message, at in zip(received.messages[2:], received.times[2:], strict=True):
        assert message.execute_at is not None
        assert at >= message.execute_at - EARLY_S


def test_a_full_hold_pauses_the_partition_until_the_held_message_is_due(
    make_driver: MakeDriver, handle: Handle, received: Any
) -> None:
    driver = make_driver("&delay=true&partitions=1&max_held=1")
    with joined_worker(driver, 3, handle, received):
        execute_at = time.time() + 1.0
        driver.send(Message("held", execute_at=execute_at))
        driver.send(Message("behind"))

    # With room for one held record, "behind" is not read until "held" is due.
    assert [m.type for m in received.messages] == ["ping", "held", "behind"]
    assert received.times[2] >= execute_at - EARLY_S


def test_a_held_message_a_worker_leaves_behind_goes_to_the_next_worker_when_due(
    make_driver: MakeDriver, handle: Handle, received: Any
) -> None:
    first = make_driver("&delay=true&partitions=1")
    with joined_worker(first, 2, handle, received):
        execute_at = time.time() + 1.0
        first.send(Message("held", execute_at=execute_at))
        first.send(Message("now"))
    late = handle(make_driver("&delay=true&partitions=1"), 2)

    assert [m.type for m in received.messages] == ["ping", "now"]
    # The commit stopped at the held record, so "now" (behind it) comes again:
    # at-least-once, at the price of a repeat.
    assert sorted(m.type for m in late.messages) == ["held", "now"]
    held_at = dict(zip((m.type for m in late.messages), late.times, strict=True))["held"]
    assert held_at >= execute_at - EARLY_S
