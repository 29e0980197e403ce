"""URLs to drivers: every option, the queue arguments, isolation. No broker needed."""

from __future__ import annotations

import pika
import pytest

from hermes.core import ConfigurationError, available_drivers, connect
from hermes.core.driver import Delay, DriverUrl
from hermes.core.drivertools import isolated_url
from hermes.drivers.rabbitmq import LazyRabbitMqDriver
from hermes.drivers.rabbitmq._plugin import keyword_options


def test_the_plugin_registers_amqp_and_amqps() -> None:
    (plugin,) = [d for d in available_drivers() if d.name == "rabbitmq"]
    assert plugin.schemes == ("amqp", "amqps")
    assert plugin.capabilities.delay is Delay.IGNORED


def test_a_url_sets_every_scalar_option() -> None:
    driver = connect(
        "amqp://u:p@rabbit.example:5673/jobs-vhost?queue=jobs&prefetch=20&refresh_interval=0.25"
        "&consumer_tag=w1&durable=false&confirm=false&delay=true"
        "&heartbeat=600&blocked_connection_timeout=30"
    )
    assert isinstance(driver, LazyRabbitMqDriver)
    assert (driver.queue, driver.prefetch, driver.refresh_interval) == ("jobs", 20, 0.25)
    assert (driver.consumer_tag, driver.durable, driver.confirm) == ("w1", False, False)
    assert driver.delay and driver.capabilities.delay is Delay.NATIVE
    assert driver.message_properties.delivery_mode == 1
    parameters = driver.parameters
    assert (parameters.host, parameters.port, parameters.virtual_host) == (
        "rabbit.example",
        5673,
        "jobs-vhost",
    )
    assert parameters.credentials.username == "u"
    assert parameters.heartbeat == 600 and parameters.blocked_connection_timeout == 30


def test_defaults_are_durable_confirmed_prefetch_one_and_queue_hermes() -> None:
    driver = connect("amqp://localhost")
    assert isinstance(driver, LazyRabbitMqDriver)
    assert (driver.queue, driver.prefetch, driver.durable, driver.confirm) == (
        "hermes",
        1,
        True,
        True,
    )
    assert driver.parameters.virtual_host == "/"
    assert driver.message_properties.delivery_mode == 2
    assert driver.capabilities.delay is Delay.IGNORED


def test_amqps_uses_tls_on_port_5671() -> None:
    driver = connect("amqps://u:p@rabbit.example/?queue=jobs")
    assert isinstance(driver, LazyRabbitMqDriver)
    assert driver.parameters.ssl_options is not None and driver.parameters.port == 5671
    assert repr(driver).startswith("<LazyRabbitMqDriver amqps://u@rabbit.example:5671/")


def test_x_options_become_queue_arguments_with_their_types() -> None:
    driver = connect(
        "amqp://localhost/?x-dead-letter-exchange=&x-dead-letter-routing-key=123"
        "&x-message-ttl=60000&x-queue-type=quorum&x-delivery-limit=5"
        "&x-single-active-consumer=true&x-custom=abc"
    )
    assert isinstance(driver, LazyRabbitMqDriver)
    assert driver.queue_arguments == {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "123",
        "x-message-ttl": 60000,
        "x-queue-type": "quorum",
        "x-delivery-limit": 5,
        "x-single-active-consumer": True,
        "x-custom": "abc",
    }


def test_keyword_options_of_connect_add_what_a_url_cannot_carry() -> None:
    driver = connect(
        "amqp://localhost/?queue=jobs&x-message-ttl=1000",
        queue_arguments={"x-max-length": 10},
        message_properties={"app_id": "web", "delivery_mode": 1},
        prefetch=7,
    )
    assert isinstance(driver, LazyRabbitMqDriver)
    assert driver.queue_arguments == {"x-message-ttl": 1000, "x-max-length": 10}
    assert driver.message_properties.app_id == "web"
    assert driver.message_properties.delivery_mode == 1
    assert driver.message_properties.content_type == "application/json"
    assert driver.prefetch == 7
    assert "queue_arguments" in keyword_options() and "parameters" not in keyword_options()


def test_pika_basic_properties_are_accepted_as_message_properties() -> None:
    driver = LazyRabbitMqDriver(
        pika.ConnectionParameters("localhost"),
        "jobs",
        pika.BasicProperties(priority=3, headers={"a": "b"}),
    )
    assert driver.message_properties.priority == 3
    assert driver.message_properties.headers == {"a": "b"}
    assert driver.message_properties.delivery_mode == 2


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("amqp://localhost/?queue=jobs&prefech=10", "unknown option(s) prefech"),
        ("amqp://localhost/?prefetch=0", "prefetch='0'"),
        ("amqp://localhost/?prefetch=many", "must be an integer"),
        ("amqp://localhost/?durable=maybe", "true or false"),
        ("amqp://localhost/?refresh_interval=-1", "refresh_interval"),
        ("amqp://localhost/?heartbeat=soon", "heartbeat"),
        ("amqp://localhost/?queue=amq.jobs", "reserves"),
        ("amqp://localhost/?queue=", "non-empty"),
        ("amqp:///?queue=jobs", "names no host"),
    ],
)
def test_a_bad_url_fails_at_connect_naming_the_problem(url: str, complaint: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        connect(url)
    assert complaint in str(info.value)


def test_the_retired_reconnect_option_is_refused_saying_who_reconnects_now() -> None:
    with pytest.raises(ConfigurationError) as info:
        connect("amqp://u:hunter2@localhost/?queue=jobs&reconnect_max_delay_s=5")
    assert "reconnect_max_delay_s is no longer an option" in str(info.value)
    assert "backoff" in str(info.value) and "hunter2" not in str(info.value)


def test_an_unknown_keyword_option_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="unknown keyword option"):
        connect("amqp://localhost/", prefetchs=3)


def test_unknown_message_properties_are_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="not AMQP message properties"):
        connect("amqp://localhost/", message_properties={"colour": "blue"})


def test_a_queue_name_too_long_for_its_delay_queues_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="longer than"):
        connect("amqp://localhost/?queue=" + "q" * 240)


def test_errors_and_reprs_mask_the_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        connect("amqp://u:hunter2@localhost/?nope=1")
    assert "hunter2" not in str(info.value)
    assert "hunter2" not in repr(connect("amqp://u:hunter2@localhost/"))


def test_isolate_puts_every_queue_under_the_namespace() -> None:
    url = isolated_url("amqp://u:p@localhost/?queue=jobs&delay=true", "kit-test-1")
    assert DriverUrl.parse(url).options == {"queue": "kit-test-1", "delay": "true"}
    driver = connect(url)
    assert isinstance(driver, LazyRabbitMqDriver)
    driver.setup_priority_queue("high", 200)
    assert all(name.startswith("kit-test-1") for name in driver.priority_queues().values())
