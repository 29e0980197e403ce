"""A broker restart under a waiting worker, on a RabbitMQ node of the test's own.

Restarting the machine's node would break every other test run's RabbitMQ
tests on the same machine, so this module starts a node of its own (about
5 s) and restarts that one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import hermes_test_services as services
import pytest
from hermes_test_services import RabbitMqNode

from hermes.core import BrokerUnavailableError, Message
from hermes.drivers.rabbitmq import LazyRabbitMqDriver


@pytest.fixture(scope="module")
def node() -> Iterator[RabbitMqNode]:
    with services.restartable_rabbitmq() as node:
        yield node


@pytest.fixture
def amqp_url(node: RabbitMqNode) -> str:
    """The test's node, in place of the machine's, for the driver fixtures."""
    return node.url


@pytest.mark.broker_restart
def test_a_waiting_worker_reconnects_after_a_broker_restart_and_loses_nothing(
    make_driver: Callable[..., LazyRabbitMqDriver],
    worker: Any,
    eventually: Any,
    caplog: pytest.LogCaptureFixture,
    node: RabbitMqNode,
) -> None:
    sender = make_driver()
    quiet_sender = make_driver()  # sends before and after, never while down
    driver = make_driver()
    handled: list[str] = []
    in_handler = threading.Event()
    release = threading.Event()

    def callback(message: Message, priority: int) -> bool:
        if message.payload["v"] == "in-flight" and not release.is_set():
            in_handler.set()
            release.wait(60)
        handled.append(message.payload["v"])
        return True

    sender.send(Message("t", {"v": "before"}))
    quiet_sender.send(Message("t", {"v": "in-flight"}))
    with caplog.at_level(logging.INFO, logger="hermes"), worker(driver, callback):
        assert in_handler.wait(15), "the worker never started the second message"
        try:
            node.ctl("stop_app")
            release.set()  # its ack cannot reach the broker now
            eventually(
                lambda: "broker unavailable" in caplog.text,
                "the worker to log the lost connection",
                timeout_s=30,
            )
            with pytest.raises(BrokerUnavailableError):
                sender.send(Message("t", {"v": "while-down"}))
        finally:
            release.set()
            node.ctl("start_app")
        services.wait_for_port(urlsplit(node.url).port or 5672, 60, "rabbitmq after start_app")
        eventually(
            lambda: "broker is back" in caplog.text,
            "the worker to reconnect",
            timeout_s=60,
        )
        sender.send(Message("t", {"v": "after"}))
        quiet_sender.send(Message("t", {"v": "after, on a connection the restart closed"}))
        eventually(lambda: len(handled) == 5, "the messages sent after the restart", timeout_s=30)
    assert "the connection had closed" in caplog.text
    # The unacknowledged message came back; the acknowledged one did not.
    assert handled.count("before") == 1
    assert handled.count("in-flight") == 2
    assert "while-down" not in handled
    assert handled[-2:] == ["after", "after, on a connection the restart closed"]
