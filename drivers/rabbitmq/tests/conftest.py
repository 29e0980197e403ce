"""Fixtures for the RabbitMQ driver tests: a fresh queue name per test, cleaned up after."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from hermes_test_support import StopFlag

from hermes.core import Message, connect
from hermes.drivers.rabbitmq import LazyRabbitMqDriver


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "broker_restart: restarts the shared RabbitMQ (rabbitmqctl stop_app/start_app); "
        'deselect with -m "not broker_restart"',
    )


@pytest.fixture
def queue() -> str:
    return f"hermes-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def url(amqp_url: str, queue: str) -> str:
    return f"{amqp_url}?queue={queue}"


@pytest.fixture
def make_driver(url: str) -> Iterator[Callable[..., LazyRabbitMqDriver]]:
    """``make_driver(**options)``: a driver on this test's queue; all are purged afterwards."""
    made: list[LazyRabbitMqDriver] = []

    def make(query: str = "", **options: Any) -> LazyRabbitMqDriver:
        driver = connect(url + ("&" + query if query else ""), **options)
        assert isinstance(driver, LazyRabbitMqDriver)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.purge()
        driver.close()


@pytest.fixture
def raw_channel(amqp_url: str) -> Iterator[Any]:
    """A plain pika channel on the test broker, to look at queues from the outside."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield connection.channel()
    finally:
        connection.close()


class Collector:
    """A callback that records what it got, with the time it got it."""

    def __init__(self) -> None:
        self.got: list[tuple[Message, int, float]] = []
        self.lock = threading.Lock()

    def __call__(self, message: Message, priority: int) -> bool:
        with self.lock:
            self.got.append((message, priority, time.time()))
        return True

    @property
    def payloads(self) -> list[Any]:
        """The ``"v"`` of each payload: tests send ``{"v": value}``."""
        with self.lock:
            return [message.payload["v"] for message, _, _ in self.got]


class Worker:
    """``driver.wait(callback)`` in a thread, stopped on exit.

    An exception of ``wait()`` is raised again on exit, unless it is an
    instance of ``expect``; the test then finds it in :attr:`error`.
    """

    def __init__(
        self,
        driver: LazyRabbitMqDriver,
        callback: Any,
        priorities: tuple[int, ...] = (),
        *,
        expect: type[BaseException] | tuple[type[BaseException], ...] = (),
    ):
        self.driver = driver
        self.stop = StopFlag()
        driver.set_shutdown(self.stop)
        self.expect = expect
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(callback, priorities), daemon=True)

    def _run(self, callback: Any, priorities: tuple[int, ...]) -> None:
        try:
            self.driver.wait(callback, priorities)
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Worker:
        self.thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        self.stop.shutdown()
        self.thread.join(15)
        assert not self.thread.is_alive(), "the worker did not stop within 15 s"
        if self.error is None or isinstance(self.error, self.expect):
            return
        if exc is not None:
            # The test failed first; its own exception goes on, naming this one.
            exc.add_note(f"the worker's wait() also raised {self.error!r}")
            return
        raise AssertionError(f"the worker's wait() raised {self.error!r}") from self.error


@pytest.fixture
def collector() -> Collector:
    """A callback that records every message it is given."""
    return Collector()


@pytest.fixture(name="worker")
def worker_fixture() -> Callable[..., Worker]:
    """``with worker(driver, callback, priorities):`` runs ``driver.wait`` in a thread.

    ``expect=ErrorType`` lets ``wait()`` raise that; the test reads ``.error``.
    """
    return Worker
