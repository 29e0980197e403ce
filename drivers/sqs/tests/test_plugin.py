"""The sqs:// scheme: URLs to drivers, bad URLs to clear errors, isolation for the kit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from hermes.core import ConfigurationError, Message, Worker, available_drivers, compat, connect
from hermes.core.driver import DriverUrl
from hermes.drivers.sqs import AmazonSqsDriver
from hermes.drivers.sqs._plugin import isolate

MakeDriver = Callable[..., AmazonSqsDriver]


def test_the_sqs_scheme_is_registered() -> None:
    (plugin,) = [d for d in available_drivers() if d.name == "sqs"]
    assert plugin.schemes == ("sqs",)
    assert plugin.distribution == "hermes-sqs"


def test_url_options_reach_the_driver_and_the_queue_name_keeps_its_case(
    make_driver: MakeDriver, sqs_endpoint: str
) -> None:
    driver = make_driver(
        "sqs://Jobs_Queue?region=eu-west-1&endpoint_url=http%3A%2F%2F127.0.0.1%3A1"
        "&visibility_timeout=45&wait_time=20&batch_size=3&heartbeat=false"
        "&dead_letter_queue=Jobs-DLQ&max_receive_count=7&retention=600&delay=yes"
    )
    driver.teardown = lambda: None  # type: ignore[method-assign]  # nothing listens there

    assert driver.queue_name == "Jobs_Queue"
    assert (driver.visibility_timeout_s, driver.wait_time_s, driver.batch_size) == (45, 20, 3)
    assert (driver.heartbeat, driver.delay) == (False, True)
    assert (driver.dead_letter_queue, driver.max_receive_count) == ("Jobs-DLQ", 7)
    assert driver.retention_s == 600
    meta = driver._client.get().meta
    assert (meta.region_name, meta.endpoint_url) == ("eu-west-1", "http://127.0.0.1:1")


def test_keyword_options_of_connect_override_the_url(make_driver: MakeDriver, sqs_url: str) -> None:
    driver = make_driver(sqs_url + "&visibility_timeout=45", visibility_timeout_s=9)
    assert driver.visibility_timeout_s == 9


def test_a_dead_letter_queue_alone_gets_five_receives(
    make_driver: MakeDriver, sqs_url: str
) -> None:
    assert make_driver(sqs_url + "&dead_letter_queue=x-dlq").max_receive_count == 5


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("sqs://q?region=us-east-1&colour=red", "unknown option(s) colour"),
        ("sqs://q?region=us-east-1&visibility_timeout=soon", "must be an integer"),
        ("sqs://q?region=us-east-1&visibility_timeout=0", "must be an integer >= 1"),
        ("sqs://q?region=us-east-1&visibility_timeout=50000", "from 1 to 43200"),
        ("sqs://q?region=us-east-1&wait_time=21", "wait_time_s must be an integer from 0 to 20"),
        ("sqs://q?region=us-east-1&batch_size=11", "batch_size must be an integer from 1 to 10"),
        ("sqs://q?region=us-east-1&max_receive_count=3", "max_receive_count needs dead_letter"),
        ("sqs://q?region=us-east-1&dead_letter_queue=q", "must differ from queue_name"),
        ("sqs://q?region=us-east-1&retention=10", "must be an integer >= 60"),
        ("sqs://jobs.fifo?region=us-east-1", "FIFO queue"),
        ("sqs://bad%20name?region=us-east-1", "not a valid SQS queue name"),
        ("sqs://?region=us-east-1", "name the queue"),
        ("sqs://key:secret@q?region=us-east-1", "takes no credentials"),
        (
            "sqs://q?region=us-east-1&endpoint_url=http%3A%2F%2F127.0.0.1%3A1&ssl_cert_reqs=none",
            "needs TLS: use an https:// endpoint_url",
        ),
        ("sqs://q?region=us-east-1&ssl_check_hostname=false", "needs ssl_cert_reqs=none"),
    ],
)
def test_a_bad_url_fails_at_connect_saying_what_is_wrong(url: str, complaint: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        connect(url)
    assert complaint in str(caught.value)
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("option", ["colour", "client_factory", "close_client", "client"])
def test_an_unknown_keyword_option_is_refused_naming_it(option: str) -> None:
    with pytest.raises(
        ConfigurationError, match=f"unknown keyword option\\(s\\) {option} for sqs://"
    ):
        connect("sqs://q?region=us-east-1", **{option: "red"})


def test_keyword_options_are_checked_before_a_client_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_client(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an SQS client was built for a refused option")

    monkeypatch.setattr(boto3.session.Session, "client", no_client)
    with pytest.raises(ConfigurationError, match="colour"):
        connect("sqs://q?region=us-east-1", colour="red")


def test_a_missing_region_fails_at_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(ConfigurationError, match=r"no AWS region; add \?region="):
        connect("sqs://jobs")


def test_missing_credentials_fail_at_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(ConfigurationError, match="no AWS credentials found"):
        connect("sqs://jobs?region=us-east-1")


def test_the_secret_key_appears_in_no_log_and_no_repr(
    make_driver: MakeDriver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    with caplog.at_level(logging.DEBUG):
        driver = make_driver()
        driver.send(Message("x"))
        driver.send_raw(b"not a message")
        stats = Worker(driver, lambda message, priority: True, max_items=1).run()
    assert stats.processed == 1
    assert "s3cr3t-value" not in caplog.text + repr(driver)
    assert repr(driver).startswith(f"<AmazonSqsDriver sqs://{driver.queue_name} region=us-east-1")


def test_a_client_passed_in_is_used_and_left_open_by_close(sqs_endpoint: str) -> None:
    client = boto3.session.Session().client(
        "sqs", region_name="us-east-1", endpoint_url=sqs_endpoint
    )
    driver = AmazonSqsDriver(client, "passed-in-client", visibility_timeout_s=5)
    try:
        driver.send(Message("x"))
        driver.close()
        assert client.get_queue_url(QueueName="passed-in-client")["QueueUrl"]
    finally:
        driver.teardown()


def test_isolate_gives_the_namespace_its_own_queue_and_dead_letter_queue() -> None:
    url = DriverUrl.parse(
        "sqs://hermes?region=us-east-1&endpoint_url=http%3A%2F%2F127.0.0.1%3A5000"
        "&dead_letter_queue=hermes-dlq&visibility_timeout=5"
    )
    isolated = DriverUrl.parse(isolate(url, "ns-1"))

    assert (isolated.scheme, isolated.host, isolated.path) == ("sqs", "ns-1", "")
    assert dict(isolated.options) == {
        "region": "us-east-1",
        "endpoint_url": "http://127.0.0.1:5000",
        "dead_letter_queue": "ns-1-dlq",
        "visibility_timeout": "5",
    }


def test_isolated_urls_do_not_share_messages(make_driver: MakeDriver, sqs_url: str) -> None:
    first = make_driver(isolate(DriverUrl.parse(sqs_url), "iso-a"))
    second = make_driver(isolate(DriverUrl.parse(sqs_url), "iso-b"))
    first.send(Message("for-a"))
    compat.set_max_process_items(second, 1)
    second.send(Message("for-b"))
    got: list[Any] = []
    compat.wait(second, lambda message, priority: got.append(message.type) or True)
    assert got == ["for-b"]


def test_a_client_certificate_goes_to_botocore(
    make_driver: MakeDriver, sqs_url: str, tmp_path: Path
) -> None:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("client.example")
    cert_path, key_path = tmp_path / "client.pem", tmp_path / "client.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    # The local endpoint speaks plain HTTP: only what the client is built with is looked at.
    url = sqs_url.replace("endpoint_url=http", "endpoint_url=https")
    driver = make_driver(f"{url}&ssl_certfile={cert_path}&ssl_keyfile={key_path}")
    driver.teardown = lambda: None  # type: ignore[method-assign]  # nothing speaks TLS there

    assert driver._client.get().meta.config.client_cert == (str(cert_path), str(key_path))
