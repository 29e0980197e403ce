"""RedisShutdown: PHP Hermes's shutdown key, integer UNIX timestamp."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from hermes.core import Dispatcher, Worker
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
    thread = threading.Thread(target=Worker(driver, dispatcher).run, daemon=True)
    caplog.set_level(logging.INFO, logger="hermes")
    thread.start()
    time.sleep(0.3)  # the worker is idle; the outcome does not depend on this
    # Now: after the run started (whole seconds) and not in the future.
    shutdown.shutdown()
    thread.join(10)
    assert not thread.is_alive()
    assert "Exiting hermes dispatcher - shutdown" in caplog.text


class CountingClient:
    """A client that counts GETs, answering from a dict."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.gets = 0

    def get(self, key):
        self.gets += 1
        return self.values.get(key)

    def set(self, key, value):
        self.values[key] = str(value).encode()


def test_a_busy_worker_reads_the_key_once_per_interval_not_once_per_check():
    client = CountingClient()
    shutdown = RedisShutdown(client, check_interval_s=3600)

    for _ in range(1000):
        assert shutdown.should_shutdown(time.time()) is False

    assert client.gets == 1


def test_a_check_interval_of_zero_reads_at_every_check():
    client = CountingClient()
    shutdown = RedisShutdown(client, check_interval_s=0)

    for _ in range(3):
        shutdown.should_shutdown(time.time())

    assert client.gets == 3


def test_a_request_from_elsewhere_is_seen_within_the_check_interval(client, namespace, eventually):
    watched = RedisShutdown(client, key=f"{namespace}_shutdown")
    start = time.time() - 10
    assert watched.should_shutdown(start) is False

    RedisShutdown(client, key=f"{namespace}_shutdown").shutdown()

    eventually(lambda: watched.should_shutdown(start), "the request", timeout_s=2.0)


def test_its_own_request_is_seen_at_once_whatever_the_interval(client, namespace):
    shutdown = RedisShutdown(client, key=f"{namespace}_shutdown", check_interval_s=3600)
    start = time.time() - 10
    assert shutdown.should_shutdown(start) is False

    shutdown.shutdown()

    assert shutdown.should_shutdown(start) is True


def test_a_future_request_read_once_stops_the_worker_when_it_comes():
    client = CountingClient()
    shutdown = RedisShutdown(client, check_interval_s=3600)
    start = time.time() - 10
    client.set("hermes_shutdown", int(time.time()) + 1)

    assert shutdown.should_shutdown(start) is False
    deadline = time.monotonic() + 5
    while not shutdown.should_shutdown(start) and time.monotonic() < deadline:
        time.sleep(0.05)

    assert shutdown.should_shutdown(start) is True
    assert client.gets == 1


def test_the_same_garbage_is_logged_once(caplog):
    client = CountingClient()
    client.values["hermes_shutdown"] = b"soon"
    shutdown = RedisShutdown(client, check_interval_s=0)

    for _ in range(3):
        assert shutdown.should_shutdown(0) is False

    assert caplog.text.count("not a UNIX timestamp") == 1


@pytest.mark.parametrize("interval", [-1, True, float("nan")])
def test_a_check_interval_that_is_not_seconds_is_refused(interval):
    with pytest.raises(ValueError, match="check_interval_s must be a number of seconds"):
        RedisShutdown(CountingClient(), check_interval_s=interval)


# hermes shutdown and hermes worker on a shared Redis, apps apart by prefix ----------------


def test_hermes_shutdown_with_a_prefix_stops_only_the_workers_of_that_prefix(
    redis_url, client, namespace
):
    from hermes.core import connect
    from hermes.core.cli import main

    app1, app2 = f"{namespace}-app1:", f"{namespace}-app2:"
    base = redis_url.rsplit("/", 1)[0] + "/0"
    started = time.time() - 10

    assert main(["shutdown", "--url", f"{base}?prefix={app1}"]) == 0

    with connect(f"{base}?prefix={app1}") as one, connect(f"{base}?prefix={app2}") as two:
        from hermes.drivers.redis._plugin import _shutdown

        assert _shutdown(one).should_shutdown(started) is True
        assert _shutdown(two).should_shutdown(started) is False
    assert client.get(f"{app1}hermes_shutdown") is not None
    assert client.get(f"{app2}hermes_shutdown") is None


def test_without_a_prefix_the_shutdown_key_is_php_s_own(redis_url):
    from hermes.core import connect
    from hermes.drivers.redis._plugin import _shutdown

    with connect(redis_url) as driver:
        assert _shutdown(driver).key == "hermes_shutdown"
