"""Unique jobs: ``Emitter.emit(message, unique_for=s)`` emits once per key within the window."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time

import pytest

from hermes.core import DeliveryError, Emitter, Message, NotSupportedError, SerializeError
from hermes.core.spi._memory import MemoryDriver

_names = itertools.count()


@pytest.fixture
def memory() -> MemoryDriver:
    driver = MemoryDriver(f"unique-test-{next(_names)}")
    yield driver  # type: ignore[misc]
    driver.teardown()


def waiting(driver: MemoryDriver) -> int:
    with driver._broker.condition:
        return sum(len(queue) for queue in driver._broker.queues.values())


def test_a_hundred_threads_emitting_one_key_at_once_produce_one_message(
    memory: MemoryDriver,
) -> None:
    emitter = Emitter(memory)
    barrier = threading.Barrier(100)
    results: list[bool] = []

    def emit() -> None:
        barrier.wait()
        results.append(emitter.emit(Message("sync", {"user": 7}), unique_for=60, unique_key="u7"))

    threads = [threading.Thread(target=emit) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 99 + [True]
    assert waiting(memory) == 1


def test_a_duplicate_is_skipped_with_an_info_line_not_an_error(
    memory: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hermes")
    message = Message("sync", None)
    assert Emitter(memory).emit(message, unique_for=60) is True
    assert Emitter(memory).emit(message, unique_for=60) is False
    skipped = [r for r in caplog.records if r.getMessage().startswith("Skipped")]
    assert [r.levelno for r in skipped] == [logging.INFO]
    assert f"unique:sync:{message.id}" in skipped[0].getMessage()
    assert waiting(memory) == 1


def test_the_key_can_be_emitted_again_once_its_window_is_over(memory: MemoryDriver) -> None:
    emitter = Emitter(memory)
    assert emitter.emit(Message("sync"), unique_for=0.2, unique_key="k")
    assert not emitter.emit(Message("sync"), unique_for=0.2, unique_key="k")
    time.sleep(0.25)
    assert emitter.emit(Message("sync"), unique_for=0.2, unique_key="k")
    assert waiting(memory) == 2


def test_keys_of_two_types_do_not_collide(memory: MemoryDriver) -> None:
    emitter = Emitter(memory)
    assert emitter.emit(Message("a"), unique_for=60, unique_key="k")
    assert emitter.emit(Message("b"), unique_for=60, unique_key="k")


def test_a_plain_emit_still_returns_the_emitter(memory: MemoryDriver) -> None:
    emitter = Emitter(memory)
    assert emitter.emit(Message("a")).emit(Message("b")) is emitter


def test_a_driver_without_claims_says_what_to_use(memory: MemoryDriver) -> None:
    class NoClaims(MemoryDriver):
        claim = None  # type: ignore[assignment]

    with pytest.raises(NotSupportedError, match="cannot claim keys"):
        Emitter(NoClaims(memory.name)).emit(Message("a"), unique_for=60)
    assert waiting(memory) == 0


def test_a_unique_emit_that_cannot_be_serialized_leaves_its_key_free(memory: MemoryDriver) -> None:
    emitter = Emitter(memory)
    with pytest.raises(SerializeError):
        emitter.emit(Message("sync", {"at": object()}), unique_for=60, unique_key="k")
    assert emitter.emit(Message("sync", {"at": 1}), unique_for=60, unique_key="k") is True
    assert waiting(memory) == 1


def test_a_unique_emit_refused_for_its_size_leaves_its_key_free(memory: MemoryDriver) -> None:
    class Small(MemoryDriver):
        capabilities = dataclasses.replace(MemoryDriver.capabilities, max_message_bytes=1000)

    small = Small(memory.name)
    emitter = Emitter(small)
    with pytest.raises(DeliveryError, match="max_message_bytes"):
        emitter.emit(Message("sync", {"blob": "x" * 2000}), unique_for=60, unique_key="k")
    assert emitter.emit(Message("sync", {"blob": "x"}), unique_for=60, unique_key="k") is True
    assert waiting(memory) == 1
