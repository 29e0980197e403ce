"""Fixtures for the RabbitMQ driver tests: a fresh queue name per test, cleaned up after."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pika
import pytest
from hermes_test_support import StopFlag

from hermes.core import Message, compat, connect
from hermes.drivers.rabbitmq import LazyRabbitMqDriver


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "broker_restart: restarts a RabbitMQ node of the test's own (stop_app, start_app); "
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
        driver.teardown()
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
        compat.set_shutdown(driver, self.stop)
        self.expect = expect
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(callback, priorities), daemon=True)

    def _run(self, callback: Any, priorities: tuple[int, ...]) -> None:
        try:
            compat.wait(self.driver, callback, priorities)
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


class BrokerLink:
    """A TCP proxy in front of RabbitMQ that a test can cut: a broker restart, for one client.

    :meth:`cut` drops every connection through it and turns new ones away
    until :meth:`restore`; the shared broker itself is never touched.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = threading.Event()
        self.up.set()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if not self.up.is_set():
                client.close()  # the broker is "down": refused at once
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up.clear()
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for end in sockets:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def broker_link(amqp_url: str) -> Iterator[BrokerLink]:
    """A :class:`BrokerLink` to the test broker; ``link_url`` is the URL through it."""
    parts = urlsplit(amqp_url)
    link = BrokerLink(parts.hostname or "127.0.0.1", parts.port or 5672)
    try:
        yield link
    finally:
        link.close()


@pytest.fixture
def link_url(broker_link: BrokerLink, amqp_url: str, queue: str) -> str:
    """This test's queue, reached through ``broker_link``."""
    parts = urlsplit(amqp_url)
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{broker_link.port}"
    return parts._replace(netloc=netloc, query=f"queue={queue}").geturl()
