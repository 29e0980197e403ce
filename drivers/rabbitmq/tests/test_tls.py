"""amqps://: a RabbitMQ node of the test's own with a TLS listener and a CA the test makes.

Verification is on by default: the server's certificate must be signed by
``ssl_ca_certs`` (else the system's CAs) and name the URL's host. Each bad
certificate -- signed by another CA, expired, issued for another host -- is
refused in one line that says what to change, before anything is sent; a
worker stops instead of retrying, and ``hermes worker`` exits 2.
``ssl_cert_reqs=none`` is the one way to turn verification off.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hermes_test_services as services
import pytest
import trustme

from hermes.core import BrokerRefusedError, ConfigurationError, Message, Worker, connect

#: The good node also listens here, an address its certificate does not name
#: (all of 127.0.0.0/8 is loopback): the wrong-host case, without a second node.
OTHER_HOST = "127.0.0.2"
#: Long enough for a refusal that takes milliseconds, on a slow shared machine.
GENEROUS_S = 30.0


@dataclass
class Node:
    """A running TLS node, the port it listens on and the CA file that verifies it."""

    port: int
    ca_path: Path

    def url(self, host: str = "127.0.0.1", **options: str) -> str:
        query = {"queue": f"hermes-tls-{uuid.uuid4().hex[:8]}", **options}
        return f"amqps://guest:guest@{host}:{self.port}/?" + "&".join(
            f"{key}={value}" for key, value in query.items()
        )


def _serve(tmp: Path, ca: Any, cert: Any, **node: Any) -> Iterator[Node]:
    ca_path, cert_path, key_path = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    ca.cert_pem.write_to_path(str(ca_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    tls = services.ServerTls(ca=ca_path, cert=cert_path, key=key_path)
    with services.rabbitmq_node("127.0.0.1", tls, **node) as url:
        yield Node(int(url.rsplit(":", 1)[1].rstrip("/")), ca_path)


@pytest.fixture(scope="module")
def ca() -> Any:
    return trustme.CA()


@pytest.fixture(scope="module")
def node(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node whose certificate names 127.0.0.1 (and so not ``OTHER_HOST``)."""
    tmp = tmp_path_factory.mktemp("rabbitmq-tls")
    yield from _serve(tmp, ca, ca.issue_cert("127.0.0.1"), also_on=[OTHER_HOST])


@pytest.fixture(scope="module")
def expired(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node with a certificate from the same CA for the right host, expired yesterday."""
    tmp = tmp_path_factory.mktemp("rabbitmq-expired")
    now = datetime.datetime.now(datetime.UTC)
    cert = ca.issue_cert(
        "127.0.0.1",
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )
    yield from _serve(tmp, ca, cert)


def _refusal(url: str) -> str:
    """The one line ``send`` raises on ``url``."""
    driver = connect(url)
    try:
        with pytest.raises(BrokerRefusedError) as caught:
            driver.send(Message("tls"))
    finally:
        driver.close()
    text = str(caught.value)
    assert "\n" not in text, text
    assert "ssl_ca_certs=PATH" in text, text
    assert "guest:guest" not in text, text  # the password is never shown
    return text


def test_an_amqps_url_with_the_ca_verifies_and_a_worker_handles_a_message(node: Node) -> None:
    driver = connect(node.url(ssl_ca_certs=str(node.ca_path)))
    handled: list[Message] = []
    try:
        message = Message("tls", {"secret": "only on the wire encrypted"})
        driver.send(message)
        deadline = time.monotonic() + GENEROUS_S  # a worker that never gets it fails, not hangs
        Worker(
            driver,
            {"tls": handled.append},
            handle_signals=False,
            stop_when=lambda: bool(handled) or time.monotonic() > deadline,
        ).run()
        assert [m.id for m in handled] == [message.id]
        assert handled[0].payload == {"secret": "only on the wire encrypted"}
        assert repr(driver).startswith("<LazyRabbitMqDriver amqps://guest@127.0.0.1:")
    finally:
        driver.teardown()
        driver.close()


def test_without_a_ca_the_system_cas_verify_and_refuse_an_unknown_issuer(node: Node) -> None:
    assert "certificate verify failed" in _refusal(node.url())


def test_a_certificate_signed_by_another_ca_is_refused_in_one_line(
    node: Node, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    text = _refusal(node.url(ssl_ca_certs=str(other)))
    assert "certificate verify failed" in text, text


def test_an_expired_certificate_is_refused_in_one_line(expired: Node) -> None:
    text = _refusal(expired.url(ssl_ca_certs=str(expired.ca_path)))
    assert "certificate has expired" in text, text


def test_a_certificate_for_another_host_is_refused_in_one_line(node: Node) -> None:
    text = _refusal(node.url(host=OTHER_HOST, ssl_ca_certs=str(node.ca_path)))
    assert f"mismatch, certificate is not valid for '{OTHER_HOST}'" in text, text


def test_a_worker_on_a_refused_certificate_stops_instead_of_retrying(node: Node) -> None:
    driver = connect(node.url())
    deadline = time.monotonic() + GENEROUS_S  # a worker that retries fails the test, not hangs
    try:
        with pytest.raises(BrokerRefusedError, match="certificate verify failed"):
            Worker(
                driver,
                {"tls": lambda m: None},
                handle_signals=False,
                stop_when=lambda: time.monotonic() > deadline,
            ).run()
    finally:
        driver.close()


def test_hermes_worker_on_a_refused_certificate_exits_2_with_one_line_and_no_traceback(
    node: Node, tmp_path: Path
) -> None:
    (tmp_path / "tls_handlers.py").write_text(
        textwrap.dedent(
            """
            def handle(message):
                return True

            HANDLERS = {"tls": handle}
            """
        )
    )
    hermes = Path(sys.executable).with_name("hermes")
    result = subprocess.run(
        [str(hermes), "worker", "--url", node.url(), "--handlers", "tls_handlers:HANDLERS"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=GENEROUS_S,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    refusals = [line for line in result.stderr.splitlines() if line.startswith("hermes: error:")]
    assert len(refusals) == 1, result.stderr
    assert "certificate verify failed" in refusals[0] and "ssl_ca_certs=PATH" in refusals[0]


def test_verification_is_off_only_when_the_url_says_so(node: Node, tmp_path: Path) -> None:
    for url in (
        node.url(ssl_cert_reqs="none"),  # the unknown CA is accepted: the URL asked for it
        node.url(host=OTHER_HOST, ssl_ca_certs=str(node.ca_path), ssl_check_hostname="false"),
    ):
        driver = connect(url)
        try:
            driver.send(Message("accepted"))
        finally:
            driver.teardown()
            driver.close()
    with pytest.raises(ConfigurationError, match=r"ssl_cert_reqs .* must be one of"):
        connect(node.url(ssl_cert_reqs="maybe"))
    with pytest.raises(ConfigurationError, match="needs TLS: use amqps://"):
        connect(f"amqp://guest:guest@127.0.0.1:{node.port}/?ssl_ca_certs={node.ca_path}")
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(ConfigurationError, match="the TLS files it names cannot be used"):
        connect(node.url(ssl_ca_certs=str(missing)))
