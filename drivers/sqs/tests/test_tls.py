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

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

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

#: Any region: the local server takes them all.
REGION = "us-east-1"
#: What every refusal of a certificate tells the user to look at.
HINT = "ssl_ca_certs=PATH"


@dataclass
class Endpoint:
    """A local SQS server that speaks TLS at ``endpoint``, and the CA file that verifies it."""

    endpoint: str
    ca_path: Path

    def url(self, **options: str) -> str:
        query = {"region": REGION, "endpoint_url": quote(self.endpoint, safe=""), **options}
        name = f"t-{secrets.token_hex(6)}"
        return f"sqs://{name}?" + "&".join(f"{key}={value}" for key, value in query.items())


def _serve(tmp: Path, ca: Any, cert: Any, host: str = "127.0.0.1") -> Iterator[Endpoint]:
    ca_path, cert_path, key_path = write_certificates(tmp, ca, cert)
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
    yield from _serve(tmp_path_factory.mktemp("sqs-expired"), ca, expired_certificate(ca))


@pytest.fixture(scope="module")
def other_host(ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """An endpoint on 127.0.0.2 (loopback too) whose certificate names 127.0.0.1 only."""
    tmp = tmp_path_factory.mktemp("sqs-other-host")
    yield from _serve(tmp, ca, ca.issue_cert("127.0.0.1"), host="127.0.0.2")


def test_an_https_endpoint_with_the_ca_verifies_and_a_worker_handles_a_message(
    server: Endpoint,
) -> None:
    message, _ = handled_by_a_worker(server.url(ssl_ca_certs=str(server.ca_path)))
    assert message.payload == {"secret": "only on the wire encrypted"}


def test_without_a_ca_the_trusted_cas_verify_and_refuse_an_unknown_issuer(
    server: Endpoint,
) -> None:
    refused_send(server.url(), "certificate verify failed", HINT)


def test_a_certificate_signed_by_another_ca_is_refused_in_one_line(
    server: Endpoint, tmp_path: Path
) -> None:
    url = server.url(ssl_ca_certs=str(other_ca_file(tmp_path)))
    refused_send(url, "unable to get local issuer certificate", HINT)


def test_an_expired_certificate_is_refused_in_one_line(expired: Endpoint) -> None:
    # The same CA and host as the good endpoint's: only the dates differ.
    refused_send(expired.url(ssl_ca_certs=str(expired.ca_path)), "certificate has expired", HINT)


def test_a_certificate_for_another_host_is_refused_in_one_line(other_host: Endpoint) -> None:
    # Issued as the good endpoint's (same CA, for 127.0.0.1), served from 127.0.0.2.
    url = other_host.url(ssl_ca_certs=str(other_host.ca_path))
    refused_send(url, "hostname '127.0.0.2' doesn't match", HINT)


def test_a_worker_on_a_refused_certificate_stops_instead_of_retrying(server: Endpoint) -> None:
    worker_stops_refused(server.url(), "certificate verify failed")


def test_hermes_worker_on_a_refused_certificate_exits_2_with_one_line_and_no_traceback(
    server: Endpoint, tmp_path: Path
) -> None:
    line = refused_worker_line(server.url(), tmp_path)
    assert "certificate verify failed" in line and HINT in line, line


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


def test_a_ca_file_that_is_not_there_is_refused_at_connect(
    server: Endpoint, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(ConfigurationError, match=r"no-such-ca\.pem.*not a readable file"):
        connect(server.url(ssl_ca_certs=str(missing)))
