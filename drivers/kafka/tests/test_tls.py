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

import datetime
import os
import secrets
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hermes_test_services as services
import pytest
import trustme

from hermes.core import BrokerRefusedError, Message, Worker, connect

#: Group settings that make a join take ~1 s on the test broker (see conftest.py).
FAST_GROUP = "session.timeout.ms=2000&heartbeat.interval.ms=250"
#: Long enough for what takes a second, on a slow shared machine.
GENEROUS_S = 30.0


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
    ca_path, cert_path, key_path = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    ca.cert_pem.write_to_path(str(ca_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
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
    now = datetime.datetime.now(datetime.UTC)
    cert = ca.issue_cert(
        "127.0.0.1",
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )
    yield from _serve(tmp_path_factory.mktemp("kafka-expired"), ca, cert)


@pytest.fixture(scope="module")
def other_host(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker on 127.0.0.2 (loopback too) whose certificate names 127.0.0.1 only."""
    tmp = tmp_path_factory.mktemp("kafka-other-host")
    yield from _serve(tmp, ca, ca.issue_cert("127.0.0.1"), host="127.0.0.2")


def _refusal(url: str) -> str:
    """The one line ``send`` raises on ``url``."""
    driver = connect(url)
    try:
        started = time.monotonic()
        with pytest.raises(BrokerRefusedError) as caught:
            driver.send(Message("tls"))
        # Refused at the first handshake, not after the send's own time limit.
        assert time.monotonic() - started < GENEROUS_S
    finally:
        driver.close()
    text = str(caught.value)
    assert "\n" not in text, text
    assert "ssl.ca.location=PATH" in text, text
    return text


def test_ssl_with_the_ca_verifies_and_a_worker_handles_a_message(broker: Broker) -> None:
    driver = connect(broker.url(**{"ssl.ca.location": str(broker.ca_path)}))
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
    finally:
        driver.teardown()
        driver.close()


def test_without_a_ca_the_system_cas_verify_and_refuse_an_unknown_issuer(broker: Broker) -> None:
    assert "certificate verify failed" in _refusal(broker.url())


def test_a_certificate_signed_by_another_ca_is_refused_in_one_line(
    broker: Broker, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    text = _refusal(broker.url(**{"ssl.ca.location": str(other)}))
    assert "certificate verify failed" in text, text


def test_an_expired_certificate_is_refused_in_one_line(expired: Broker) -> None:
    # The same CA and host as the good broker's: only the dates differ.
    text = _refusal(expired.url(**{"ssl.ca.location": str(expired.ca_path)}))
    assert "certificate verify failed" in text, text


def test_a_certificate_for_another_host_is_refused_in_one_line(other_host: Broker) -> None:
    # Issued as the good broker's (same CA, for 127.0.0.1), served from 127.0.0.2.
    text = _refusal(other_host.url(**{"ssl.ca.location": str(other_host.ca_path)}))
    assert "certificate verify failed" in text, text


def test_a_worker_on_a_refused_certificate_stops_instead_of_retrying(broker: Broker) -> None:
    driver = connect(broker.url())
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
    broker: Broker, tmp_path: Path
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
        [str(hermes), "worker", "--url", broker.url(), "--handlers", "tls_handlers:HANDLERS"],
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
    assert "certificate verify failed" in refusals[0] and "ssl.ca.location=PATH" in refusals[0]
