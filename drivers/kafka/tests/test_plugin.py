"""kafka:// URLs: what goes to librdkafka, what to Hermes, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.core import ConfigurationError, available_drivers, connect
from hermes.core.driver import Delay, DriverUrl
from hermes.drivers.kafka import KafkaDriver
from hermes.drivers.kafka._plugin import _isolate, librdkafka_config

#: Nothing listens there; building a driver does not need a broker.
NOWHERE = "127.0.0.1:9"


def kafka(url: str) -> KafkaDriver:
    driver = connect(url)
    assert isinstance(driver, KafkaDriver)
    driver.close()
    return driver


def test_the_kafka_scheme_is_registered_with_the_default_capabilities() -> None:
    plugin = next(p for p in available_drivers() if p.name == "kafka")

    assert plugin.schemes == ("kafka",)
    assert plugin.capabilities is KafkaDriver.capabilities
    assert plugin.capabilities.delay is Delay.IGNORED


def test_a_url_gives_brokers_topic_group_and_hermes_options() -> None:
    driver = kafka(
        "kafka://h1:9093,h2/jobs?group=workers&delay=true&commit_every=10"
        "&commit_interval_s=2.5&partitions=6&max_held=50&dead_letter_topic=jobs.dead"
    )

    assert driver.bootstrap == "h1:9093,h2:9092"
    assert (driver.topic, driver.group_id) == ("jobs", "workers")
    assert driver.capabilities.delay is Delay.NATIVE
    assert (driver.commit_every, driver.commit_interval_s) == (10, 2.5)
    assert (driver.partitions, driver.max_held) == (6, 50)
    assert driver.dead_letter_topic == "jobs.dead"


def test_dotted_options_go_to_the_client_that_understands_them() -> None:
    driver = kafka(
        f"kafka://{NOWHERE}/jobs?session.timeout.ms=6000&linger.ms=2&acks=1"
        "&client.id=web&socket.timeout.ms=5000&fetch.wait.max.ms=100"
    )

    assert driver.consumer_config["session.timeout.ms"] == "6000"
    assert "session.timeout.ms" not in driver.producer_config
    assert driver.producer_config["linger.ms"] == "2"
    assert driver.producer_config["acks"] == "1"
    assert "linger.ms" not in driver.consumer_config
    assert "acks" not in driver.consumer_config
    for config in (driver.producer_config, driver.consumer_config, driver.admin_config):
        assert config["client.id"] == "web"
        assert config["socket.timeout.ms"] == "5000"
    # session.timeout.ms=6000: a dead member's records move within 2 x 6 s + 2 s.
    assert driver.capabilities.redelivery_timeout_s == pytest.approx(14.0)
    # fetch.wait.max.ms=100: an idle worker's fetch may wait that long.
    assert driver.capabilities.wake_up_s == pytest.approx(0.1)


def test_hermes_defaults_are_durable_and_commit_manually() -> None:
    driver = kafka(f"kafka://{NOWHERE}/jobs")

    assert driver.producer_config["acks"] == "all"
    assert driver.consumer_config["enable.auto.commit"] is False
    assert driver.consumer_config["auto.offset.reset"] == "earliest"
    assert driver.consumer_config["group.id"] == "hermes"
    assert driver.commit_every == 1
    assert driver.capabilities.wake_up_s == pytest.approx(0.5)  # librdkafka's fetch wait


def test_an_alias_of_a_default_setting_replaces_the_default() -> None:
    driver = kafka(f"kafka://{NOWHERE}/jobs?request.required.acks=1&delivery.timeout.ms=1500")

    assert "acks" not in driver.producer_config
    assert "message.timeout.ms" not in driver.producer_config
    assert driver.send_timeout_s == pytest.approx(2.5)


def test_credentials_in_the_url_become_sasl_settings_and_never_show() -> None:
    url = (
        f"kafka://alice:s3cret@{NOWHERE}/jobs?security.protocol=sasl_plaintext&sasl.mechanism=PLAIN"
    )
    driver = kafka(url)

    assert driver.producer_config["sasl.username"] == "alice"
    assert driver.consumer_config["sasl.password"] == "s3cret"
    assert "s3cret" not in repr(driver)
    assert "s3cret" not in repr(DriverUrl.parse(url))


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        (f"kafka://{NOWHERE}/jobs?colour=red", "unknown option.*colour"),
        (f"kafka://{NOWHERE}/jobs?group.id=x", "group=NAME"),
        (f"kafka://{NOWHERE}/jobs?enable.auto.commit=true", "commits each offset"),
        (f"kafka://{NOWHERE}/jobs?commit_every=-1", "commit_every"),
        (f"kafka://{NOWHERE}/jobs?commit_every=0", "commit_interval_s"),
        (f"kafka://{NOWHERE}/jobs?delay=maybe", "delay"),
        (f"kafka://{NOWHERE}/jobs?partitions=0", "partitions"),
        (f"kafka://{NOWHERE}/", "names no topic"),
        (f"kafka://{NOWHERE}/a/b", "not a Kafka topic name"),
        ("kafka:///jobs", "names no broker"),
        ("kafka://h1,,h2/jobs", "empty host"),
        (f"kafka://{NOWHERE}/jobs?session.timeout.ms=soon", "librdkafka rejects"),
        (f"kafka://{NOWHERE}/jobs?no.such.setting=1", "librdkafka rejects"),
        # Read by the producer alone, which the first send makes: still checked at connect.
        (f"kafka://{NOWHERE}/jobs?linger.ms=soon", "rejects the Kafka producer settings"),
    ],
)
def test_a_bad_url_fails_at_connect_naming_the_problem(url: str, complaint: str) -> None:
    with pytest.raises(ConfigurationError, match=complaint):
        connect(url)


def test_an_unknown_keyword_option_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="config="):
        connect(f"kafka://{NOWHERE}/jobs", colour="red")


def test_keyword_config_adds_settings_a_url_cannot_carry() -> None:
    seen: list[object] = []
    driver = connect(f"kafka://{NOWHERE}/jobs", config={"stats_cb": seen.append})
    assert isinstance(driver, KafkaDriver)
    driver.close()

    assert driver.consumer_config["stats_cb"] == seen.append


def test_isolation_gives_a_namespace_its_own_topic_group_and_dead_letters() -> None:
    url = DriverUrl.parse(f"kafka://{NOWHERE}/jobs?group=w&dead_letter_topic=d&acks=1")

    isolated = DriverUrl.parse(_isolate(url, "ns-1"))

    assert isolated.path == "ns-1"
    assert isolated.options["group"] == "ns-1"
    assert isolated.options["dead_letter_topic"] == "ns-1.dead-letters"
    assert isolated.options["acks"] == "1"
    assert isolated.hosts == url.hosts


def test_the_tls_options_every_driver_takes_become_librdkafka_s(tmp_path: Path) -> None:
    import trustme

    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    config = librdkafka_config(
        DriverUrl.parse(f"kafka://{NOWHERE}/jobs?ssl_ca_certs={ca}&ssl_check_hostname=false")
    )

    assert config["security.protocol"] == "ssl"
    assert config["ssl.ca.location"] == str(ca)
    assert config["enable.ssl.certificate.verification"] == "true"
    assert config["ssl.endpoint.identification.algorithm"] == "none"
    with_user = librdkafka_config(DriverUrl.parse(f"kafka://u:p@{NOWHERE}/jobs?ssl_cert_reqs=none"))
    assert with_user["security.protocol"] == "sasl_ssl"
    assert with_user["enable.ssl.certificate.verification"] == "false"
    assert librdkafka_config(DriverUrl.parse(f"kafka://{NOWHERE}/jobs")).keys() == {
        "bootstrap.servers"
    }


def test_a_tls_option_and_librdkafka_s_own_for_it_or_a_plaintext_protocol_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"both ssl_cert_reqs and enable\.ssl"):
        connect(
            f"kafka://{NOWHERE}/jobs?ssl_cert_reqs=none&enable.ssl.certificate.verification=false"
        )
    with pytest.raises(ConfigurationError, match=r"needs TLS: add security\.protocol=ssl"):
        connect(f"kafka://{NOWHERE}/jobs?ssl_cert_reqs=none&security.protocol=plaintext")
