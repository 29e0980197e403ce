"""RedisShutdown: PHP Hermes's shutdown key, integer UNIX timestamp."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from hermes.core import Dispatcher
from hermes.drivers.redis import RedisShutdown


@pytest.fixture
def shutdown(client, namespace):
    return RedisShutdown(client, key=f"{namespace}_shutdown")


def test_no_key_means_no_shutdown(shutdown):
    assert shutdown.should_shutdown(time.time()) is False


def test_shutdown_writes_an_integer_timestamp_as_php_does(shutdown, client, namespace):
    assert shutdown.shutdown(at=1764480002.9) is True
    assert client.get(f"{namespace}_shutdown") == b"1764480002"


def test_a_request_after_the_worker_started_stops_it(shutdown):
    start = time.time() - 10
    shutdown.shutdown()
    assert shutdown.should_shutdown(start) is True


def test_a_request_in_the_same_second_as_the_start_stops_it(shutdown):
    start = int(time.time()) + 0.9
    shutdown.shutdown(at=int(start))
    assert shutdown.should_shutdown(start) is True


def test_a_request_older_than_the_worker_is_ignored(shutdown):
    shutdown.shutdown(at=time.time() - 60)
    assert shutdown.should_shutdown(time.time() - 5) is False


def test_a_request_for_the_future_stops_workers_only_when_it_comes(shutdown):
    start = time.time() - 10
    shutdown.shutdown(at=time.time() + 3600)
    assert shutdown.should_shutdown(start) is False


def test_a_php_written_value_is_read(shutdown, client, namespace):
    client.set(f"{namespace}_shutdown", str(int(time.time())))
    assert shutdown.should_shutdown(time.time() - 5) is True


def test_garbage_in_the_key_is_logged_and_ignored(shutdown, client, namespace, caplog):
    client.set(f"{namespace}_shutdown", "soon")
    assert shutdown.should_shutdown(0) is False
    assert "not a UNIX timestamp" in caplog.text


def test_an_unreachable_redis_is_logged_and_does_not_stop_the_worker(caplog):
    import hermes_test_services

    client = redis.Redis(port=hermes_test_services.free_port(), retry=None)
    shutdown = RedisShutdown(client)
    with caplog.at_level(logging.WARNING, logger="hermes.drivers.redis"):
        assert shutdown.should_shutdown(0) is False
        assert shutdown.should_shutdown(0) is False
    [record] = caplog.records
    assert "cannot read 'hermes_shutdown'" in record.getMessage()
    client.close()


def test_a_dispatcher_with_redis_shutdown_exits_when_asked(driver, shutdown, caplog):
    import threading

    dispatcher = Dispatcher(driver, shutdown=shutdown)
    thread = threading.Thread(target=dispatcher.handle, daemon=True)
    caplog.set_level(logging.INFO, logger="hermes")
    thread.start()
    time.sleep(0.3)  # the worker is idle; the outcome does not depend on this
    # A timestamp that is after the start (whole seconds) and not in the future.
    shutdown.shutdown(at=max(time.time(), driver.start_time))
    thread.join(10)
    assert not thread.is_alive()
    assert "Exiting hermes dispatcher - shutdown" in caplog.text
