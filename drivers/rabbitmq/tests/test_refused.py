"""A broker that refuses this client: the worker stops, saying what to fix, and never retries."""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hermes_test_support import refused_worker_line
from pika import exceptions as pika_exc

from hermes.core import BrokerRefusedError, Message, Worker, connect
from hermes.core.spi._door import translate_errors

#: Long enough for a refusal that takes milliseconds, on a slow shared machine.
GENEROUS_S = 20.0


def _broker(amqp_url: str) -> str:
    parts = urlsplit(amqp_url)
    return f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}"


@pytest.fixture
def wrong_password_url(amqp_url: str) -> str:
    return f"amqp://guest:wrong@{_broker(amqp_url)}/?queue=hermes-refused"


@pytest.fixture
def missing_vhost_url(amqp_url: str) -> str:
    return f"amqp://guest:guest@{_broker(amqp_url)}/no-such-vhost-{uuid.uuid4().hex[:8]}?queue=x"


def test_a_worker_with_a_wrong_password_raises_broker_refused_naming_the_fix_at_once(
    wrong_password_url: str,
) -> None:
    driver = connect(wrong_password_url)
    with pytest.raises(BrokerRefusedError) as info:
        Worker(driver, lambda message, priority: True, handle_signals=False).run()
    text = str(info.value)
    assert "\n" not in text
    assert "check the user name and password" in text
    assert "wrong" not in text  # the password is never shown
    assert isinstance(info.value.__cause__, pika_exc.ProbableAuthenticationError)


def test_a_send_with_a_wrong_password_raises_broker_refused(wrong_password_url: str) -> None:
    with pytest.raises(BrokerRefusedError, match="check the user name and password"):
        connect(wrong_password_url).send(Message("t"))


def test_a_vhost_that_does_not_exist_is_refused_naming_it_and_how_to_create_it(
    missing_vhost_url: str,
) -> None:
    driver = connect(missing_vhost_url)
    with driver.consumer(()) as consumer, pytest.raises(BrokerRefusedError) as info:
        with translate_errors(driver, "receiving"):  # as core's worker does
            consumer.receive(0.5)
    text = str(info.value)
    assert "\n" not in text
    assert "no-such-vhost-" in text
    assert "rabbitmqctl add_vhost" in text
    assert isinstance(info.value.__cause__, pika_exc.ProbableAccessDeniedError)


def test_a_403_on_a_channel_is_refused_and_a_lost_channel_is_unavailable() -> None:
    from hermes.core import BrokerUnavailableError

    driver = connect("amqp://guest:guest@127.0.0.1:1/?queue=x")
    denied = pika_exc.ChannelClosedByBroker(403, "ACCESS_REFUSED - access to queue 'x' refused")
    assert driver.classify_error(denied) is BrokerRefusedError
    deleted = pika_exc.ChannelClosedByBroker(404, "NOT_FOUND - no queue 'x'")
    assert driver.classify_error(deleted) is BrokerUnavailableError
    assert driver.classify_error(pika_exc.ConsumerCancelled()) is BrokerUnavailableError
    assert driver.classify_error(pika_exc.StreamLostError("EOF")) is BrokerUnavailableError


def test_hermes_worker_with_a_wrong_password_exits_2_with_one_line_and_no_traceback(
    wrong_password_url: str, tmp_path: Path
) -> None:
    # The worker's start-up lines may come first; the refusal is said once, on one line.
    line = refused_worker_line(wrong_password_url, tmp_path, never=["guest:wrong"])
    assert "check the user name and password" in line, line
