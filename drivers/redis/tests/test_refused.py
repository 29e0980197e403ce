"""A Redis that refuses this client: one line naming the fix, no retrying, ``hermes`` exits 2.

Uses a redis-server of its own with a password (and an ACL user with narrow
rights): the shared one on 6379 has none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hermes_test_support import refused_worker_line

from hermes.core import BrokerRefusedError, BrokerUnavailableError, Message, Worker, connect

PASSWORD = "secret"


@pytest.fixture(scope="module")
def port(redis_server: Any) -> Iterator[int]:
    """The port of a redis-server that wants ``PASSWORD``, with an ACL user ``narrow``."""
    import hermes_test_services

    port = hermes_test_services.free_port()
    with redis_server(port, "--requirepass", PASSWORD):
        admin = redis.Redis(port=port, password=PASSWORD)
        # May touch keys under other:* only, so every Hermes key is out of bounds.
        admin.acl_setuser("narrow", enabled=True, passwords=["+narrow"], keys=["other:*"])
        admin.execute_command("ACL", "SETUSER", "narrow", "+@all")
        admin.close()
        yield port


def refused_send(url: str) -> BrokerRefusedError:
    driver = connect(url)
    try:
        with pytest.raises(BrokerRefusedError) as info:
            driver.send(Message("x"))
    finally:
        driver.close()
    text = str(info.value)
    assert "\n" not in text and PASSWORD not in text
    return info.value


def test_a_wrong_password_refuses_a_send_and_names_the_urls_password(port):
    error = refused_send(f"redis://:wrong@127.0.0.1:{port}/0")
    assert "refused while sending" in str(error)
    assert "password in the URL" in str(error)
    assert isinstance(error.__cause__, redis.AuthenticationError)
    assert not isinstance(error, BrokerUnavailableError)


def test_no_password_for_a_server_that_wants_one_is_refused_too(port):
    error = refused_send(f"redis://127.0.0.1:{port}/0")
    assert "password in the URL" in str(error)


def test_an_acl_user_without_rights_on_the_keys_is_refused_naming_its_acl(port):
    error = refused_send(f"redis://narrow:narrow@127.0.0.1:{port}/0")
    assert "ACL" in str(error)


def test_a_database_the_server_does_not_have_is_refused_naming_the_path(port):
    error = refused_send(f"redis://:{PASSWORD}@127.0.0.1:{port}/99")
    assert "database number" in str(error)


@pytest.mark.parametrize("delivery", ["at-most-once", "at-least-once"])
def test_a_worker_with_a_wrong_password_stops_at_once_instead_of_retrying(port, delivery):
    driver = connect(f"redis://:wrong@127.0.0.1:{port}/0?delivery={delivery}")
    worker = Worker(driver, lambda message, priority: True, handle_signals=False)
    with pytest.raises(BrokerRefusedError, match="password in the URL"):
        worker.run()
    driver.close()


def test_the_right_password_works(port):
    driver = connect(f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    driver.send(Message("x"))
    driver.teardown()
    driver.close()


def test_hermes_worker_with_a_wrong_password_exits_2_with_one_line(port, tmp_path):
    # The worker's start-up INFO lines come first; the mistake itself is one line.
    line = refused_worker_line(f"redis://:wrong@127.0.0.1:{port}/0", tmp_path, never=["wrong"])
    assert "password in the URL" in line, line


@pytest.mark.parametrize(
    "reply",
    [
        "Error running script (call to f_1): @user_script:1: NOPERM this user has no "
        "permissions to run the 'spop' command",
        "NOAUTH Authentication required.",
    ],
)
def test_a_refusal_inside_a_plain_response_error_is_read_from_its_text(reply):
    driver = connect("redis://127.0.0.1:1/0")
    assert issubclass(driver.classify_error(redis.ResponseError(reply)), BrokerRefusedError)
    assert driver.classify_error(redis.ResponseError("WRONGTYPE Operation")) is not None
    assert not issubclass(
        driver.classify_error(redis.ResponseError("WRONGTYPE Operation")), BrokerRefusedError
    )
    driver.close()
