"""Helpers for the filesystem driver's tests: a queue in ``tmp_path`` and a bounded worker."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hermes_test_support import StopWhen

from hermes.core import Message, compat
from hermes.drivers.filesystem import FileSystemDriver


@dataclass
class Received:
    """What a test worker's callback saw, in order."""

    messages: list[Message] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    #: ``time.time()`` of each callback.
    times: list[float] = field(default_factory=list)

    @property
    def types(self) -> list[str]:
        return [m.type for m in self.messages]

    def callback(self, message: Message, priority: int) -> bool:
        self.messages.append(message)
        self.priorities.append(priority)
        self.times.append(time.time())
        return True


def _receive(
    driver: FileSystemDriver,
    count: int,
    priorities: Sequence[int] = (),
    deadline_s: float = 10.0,
    callback: Callable[[Message, int], bool] | None = None,
) -> Received:
    """Run ``driver.wait`` until ``count`` messages were handled (or the deadline passed)."""
    received = Received()

    def record(message: Message, priority: int) -> bool:
        received.callback(message, priority)
        return callback(message, priority) if callback is not None else True

    compat.set_max_process_items(driver, count)  # counted per wait() call
    compat.set_shutdown(driver, StopWhen(timeout_s=deadline_s))
    compat.wait(driver, record, priorities)
    return received


@pytest.fixture
def queue_dir(tmp_path: Path) -> Path:
    return tmp_path / "queue"


@pytest.fixture
def driver(queue_dir: Path) -> FileSystemDriver:
    return FileSystemDriver(queue_dir, fsync=False)


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


@pytest.fixture
def receive() -> Callable[..., Received]:
    """``receive(driver, count, priorities=(), deadline_s=10, callback=None)``: run a worker
    until it handled ``count`` messages or the deadline passed; what it saw."""
    return _receive


@pytest.fixture
def files() -> Callable[[Path], list[str]]:
    """``files(directory)``: the names in it, sorted; empty when it does not exist."""
    return _files
