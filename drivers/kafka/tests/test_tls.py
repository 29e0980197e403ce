"""security.protocol=ssl: a Tansu of the test's own that speaks only TLS, with a CA the test makes.

librdkafka verifies by default: the broker's certificate must be signed by
``ssl.ca.location`` (else the system's CAs) and name the host the client
connects to (``ssl.endpoint.identification.algorithm=https``). Each bad
certificate -- signed by another CA, expired, issued for another host -- is
refused in one line that says what to change: librdkafka reports it to
``error_cb`` only, and would try again for ever; the driver raises it, a
worker stops, and ``hermes worker`` exits 2. librdkafka's text is the same in
the three cases ("broker certificate could not be verified"); each case is
told apart by the good broker that the same client settings do reach.

Tansu cannot serve TLS itself: tools/services.py puts socat's OpenSSL
listener in front of it (see ``kafka_broker``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hermes_test_services as services
import pytest
import trustme
from hermes_test_support import (
    REFUSAL_S,
    expired_certificate,
    handled_by_a_worker,
    other_ca_file,
    refused_send,
    refused_worker_line,
    worker_stops_refused,
    write_certificates,
)

#: Group settings that make a join take ~1 s on the test broker (see conftest.py).
FAST_GROUP = "session.timeout.ms=2000&heartbeat.interval.ms=250"
#: What every refusal of a certificate tells the user to look at.
HINT = "ssl_ca_certs=PATH"


@dataclass
class Broker:
    """A Tansu that speaks TLS at ``bootstrap``, and the CA file that verifies it."""

    bootstrap: str
    ca_path: Path

    def url(self, **options: str) -> str:
        name = f"t-{secrets.token_hex(6)}"
        query = {"group": name, "security.protocol": "ssl", **options}
        return f"kafka://{self.bootstrap}/{name}?{FAST_GROUP}&" + "&".join(
            f"{key}={value}" for key, value in query.items()
        )


def _serve(tmp: Path, ca: Any, cert: Any, host: str = "127.0.0.1") -> Iterator[Broker]:
    ca_path, cert_path, key_path = write_certificates(tmp, ca, cert)
    tls = services.ServerTls(ca=ca_path, cert=cert_path, key=key_path)
    with services.kafka_broker(host, tls) as bootstrap:
        yield Broker(bootstrap, ca_path)


@pytest.fixture(scope="module")
def ca() -> Any:
    return trustme.CA()


@pytest.fixture(scope="module")
def broker(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from _serve(tmp_path_factory.mktemp("kafka-tls"), ca, ca.issue_cert("127.0.0.1"))


@pytest.fixture(scope="module")
def expired(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from _serve(tmp_path_factory.mktemp("kafka-expired"), ca, expired_certificate(ca))


@pytest.fixture(scope="module")
def other_host(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker on 127.0.0.2 (loopback too) whose certificate names 127.0.0.1 only."""
    tmp = tmp_path_factory.mktemp("kafka-other-host")
    yield from _serve(tmp, ca, ca.issue_cert("127.0.0.1"), host="127.0.0.2")


def _refusal(url: str) -> str:
    """The one line ``send`` raises on ``url``: refused at the first handshake."""
    started = time.monotonic()
    text = refused_send(url, "certificate verify failed", HINT)
    # Not after the send's own time limit (minutes): librdkafka would retry until then.
    assert time.monotonic() - started < REFUSAL_S
    return text


def test_ssl_with_the_ca_verifies_and_a_worker_handles_a_message(broker: Broker) -> None:
    message, _ = handled_by_a_worker(broker.url(**{"ssl.ca.location": str(broker.ca_path)}))
    assert message.payload == {"secret": "only on the wire encrypted"}


def test_ssl_ca_certs_verifies_as_ssl_ca_location_does(broker: Broker) -> None:
    message, _ = handled_by_a_worker(broker.url(ssl_ca_certs=str(broker.ca_path)))
    assert message.payload == {"secret": "only on the wire encrypted"}


def test_without_a_ca_the_system_cas_verify_and_refuse_an_unknown_issuer(broker: Broker) -> None:
    _refusal(broker.url())


def test_a_certificate_signed_by_another_ca_is_refused_in_one_line(
    broker: Broker, tmp_path: Path
) -> None:
    _refusal(broker.url(**{"ssl.ca.location": str(other_ca_file(tmp_path))}))


def test_an_expired_certificate_is_refused_in_one_line(expired: Broker) -> None:
    # The same CA and host as the good broker's: only the dates differ.
    _refusal(expired.url(**{"ssl.ca.location": str(expired.ca_path)}))


def test_a_certificate_for_another_host_is_refused_in_one_line(other_host: Broker) -> None:
    # Issued as the good broker's (same CA, for 127.0.0.1), served from 127.0.0.2.
    _refusal(other_host.url(**{"ssl.ca.location": str(other_host.ca_path)}))


def test_a_worker_on_a_refused_certificate_stops_instead_of_retrying(broker: Broker) -> None:
    worker_stops_refused(broker.url(), "certificate verify failed")


def test_hermes_worker_on_a_refused_certificate_exits_2_with_one_line_and_no_traceback(
    broker: Broker, tmp_path: Path
) -> None:
    line = refused_worker_line(broker.url(), tmp_path)
    assert "certificate verify failed" in line and HINT in line, line
