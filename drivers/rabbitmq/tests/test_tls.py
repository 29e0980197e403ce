"""amqps://: a RabbitMQ node of the test's own with a TLS listener and a CA the test makes.

Verification is on by default: the server's certificate must be signed by
``ssl_ca_certs`` (else the system's CAs) and name the URL's host. Each bad
certificate -- signed by another CA, expired, issued for another host -- is
refused in one line that says what to change, before anything is sent; a
worker stops instead of retrying, and ``hermes worker`` exits 2.
``ssl_cert_reqs=none`` is the one way to turn verification off.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hermes_test_services as services
import pytest
import trustme
from hermes_test_support import (
    expired_certificate,
    handled_by_a_worker,
    other_ca_file,
    refused_send,
    refused_worker_line,
    worker_stops_refused,
    write_certificates,
)

from hermes.core import ConfigurationError, Message, connect

#: The good node also listens here, an address its certificate does not name
#: (all of 127.0.0.0/8 is loopback): the wrong-host case, without a second node.
OTHER_HOST = "127.0.0.2"
#: What every refusal of a certificate tells the user to look at.
HINT = "ssl_ca_certs=PATH"


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
    ca_path, cert_path, key_path = write_certificates(tmp, ca, cert)
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
    yield from _serve(tmp_path_factory.mktemp("rabbitmq-expired"), ca, expired_certificate(ca))


def _refusal(url: str, why: str) -> str:
    """The one line ``send`` raises on ``url``, naming ``why``; never the password."""
    text = refused_send(url, why, HINT)
    assert "guest:guest" not in text, text
    return text


def test_an_amqps_url_with_the_ca_verifies_and_a_worker_handles_a_message(node: Node) -> None:
    message, shown = handled_by_a_worker(node.url(ssl_ca_certs=str(node.ca_path)))
    assert message.payload == {"secret": "only on the wire encrypted"}
    assert shown.startswith("<LazyRabbitMqDriver amqps://guest@127.0.0.1:"), shown


def test_without_a_ca_the_system_cas_verify_and_refuse_an_unknown_issuer(node: Node) -> None:
    _refusal(node.url(), "certificate verify failed")


def test_a_certificate_signed_by_another_ca_is_refused_in_one_line(
    node: Node, tmp_path: Path
) -> None:
    _refusal(node.url(ssl_ca_certs=str(other_ca_file(tmp_path))), "certificate verify failed")


def test_an_expired_certificate_is_refused_in_one_line(expired: Node) -> None:
    _refusal(expired.url(ssl_ca_certs=str(expired.ca_path)), "certificate has expired")


def test_a_certificate_for_another_host_is_refused_in_one_line(node: Node) -> None:
    url = node.url(host=OTHER_HOST, ssl_ca_certs=str(node.ca_path))
    _refusal(url, f"mismatch, certificate is not valid for '{OTHER_HOST}'")


def test_a_worker_on_a_refused_certificate_stops_instead_of_retrying(node: Node) -> None:
    worker_stops_refused(node.url(), "certificate verify failed")


def test_hermes_worker_on_a_refused_certificate_exits_2_with_one_line_and_no_traceback(
    node: Node, tmp_path: Path
) -> None:
    line = refused_worker_line(node.url(), tmp_path)
    assert "certificate verify failed" in line and HINT in line, line
    assert "guest:guest" not in line, line


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
