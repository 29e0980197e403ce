"""Fixtures for hermes-core's own tests: memory brokers no other test shares."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from hermes.core import DEFAULT_PRIORITY, Message
from hermes.core.drivertools import MemoryDriver
from hermes.core.spi._consumer import decode

_names = itertools.count()


class RecordingDriver(MemoryDriver):
    """A memory driver that remembers how ``send`` was called.

    ``calls`` holds ``(message, args, kwargs)``: a retry copy sent as
    ``send(copy)`` shows ``args == ()`` and ``kwargs == {}``.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls: list[tuple[Message, tuple[Any, ...], dict[str, Any]]] = []

    def send(self, message: Message, *args: Any, **kwargs: Any) -> None:
        self.calls.append((message, args, kwargs))
        super().send(message, *args, **kwargs)

    @property
    def sent(self) -> list[Message]:
        return [message for message, _, _ in self.calls]


@pytest.fixture
def broker_name() -> str:
    """A memory broker name no other test uses."""
    return f"core-test-{next(_names)}"


@pytest.fixture
def driver(broker_name: str) -> Iterator[MemoryDriver]:
    memory = MemoryDriver(broker_name)
    yield memory
    memory.teardown()


@pytest.fixture
def recording_driver(broker_name: str) -> Iterator[RecordingDriver]:
    recording = RecordingDriver(broker_name)
    yield recording
    recording.teardown()


@pytest.fixture
def hermes_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """``caplog`` capturing the ``hermes`` logger from INFO up."""
    caplog.set_level(logging.INFO, logger="hermes")
    return caplog


class Peek:
    """Looks inside a memory broker without taking anything out."""

    @staticmethod
    def queued(driver: MemoryDriver, priority: int = DEFAULT_PRIORITY) -> list[Message]:
        """The messages waiting on ``priority`` (not the scheduled ones), oldest first."""
        broker = driver._broker
        with broker.condition:
            bodies = list(broker.queues[priority])
        return [decode(body) for body in bodies]

    @staticmethod
    def scheduled(driver: MemoryDriver) -> list[tuple[int, Message]]:
        """``(priority, message)`` of everything held until its ``execute_at``."""
        broker = driver._broker
        with broker.condition:
            entries = sorted(broker.scheduled)
        return [(priority, decode(body)) for _, _, priority, body in entries]

    @staticmethod
    def total(driver: MemoryDriver) -> int:
        """Everything the broker holds: queued, scheduled and set aside."""
        broker = driver._broker
        with broker.condition:
            queued = sum(len(queue) for queue in broker.queues.values())
            return queued + len(broker.scheduled) + len(broker.dead_letters)


@pytest.fixture
def peek() -> type[Peek]:
    return Peek


@pytest.fixture
def core_only_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a ``python -S`` that has hermes-core, its dependencies and no driver.

    ``-S`` skips site-packages; a directory on ``PYTHONPATH`` gets links to
    hermes.core, pluggy, cronsim and hermes-core's metadata (its ``hermes`` entry point
    registers memory://): what ``pip install hermes-core`` alone gives.
    """
    import importlib.metadata
    import os
    from pathlib import Path

    import cronsim
    import pluggy

    import hermes.core

    site = tmp_path_factory.mktemp("core-only-site")
    (site / "hermes").mkdir()
    (site / "hermes" / "core").symlink_to(Path(hermes.core.__file__).parent)
    (site / "pluggy").symlink_to(Path(pluggy.__file__).parent)
    cron = Path(cronsim.__file__)  # hermes-core's other dependency
    if cron.name == "__init__.py":
        (site / "cronsim").symlink_to(cron.parent)
    else:
        (site / cron.name).symlink_to(cron)
    core = importlib.metadata.distribution("hermes-core")
    dist_info = Path(str(core.locate_file(""))) / f"hermes_core-{core.version}.dist-info"
    assert dist_info.is_dir(), dist_info
    (site / dist_info.name).symlink_to(dist_info)
    environ = {k: v for k, v in os.environ.items() if k not in ("HERMES_URL", "PYTHONPATH")}
    environ["PYTHONPATH"] = str(site)
    return environ


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", 'slow: builds or installs things (minutes); deselect with -m "not slow"'
    )
