"""redis:// and rediss:// URLs: options, errors that say how to fix them, isolation."""

from __future__ import annotations

import pytest
import redis

from hermes.core import ConfigurationError, Message, available_drivers, compat, connect
from hermes.core.driver import Delay, Delivery, DriverUrl
from hermes.core.drivertools import isolated_url
from hermes.drivers.redis import RedisSetDriver, RedisShutdown


def test_the_plugin_registers_its_schemes_with_the_drivers_capabilities():
    [plugin] = [d for d in available_drivers() if d.name == "redis"]
    assert plugin.schemes == ("redis", "rediss", "redis+sentinel", "rediss+sentinel")
    assert plugin.capabilities.delivery is Delivery.AT_MOST_ONCE
    assert plugin.capabilities.delay is Delay.NATIVE
    assert plugin.capabilities.priorities and plugin.capabilities.competing_consumers
    assert plugin.distribution == "hermes-redis"


def test_the_plugin_builds_php_s_redis_shutdown_on_the_driver_s_own_client():
    [plugin] = [d for d in available_drivers() if d.name == "redis"]
    driver = connect("redis://127.0.0.1:6390/3")
    assert plugin.shutdown is not None

    shutdown = plugin.shutdown(driver)

    assert isinstance(shutdown, RedisShutdown)
    assert shutdown.client is driver.client
    assert shutdown.key == "hermes_shutdown"
    driver.close()
    with pytest.raises(ConfigurationError, match="not a Redis driver"):
        plugin.shutdown(connect("memory://not-redis"))


def test_a_url_sets_host_port_database_and_the_driver_options():
    driver = connect("redis://127.0.0.1:6390/3?key=jobs&schedule_key=jobs_at&refresh_interval=0.25")
    assert isinstance(driver, RedisSetDriver)
    kwargs = driver.client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("127.0.0.1", 6390, 3)
    assert (driver.key, driver.schedule_key, driver.refresh_interval) == ("jobs", "jobs_at", 0.25)
    driver.close()
    driver = connect("redis://127.0.0.1:6390/3?prefix=app:")
    assert (driver.key, driver.schedule_key) == ("app:hermes", "app:hermes_schedule")
    driver.close()


def test_a_url_without_options_uses_the_php_defaults():
    driver = connect("redis://localhost")
    kwargs = driver.client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("localhost", 6379, 0)
    assert (driver.key, driver.schedule_key, driver.refresh_interval) == (
        "hermes",
        "hermes_schedule",
        1.0,
    )
    driver.close()


def test_rediss_turns_tls_on_and_takes_tls_options():
    driver = connect("rediss://cache.example:6380/0?ssl_cert_reqs=none")
    kwargs = driver.client.connection_pool.connection_kwargs
    assert kwargs["ssl_cert_reqs"] == "none"
    assert repr(driver).startswith("<RedisSetDriver rediss://cache.example:6380/0")
    driver.close()


def test_tls_options_on_plain_redis_are_refused():
    with pytest.raises(ConfigurationError, match="needs TLS: use rediss://"):
        connect("redis://localhost/0?ssl_cert_reqs=none")


def test_the_password_never_shows_in_repr_or_errors():
    driver = connect("redis://user:s3cret@127.0.0.1:6379/0")
    assert driver.client.connection_pool.connection_kwargs["password"] == "s3cret"
    assert "s3cret" not in repr(driver)
    driver.close()
    with pytest.raises(ConfigurationError) as info:
        connect("redis://user:s3cret@127.0.0.1:6379/0?colour=blue")
    assert "s3cret" not in str(info.value)
    assert "colour" in str(info.value) and "refresh_interval" in str(info.value)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis://localhost/zero", "must be a database number"),
        ("redis://localhost/0?refresh_interval=0", "refresh_interval"),
        ("redis://localhost/0?refresh_interval=soon", "refresh_interval"),
        ("redis://localhost/0?key=", "key must be a non-empty string"),
        ("redis://localhost/0?key=a&schedule_key=a", "must differ"),
        ("redis://h1:6379,h2:6380/0", "lists 2 hosts, but the Redis driver talks to one server"),
    ],
)
def test_a_bad_url_fails_at_connect_naming_the_problem(url, complaint):
    with pytest.raises(ConfigurationError, match=complaint):
        connect(url)


def test_a_client_passed_to_connect_is_used_and_left_open(redis_url):
    client = redis.Redis.from_url(redis_url)
    driver = connect(redis_url + "?key=given", client=client)
    assert driver.client is client
    driver.close()
    assert client.ping()
    client.close()


def test_an_unknown_keyword_option_is_refused():
    with pytest.raises(ConfigurationError, match="client="):
        connect("redis://localhost/0", pool="big")


def test_isolated_urls_address_disjoint_keys_on_the_same_redis(redis_url, client):
    one = connect(isolated_url(redis_url, "hermes-test-iso-a"))
    two = connect(isolated_url(redis_url, "hermes-test-iso-b"))
    try:
        assert (one.key, one.schedule_key) == (
            "hermes-test-iso-a:hermes",
            "hermes-test-iso-a:hermes_schedule",
        )
        for driver in (one, two):
            driver.setup_priority_queue("high", 200)  # the same name in both namespaces
        one.send(Message("mine"))
        one.send(Message("mine-high"), 200)
        two.send(Message("theirs"))
        compat.set_max_process_items(two, 1)
        handled: list[str] = []
        compat.wait(two, lambda message, priority: handled.append(message.type) is None)
        assert handled == ["theirs"]
        assert client.scard("hermes-test-iso-a:hermes") == 1
        assert client.scard("hermes-test-iso-a:high") == 1
        assert client.exists("hermes-test-iso-b:high", "high") == 0
    finally:
        one.teardown()
        two.teardown()
        one.close()
        two.close()


def test_isolation_keeps_the_other_url_parts_and_nests_a_prefix(redis_url):
    url = DriverUrl.parse("redis://u:p@127.0.0.1:6379/2?refresh_interval=0.5&prefix=app:")
    isolated = DriverUrl.parse(isolated_url(url.raw, "ns"))
    assert (isolated.host, isolated.port, isolated.path, isolated.password) == (
        "127.0.0.1",
        6379,
        "2",
        "p",
    )
    assert dict(isolated.options) == {"refresh_interval": "0.5", "prefix": "app:ns:"}
