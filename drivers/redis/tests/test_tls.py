"""rediss://: a real TLS listener with a CA the test makes; verification is on by default.

Each bad certificate -- signed by another CA, expired, issued for another
host -- is refused in one line that says what to change, before anything is
sent; ``ssl_cert_reqs=none`` is the one way to turn verification off.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hermes_test_support import refused_send

from hermes.core import BrokerRefusedError, ConfigurationError, Message, Worker, connect
from hermes.drivers.redis import RedisTlsError

trustme = pytest.importorskip("trustme")


class Tls:
    """A CA and a redis-server of the test's own that speaks only TLS with a cert it signed."""

    def __init__(self, tmp: Path, ca: Any, port: int) -> None:
        self.tmp = tmp
        self.ca = ca
        self.port = port
        self.ca_path = tmp / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_path))

    def url(self, host: str = "127.0.0.1", **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"key": "tls", **options}.items())
        return f"rediss://{host}:{self.port}/0?{query}"


def _serve(redis_server: Any, tmp: Path, ca: Any, cert: Any, name: str) -> Any:
    import hermes_test_services

    cert_path, key_path = tmp / f"{name}.pem", tmp / f"{name}.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    port = hermes_test_services.free_port()
    # --port 0: no plain-TCP listener at all; clients need not show a certificate.
    server = redis_server(
        port,
        "--port",
        "0",
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(cert_path),
        "--tls-key-file",
        str(key_path),
        "--tls-ca-cert-file",
        str(tmp / "ca.pem"),
        "--tls-auth-clients",
        "no",
    )
    return port, server


@pytest.fixture(scope="module")
def tls(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    tmp = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    port, server = _serve(redis_server, tmp, ca, ca.issue_cert("127.0.0.1"), "server")
    with server:
        yield Tls(tmp, ca, port)


@pytest.fixture(scope="module")
def expired(redis_server: Any, tmp_path_factory: pytest.TempPathFactory, tls: Tls) -> Iterator[Tls]:
    tmp = tmp_path_factory.mktemp("expired")
    now = datetime.datetime.now(datetime.UTC)
    cert = tls.ca.issue_cert(
        "127.0.0.1",
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )
    tls.ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    port, server = _serve(redis_server, tmp, tls.ca, cert, "expired")
    with server:
        yield Tls(tmp, tls.ca, port)


def _refusal(url: str) -> str:
    """The one line ``send`` raises on ``url``."""
    return refused_send(url, "ssl_ca_certs", kind=RedisTlsError)


def test_a_rediss_url_with_the_ca_connects_and_carries_messages(tls: Tls) -> None:
    driver = connect(tls.url(ssl_ca_certs=str(tls.ca_path), delivery="at-least-once"))
    try:
        message = Message("tls", {"secret": "only on the wire encrypted"})
        driver.send(message)
        with driver.consumer([]) as consumer:
            received = consumer.receive(1)
            assert received is not None and message.id.encode() in bytes(received.body)
            consumer.ack(received)
        assert repr(driver).startswith("<RedisSetDriver rediss://127.0.0.1:")
    finally:
        driver.teardown()
        driver.close()


def test_without_a_ca_the_system_cas_verify_and_refuse_an_unknown_issuer(tls: Tls) -> None:
    text = _refusal(tls.url())
    assert "certificate verify failed" in text


def test_a_certificate_signed_by_another_ca_is_refused_in_one_line(
    tls: Tls, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    text = _refusal(tls.url(ssl_ca_certs=str(other)))
    assert "certificate verify failed" in text, text


def test_an_expired_certificate_is_refused_in_one_line(expired: Tls) -> None:
    text = _refusal(expired.url(ssl_ca_certs=str(expired.ca_path)))
    assert "certificate has expired" in text, text


def test_a_certificate_for_another_host_is_refused_in_one_line(tls: Tls) -> None:
    # The certificate names 127.0.0.1 only; localhost reaches the same server.
    text = _refusal(tls.url(host="localhost", ssl_ca_certs=str(tls.ca_path)))
    assert "mismatch" in text.lower() or "doesn't match" in text, text


def test_a_worker_on_a_refused_certificate_stops_instead_of_retrying(tls: Tls) -> None:
    driver = connect(tls.url())
    done = threading.Event()
    try:
        with pytest.raises(BrokerRefusedError, match="certificate verify failed"):
            Worker(
                driver, {"tls": lambda m: None}, handle_signals=False, stop_when=done.is_set
            ).run()
    finally:
        done.set()
        driver.close()


def test_verification_is_off_only_when_the_url_says_so(tls: Tls) -> None:
    driver = connect(tls.url(ssl_cert_reqs="none"))
    try:
        driver.send(Message("unverified"))  # the unknown CA is accepted: the URL asked for it
    finally:
        driver.teardown()
        driver.close()
    with pytest.raises(ConfigurationError, match=r"ssl_cert_reqs .* must be one of"):
        connect(tls.url(ssl_cert_reqs="maybe"))
    with pytest.raises(ConfigurationError, match="needs TLS: use rediss://"):
        connect(f"redis://127.0.0.1:{tls.port}/0?ssl_ca_certs={tls.ca_path}")
