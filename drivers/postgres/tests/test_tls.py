"""TLS to PostgreSQL: a server of the test's own with a certificate from a CA the test makes.

libpq's ``sslmode`` decides, as everywhere else; a URL that names a root
certificate without an ``sslmode`` verifies fully (``verify-full``). Each bad
certificate -- another CA's, expired, another host's -- is refused in one
line that says what to change.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hermes_test_support import refused_send

from hermes.core import ConfigurationError, Message, connect
from hermes.core.driver import DriverUrl
from hermes.drivers.postgres._plugin import conninfo

trustme = pytest.importorskip("trustme")

BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"))), None)


class Server:
    def __init__(self, data: Path, port: int, ca: Any) -> None:
        self.data, self.port, self.ca = data, port, ca
        self.ca_path = data.parent / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_path))

    def url(self, host: str = "127.0.0.1", **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"table": "hermes_tls", **options}.items())
        return f"postgresql://postgres@{host}:{self.port}/postgres?{query}"

    def use_cert(self, cert: Any) -> None:
        """Serve ``cert`` from now on (a configuration reload, as an operator would)."""
        cert.cert_chain_pems[0].write_to_path(str(self.data / "server.crt"))
        cert.private_key_pem.write_to_path(str(self.data / "server.key"))
        for name in ("server.crt", "server.key"):
            shutil.chown(self.data / name, "postgres", "postgres")
        os.chmod(self.data / "server.key", 0o600)
        with psycopg.connect(host=str(self.data), port=self.port, user="postgres") as conn:
            conn.execute("SELECT pg_reload_conf()")


def _as_postgres(*argv: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv]


def _wait_until_ready(data: Path, port: int, process: subprocess.Popen[bytes]) -> None:
    """Until the server answers a query: it listens before it has finished starting up
    ("the database system is starting up"), longer on a busy machine."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with psycopg.connect(host=str(data), port=port, user="postgres") as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError as exc:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the test's PostgreSQL server did not start: {exc}") from exc
            time.sleep(0.1)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    import hermes_test_services

    if BIN is None or shutil.which("runuser") is None or os.geteuid() != 0:
        pytest.skip("needs PostgreSQL's server binaries and root (to run them as postgres)")
    # Not under pytest's tmp_path: the postgres user must reach the directory.
    root = Path(tempfile.mkdtemp(prefix="hermes-pg-tls-"))
    os.chmod(root, 0o755)
    data = root / "data"
    data.mkdir()
    shutil.chown(data, "postgres", "postgres")
    subprocess.run(
        _as_postgres(str(BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    ca = trustme.CA()
    port = hermes_test_services.free_port()
    server = Server(data, port, ca)
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(data / "server.crt"))
    cert.private_key_pem.write_to_path(str(data / "server.key"))
    for name in ("server.crt", "server.key"):
        shutil.chown(data / name, "postgres", "postgres")
    os.chmod(data / "server.key", 0o600)
    process = subprocess.Popen(
        _as_postgres(
            str(BIN / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={data}",
            "-c",
            "ssl=on",
            "-c",
            "fsync=off",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        hermes_test_services.wait_for_port(port, 60, "postgres", process)
        _wait_until_ready(data, port, process)
        yield server
    finally:
        process.terminate()
        process.wait(30)
        shutil.rmtree(root, ignore_errors=True)


def _refusal(url: str) -> str:
    return refused_send(url, "ssl_ca_certs=PATH")


def test_a_root_certificate_without_sslmode_means_verify_full() -> None:
    settings = conninfo(DriverUrl.parse("postgresql://u@db:5432/app?sslrootcert=/ca.pem"))
    assert "sslmode=verify-full" in settings
    kept = conninfo(DriverUrl.parse("postgresql://u@db:5432/app?sslmode=require"))
    assert "sslmode=require" in kept and "verify" not in kept


def test_the_tls_options_every_driver_takes_become_libpq_s(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    base = "postgresql://u@db:5432/app?"

    settings = conninfo(DriverUrl.parse(f"{base}ssl_ca_certs={ca}"))
    assert "sslmode=verify-full" in settings and f"sslrootcert={ca}" in settings
    no_host = conninfo(DriverUrl.parse(f"{base}ssl_ca_certs={ca}&ssl_check_hostname=false"))
    assert "sslmode=verify-ca" in no_host
    assert "sslmode=require" in conninfo(DriverUrl.parse(f"{base}ssl_cert_reqs=none"))
    with pytest.raises(ConfigurationError, match="both ssl_cert_reqs and sslmode"):
        conninfo(DriverUrl.parse(f"{base}ssl_cert_reqs=none&sslmode=require"))
    with pytest.raises(ConfigurationError, match="needs TLS: leave out sslmode=disable"):
        conninfo(DriverUrl.parse(f"{base}ssl_ca_certs={ca}&sslmode=disable"))


def test_verify_full_with_the_ca_connects_and_carries_messages(server: Server) -> None:
    driver = connect(server.url(sslmode="verify-full", sslrootcert=str(server.ca_path)))
    try:
        message = Message("tls")
        driver.send(message)
        with driver.consumer([]) as consumer:
            received = consumer.receive(1)
            assert received is not None and message.id.encode() in bytes(received.body)
            consumer.ack(received)
        with psycopg.connect(
            conninfo(DriverUrl.parse(server.url(sslrootcert=str(server.ca_path))))
        ) as conn:
            assert conn.pgconn.ssl_in_use
    finally:
        driver.teardown()
        driver.close()


def test_a_certificate_signed_by_another_ca_is_refused_in_one_line(
    server: Server, tmp_path: Path
) -> None:
    other = tmp_path / "other.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    assert "certificate verify failed" in _refusal(server.url(sslrootcert=str(other)))


def test_a_certificate_for_another_host_is_refused_in_one_line(server: Server) -> None:
    text = _refusal(server.url(host="localhost", sslrootcert=str(server.ca_path)))
    assert "does not match host name" in text, text


def test_ssl_ca_certs_verifies_as_sslrootcert_does(server: Server) -> None:
    driver = connect(server.url(ssl_ca_certs=str(server.ca_path)))
    try:
        driver.send(Message("tls"))
    finally:
        driver.teardown()
        driver.close()
    text = _refusal(server.url(host="localhost", ssl_ca_certs=str(server.ca_path)))
    assert "does not match host name" in text, text


def test_an_expired_certificate_is_refused_in_one_line(server: Server) -> None:
    now = datetime.datetime.now(datetime.UTC)
    good = server.ca.issue_cert("127.0.0.1")
    server.use_cert(
        server.ca.issue_cert(
            "127.0.0.1",
            not_before=now - datetime.timedelta(days=30),
            not_after=now - datetime.timedelta(days=1),
        )
    )
    try:
        url = server.url(sslrootcert=str(server.ca_path))
        deadline = time.monotonic() + 10  # the reload is asynchronous
        while True:
            try:
                text = _refusal(url)
                break
            except pytest.fail.Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        # libpq reports OpenSSL's reason only as "certificate verify failed".
        assert "certificate verify failed" in text, text
    finally:
        server.use_cert(good)
