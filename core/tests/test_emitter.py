"""The Emitter puts a message on the broker and returns."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from hermes.core import DEFAULT_PRIORITY, Emitter, Message, UnknownPriorityError
from hermes.core.driver import Outgoing
from hermes.core.drivertools import MemoryDriver


def test_the_default_priority_is_100() -> None:
    assert DEFAULT_PRIORITY == 100


def test_emit_returns_the_emitter(driver: MemoryDriver) -> None:
    emitter = Emitter(driver)

    assert emitter.emit(Message("job")) is emitter


def test_emit_sends_on_the_default_priority(recording_driver: Any, peek: Any) -> None:
    message = Message("job", {"a": 1})

    Emitter(recording_driver).emit(message)

    assert recording_driver.calls == [(message, (DEFAULT_PRIORITY,), {})]
    assert peek.queued(recording_driver) == [message]


def test_emit_sends_on_the_priority_it_is_given(recording_driver: Any, peek: Any) -> None:
    recording_driver.setup_priority_queue("high", 300)
    message = Message("job")

    Emitter(recording_driver).emit(message, 300)

    assert recording_driver.calls == [(message, (300,), {})]
    assert peek.queued(recording_driver, 300) == [message]


def test_emit_on_an_unknown_priority_raises(driver: MemoryDriver, peek: Any) -> None:
    with pytest.raises(UnknownPriorityError) as caught:
        Emitter(driver).emit(Message("job"), 250)

    assert caught.value.priority == 250
    assert peek.total(driver) == 0


def test_emit_logs_the_message_its_type_priority_and_the_driver(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    message = Message("job")

    Emitter(driver).emit(message)

    assert [(r.name, r.levelno, r.getMessage()) for r in hermes_log.records] == [
        (
            "hermes",
            logging.INFO,
            f"Emitted message #{message.id} (job) priority:100 to {driver!r}",
        )
    ]


def test_emit_logs_to_the_logger_it_is_given(
    driver: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="web")

    Emitter(driver, logging.getLogger("web")).emit(Message("job"))

    assert [r.name for r in caplog.records] == ["web"]


def test_a_failed_send_is_not_logged_as_sent(
    driver: MemoryDriver, hermes_log: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(UnknownPriorityError):
        Emitter(driver).emit(Message("job"), 1)

    assert hermes_log.records == []


class _BatchingDriver(MemoryDriver):
    """A memory driver with send_batch, recording each batch it is given."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.batches: list[list[Message]] = []

    def send_batch(self, messages: Sequence[Message], priority: int = DEFAULT_PRIORITY) -> None:
        self.batches.append(list(messages))
        for message in messages:
            self.send(message, priority)


def test_emit_batch_uses_the_driver_s_send_batch_and_logs_each_message(
    broker_name: str, peek: Any, hermes_log: pytest.LogCaptureFixture
) -> None:
    driver = _BatchingDriver(broker_name)
    messages = [Message("job", {"n": n}) for n in range(3)]

    try:
        Emitter(driver).emit_batch(messages)

        assert driver.batches == [messages]
        assert peek.queued(driver) == messages
        assert [r.getMessage() for r in hermes_log.records] == [
            f"Emitted message #{m.id} (job) priority:100 to {driver!r}" for m in messages
        ]
    finally:
        driver.teardown()


def test_emit_batch_puts_every_message_in_one_call_of_the_driver(
    broker_name: str, peek: Any
) -> None:
    puts: list[int] = []

    class Counting(MemoryDriver):
        def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
            puts.append(len(items))
            super().put(items, priority)

    driver = Counting(broker_name)
    driver.setup_priority_queue("high", 300)
    messages = [Message("job", {"n": n}) for n in range(3)]
    try:
        Emitter(driver).emit_batch(messages, 300)

        assert puts == [3]
        assert peek.queued(driver, 300) == messages
    finally:
        driver.teardown()


# emit_async -------------------------------------------------------------------------


class BlockingSend(MemoryDriver):
    """A driver whose ``send`` blocks until ``release`` is set (10 s at most, then raises)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.entered = threading.Event()
        self.release = threading.Event()

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        self.entered.set()
        if not self.release.wait(10):
            raise TimeoutError("send was never released: the event loop was blocked")
        super().send(message, priority)


def test_emit_async_keeps_the_event_loop_running_while_send_blocks(
    broker_name: str, peek: Any
) -> None:
    driver = BlockingSend(broker_name)
    emitter = Emitter(driver)
    message = Message("job", {"n": 1})

    async def main() -> Emitter:
        emitting = asyncio.create_task(emitter.emit_async(message))
        # Only a coroutine on this very loop releases the send: had emit_async blocked
        # the loop, this would never run and the send would time out instead.
        while not driver.entered.is_set():
            await asyncio.sleep(0.005)
        assert not emitting.done()
        driver.release.set()
        return await emitting

    try:
        assert asyncio.run(main()) is emitter
        assert peek.queued(driver) == [message]
    finally:
        driver.teardown()


def test_emit_async_sends_on_the_priority_it_is_given_and_logs_like_emit(
    recording_driver: Any, hermes_log: pytest.LogCaptureFixture
) -> None:
    recording_driver.setup_priority_queue("high", 300)
    message = Message("job")

    asyncio.run(Emitter(recording_driver).emit_async(message, 300))

    assert recording_driver.calls == [(message, (300,), {})]
    assert f"Emitted message #{message.id} (job) priority:300" in hermes_log.text


def test_emit_async_raises_what_emit_raises(driver: MemoryDriver, peek: Any) -> None:
    with pytest.raises(UnknownPriorityError):
        asyncio.run(Emitter(driver).emit_async(Message("job"), 250))

    assert peek.total(driver) == 0
