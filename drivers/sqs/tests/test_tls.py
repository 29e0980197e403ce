"""An https:// endpoint: a local SQS server of the test's own behind TLS, with a CA the test makes.

botocore verifies by default: the endpoint's certificate must be signed by
``ssl_ca_certs`` (else the CAs botocore trusts) and name the host in
``endpoint_url``. Each bad certificate -- signed by another CA, expired,
issued for another host -- is refused in one line that says what to change;
a worker stops instead of backing off, and ``hermes worker`` exits 2.

The local server speaks plain HTTP: tools/services.py puts socat's OpenSSL
listener in front of it (see ``sqs_server``).
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
from urllib.parse import quote

import hermes_test_services as services
import pytest
import trustme

from hermes.core import BrokerRefusedError, ConfigurationError, Message, Worker, connect

#: Any region: the local server takes them all.
REGION = "us-east-1"
#: Long enough for what takes a second, on a slow shared machine.
GENEROUS_S = 30.0


@dataclass
class Endpoint:
    """A local SQS server that speaks TLS at ``url``, and the CA file that verifies it."""

    endpoint: str
    ca_path: Path

    def url(self, **options: str) -> str:
        query = {"region": REGION, "endpoint_url": quote(self.endpoint, safe=""), **options}
        name = f"t-{secrets.token_hex(6)}"
        return f"sqs://{name}?" + "&".join(f"{key}={value}" for key, value in query.items())


def _serve(tmp: Path, ca: Any, cert: Any, host: str = "127.0.0.1") -> Iterator[Endpoint]:
    ca_path, cert_path, key_path = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    ca.cert_pem.write_to_path(str(ca_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    tls = services.ServerTls(ca=ca_path, cert=cert_path, key=key_path)
    with services.sqs_server(host, tls) as endpoint:
        yield Endpoint(endpoint, ca_path)


@pytest.fixture(scope="module")
def ca() -> Any:
    return trustme.CA()


@pytest.fixture(scope="module")
def server(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    yield from _serve(tmp_path_factory.mktemp("sqs-tls"), ca, ca.issue_cert("127.0.0.1"))


@pytest.fixture(scope="module")
def expired(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    now = datetime.datetime.now(datetime.UTC)
    cert = ca.issue_cert(
        "127.0.0.1",
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )
    yield from _serve(tmp_path_factory.mktemp("sqs-expired"), ca, cert)


@pytest.fixture(scope="module")
def other_host(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """An endpoint on 127.0.0.2 (loopback too) whose certificate names 127.0.0.1 only."""
    tmp = tmp_path_factory.mktemp("sqs-other-host")
    yield from _serve(tmp, ca, ca.issue_cert("127.0.0.1"), host="127.0.0.2")


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
    return text


def test_an_https_endpoint_with_the_ca_verifies_and_a_worker_handles_a_message(
    server: Endpoint,
) -> None:
    driver = connect(server.url(ssl_ca_certs=str(server.ca_path)))
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


def test_without_a_ca_the_trusted_cas_verify_and_refuse_an_unknown_issuer(
    server: Endpoint,
) -> None:
    assert "certificate verify failed" in _refusal(server.url())


def test_a_certificate_signed_by_another_ca_is_refused_in_one_line(
    server: Endpoint, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    text = _refusal(server.url(ssl_ca_certs=str(other)))
    assert "unable to get local issuer certificate" in text, text


def test_an_expired_certificate_is_refused_in_one_line(expired: Endpoint) -> None:
    # The same CA and host as the good endpoint's: only the dates differ.
    text = _refusal(expired.url(ssl_ca_certs=str(expired.ca_path)))
    assert "certificate has expired" in text, text


def test_a_certificate_for_another_host_is_refused_in_one_line(other_host: Endpoint) -> None:
    # Issued as the good endpoint's (same CA, for 127.0.0.1), served from 127.0.0.2.
    text = _refusal(other_host.url(ssl_ca_certs=str(other_host.ca_path)))
    assert "hostname '127.0.0.2' doesn't match" in text, text


def test_a_worker_on_a_refused_certificate_stops_instead_of_retrying(server: Endpoint) -> None:
    driver = connect(server.url())
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
    server: Endpoint, tmp_path: Path
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
        [str(hermes), "worker", "--url", server.url(), "--handlers", "tls_handlers:HANDLERS"],
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


# urllib3 warns on each request made without verification, as it should.
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_verification_is_off_only_when_the_url_says_so(server: Endpoint) -> None:
    driver = connect(server.url(ssl_cert_reqs="none"))
    try:
        driver.send(Message("tls"))  # an unknown issuer, and no complaint: as asked
    finally:
        driver.teardown()
        driver.close()
    with pytest.raises(ConfigurationError, match="ssl_cert_reqs"):
        connect(server.url(ssl_cert_reqs="optional"))
    with pytest.raises(ConfigurationError, match="no use with ssl_cert_reqs=none"):
        connect(server.url(ssl_cert_reqs="none", ssl_ca_certs=str(server.ca_path)))
