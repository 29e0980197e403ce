"""hermes.core.testing: draining a memory:// queue and looking at what waits for later."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from hermes.core import DEFAULT_PRIORITY, Dispatcher, Emitter, Message, SharedFileShutdown
from hermes.core.driver import Consumer, Driver, Outgoing
from hermes.core.drivertools import MemoryDriver
from hermes.core.testing import drain, due, scheduled


def test_drain_handles_every_due_message_and_those_its_handlers_emit(
    driver: MemoryDriver,
) -> None:
    emitter = Emitter(driver)
    handled: list[tuple[str, object]] = []
    dispatcher = Dispatcher(driver)

    @dispatcher.handler("signup")
    def signup(message: Message) -> None:
        handled.append(("signup", message.payload["user"]))
        emitter.emit(Message("send-email", message.payload))

    @dispatcher.handler("send-email")
    def send_email(message: Message) -> None:
        handled.append(("send-email", message.payload["user"]))

    emitter.emit(Message("signup", {"user": "ana"})).emit(Message("signup", {"user": "bo"}))

    stats = drain(dispatcher)

    assert sorted(handled) == [
        ("send-email", "ana"),
        ("send-email", "bo"),
        ("signup", "ana"),
        ("signup", "bo"),
    ]
    assert (stats.received, stats.handled) == (4, 4)
    assert due(driver) == 0


def test_drain_leaves_a_retry_copy_scheduled_where_scheduled_shows_it(
    driver: MemoryDriver,
) -> None:
    dispatcher = Dispatcher(driver)

    @dispatcher.handler("send-email", max_retry=5)
    def send_email(message: Message) -> None:
        raise ConnectionError("mail server down")

    original = Message("send-email", {"to": "ana@example.com"})
    Emitter(driver).emit(original)
    before = time.time()

    stats = drain(dispatcher)

    assert (stats.failed, stats.retried) == (1, 1)
    (retry,) = scheduled(driver)
    assert (retry.id, retry.payload, retry.retries) == (original.id, original.payload, 1)
    assert retry.execute_at is not None and retry.execute_at >= before + 16


def test_drain_returns_at_once_on_an_empty_queue_and_handles_later_emits_next_time(
    driver: MemoryDriver,
) -> None:
    dispatcher = Dispatcher(driver).register_handler("job", lambda message: None)

    assert drain(dispatcher).received == 0

    Emitter(driver).emit(Message("job"))
    assert drain(dispatcher).received == 1


def test_drain_puts_the_dispatcher_s_own_shutdown_back(
    driver: MemoryDriver, tmp_path: Path
) -> None:
    own = SharedFileShutdown(tmp_path / "stop")
    dispatcher = Dispatcher(driver, shutdown=own).register_handler("job", lambda m: None)
    Emitter(driver).emit(Message("job"))

    drain(dispatcher)

    assert dispatcher.shutdown is own


def test_drain_gives_up_at_its_deadline_when_handlers_keep_emitting(driver: MemoryDriver) -> None:
    emitter = Emitter(driver)
    dispatcher = Dispatcher(driver)

    @dispatcher.handler("echo")
    def echo(message: Message) -> None:
        emitter.emit(Message("echo"))

    emitter.emit(Message("echo"))

    with pytest.raises(TimeoutError, match=r"1 message\(s\) still due after 0.3 s"):
        drain(dispatcher, timeout_s=0.3)


def test_due_counts_every_priority_and_messages_whose_time_has_come(
    driver: MemoryDriver,
) -> None:
    driver.setup_priority_queue("high", 300)
    emitter = Emitter(driver)
    emitter.emit(Message("a")).emit(Message("b"), 300)
    emitter.emit(Message("later", execute_at=time.time() + 3600))

    assert due(driver) == 2
    assert [m.type for m in scheduled(driver)] == ["later"]


class Elsewhere(Driver):
    """Any driver but the memory one."""

    capabilities = MemoryDriver.capabilities

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        raise AssertionError("not used")

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        raise AssertionError("not used")


def test_the_helpers_refuse_a_driver_that_is_not_memory() -> None:
    with pytest.raises(TypeError, match=r"drain\(\) needs a memory:// driver, not <Elsewhere>"):
        drain(Dispatcher(Elsewhere()))
    with pytest.raises(TypeError, match=r"scheduled\(\) needs a memory:// driver"):
        scheduled(Elsewhere())
    with pytest.raises(TypeError, match=r"due\(\) needs a memory:// driver"):
        due(Elsewhere())
