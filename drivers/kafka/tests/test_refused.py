"""Refused credentials stop a worker; an absent broker makes it wait: read from the error code."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from hermes.core import (
    BrokerRefusedError,
    BrokerUnavailableError,
    DeliveryError,
    DriverError,
    Message,
    Worker,
    connect,
)
from hermes.core.spi._door import translate_errors
from hermes.drivers.kafka import KafkaDriver

#: SASL settings for the test broker, which refuses every login.
SASL = "security.protocol=sasl_plaintext&sasl.mechanism=SCRAM-SHA-512"


@pytest.fixture
def driver() -> KafkaDriver:
    driver = connect("kafka://127.0.0.1:9/jobs?create_topics=false")
    assert isinstance(driver, KafkaDriver)
    return driver


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError._AUTHENTICATION,
    ],
)
def test_credentials_and_acls_the_broker_refuses_are_broker_refused(
    driver: KafkaDriver, code: int
) -> None:
    assert driver.classify_error(KafkaException(KafkaError(code))) is BrokerRefusedError


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
    ],
)
def test_a_broker_that_cannot_be_reached_is_broker_unavailable(
    driver: KafkaDriver, code: int
) -> None:
    assert driver.classify_error(KafkaException(KafkaError(code))) is BrokerUnavailableError


def test_any_other_code_is_a_failure_and_a_delivery_error_on_send(driver: KafkaDriver) -> None:
    too_large = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert driver.classify_error(too_large) is DriverError
    with pytest.raises(DeliveryError) as info, translate_errors(driver, "sending", DeliveryError):
        raise too_large
    assert info.value.__cause__ is too_large


def test_an_exception_that_is_not_the_clients_is_left_alone(driver: KafkaDriver) -> None:
    assert driver.classify_error(ValueError("not Kafka's")) is None


def test_a_worker_whose_login_the_broker_refuses_stops_with_broker_refused(
    kafka_sasl_bootstrap: str,
) -> None:
    driver = connect(f"kafka://alice:wrong@{kafka_sasl_bootstrap}/jobs?group=g&{SASL}")
    try:
        with pytest.raises(BrokerRefusedError) as info:
            Worker(driver, lambda message, priority: True, handle_signals=False).run()
        text = str(info.value)
        assert "\n" not in text
        assert "sasl.username" in text
        assert "wrong" not in text  # the password is never shown
    finally:
        driver.close()


def test_a_send_whose_login_the_broker_refuses_raises_broker_refused(
    kafka_sasl_bootstrap: str,
) -> None:
    url = f"kafka://alice:wrong@{kafka_sasl_bootstrap}/jobs?message.timeout.ms=3000&{SASL}"
    driver = connect(url)
    try:
        with pytest.raises(BrokerRefusedError, match=r"sasl\.username"):
            driver.send(Message("t"))
    finally:
        driver.close()
