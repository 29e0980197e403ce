"""TlsOptions and CertificateRefusedError: one set of TLS options, one refusal, every driver."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from hermes.core import BrokerRefusedError, ConfigurationError
from hermes.core.driver import DriverUrl
from hermes.core.drivertools import CertificateRefusedError, TlsOptions

trustme = pytest.importorskip("trustme")


def options(url: str, tls: bool | None = True, **native: str) -> TlsOptions | None:
    return TlsOptions.from_url(DriverUrl.parse(url), tls=tls, how="use tls://", native=native)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    client = ca.issue_cert("client.example")
    paths = {"ca": tmp / "ca.pem", "cert": tmp / "client.pem", "key": tmp / "client.key"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    client.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    client.private_key_pem.write_to_path(str(paths["key"]))
    return paths


def test_a_tls_url_without_options_verifies_the_certificate_and_its_host_name() -> None:
    assert options("tls://host") == TlsOptions(verify=True, check_hostname=True)


def test_a_url_without_tls_and_without_options_has_none() -> None:
    assert options("plain://host", tls=False) is None
    assert options("plain://host", tls=None) is None


def test_every_option_is_read_with_one_meaning(files: dict[str, Path]) -> None:
    url = (
        f"tls://host?ssl_ca_certs={files['ca']}&ssl_certfile={files['cert']}"
        f"&ssl_keyfile={files['key']}&ssl_check_hostname=false"
    )
    assert options(url) == TlsOptions(
        ca_file=str(files["ca"]),
        cert_file=str(files["cert"]),
        key_file=str(files["key"]),
        verify=True,
        check_hostname=False,
    )
    unverified = options("tls://host?ssl_cert_reqs=none")
    assert unverified is not None
    assert not unverified.verify and not unverified.check_hostname


def test_an_option_asks_for_tls_where_nothing_else_says(files: dict[str, Path]) -> None:
    tls = options(f"db://host?ssl_ca_certs={files['ca']}", tls=None)
    assert tls is not None and tls.ca_file == str(files["ca"])


def test_an_option_on_a_url_without_tls_is_refused_saying_how_to_ask_for_it() -> None:
    with pytest.raises(
        ConfigurationError, match=r"option ssl_cert_reqs in .* needs TLS: use tls://"
    ):
        options("plain://host?ssl_cert_reqs=none", tls=False)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("ssl_cert_reqs=maybe", r"ssl_cert_reqs in .* must be one of required, none, got 'maybe'"),
        ("ssl_cert_reqs=optional", r"got 'optional' \(a client verifies any certificate"),
        ("ssl_check_hostname=perhaps", r"option ssl_check_hostname='perhaps' .* true or false"),
        ("ssl_cert_reqs=none&ssl_check_hostname=perhaps", "ssl_check_hostname='perhaps'"),
        ("ssl_keyfile=KEY", "ssl_keyfile in .* needs ssl_certfile"),
        ("ssl_cert_reqs=none&ssl_ca_certs=CA", "ssl_ca_certs has no use with ssl_cert_reqs=none"),
    ],
)
def test_a_wrong_value_is_one_line_naming_the_option(
    files: dict[str, Path], query: str, expected: str
) -> None:
    query = query.replace("KEY", str(files["key"])).replace("CA", str(files["ca"]))
    with pytest.raises(ConfigurationError, match=expected) as caught:
        options(f"tls://user:s3cret@host?{query}")
    assert "\n" not in str(caught.value) and "s3cret" not in str(caught.value)


def test_a_file_that_is_not_there_is_refused_at_once(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(
        ConfigurationError,
        match=r"the TLS files it names cannot be used - ssl_ca_certs names .*no-such-ca\.pem.*"
        "not a readable file",
    ):
        options(f"tls://host?ssl_ca_certs={missing}")


def test_the_clients_own_name_for_an_option_and_ours_together_are_refused(
    files: dict[str, Path],
) -> None:
    url = f"db://host?ssl_ca_certs={files['ca']}&sslrootcert={files['ca']}"
    with pytest.raises(ConfigurationError, match="both ssl_ca_certs and sslrootcert"):
        options(url, tls=None, ssl_ca_certs="sslrootcert")
    assert (
        options(f"db://host?sslrootcert={files['ca']}", tls=None, ssl_ca_certs="sslrootcert")
        is None
    )


def test_the_files_given_come_under_the_clients_names() -> None:
    tls = TlsOptions(ca_file="/ca.pem", key_file=None, cert_file="/client.pem")

    assert tls.files("cafile", "certfile", "keyfile") == {
        "cafile": "/ca.pem",
        "certfile": "/client.pem",
    }
    assert TlsOptions().files("cafile", "certfile", "keyfile") == {}


def test_the_context_verifies_unless_told_not_to(files: dict[str, Path]) -> None:
    url = DriverUrl.parse(f"tls://host?ssl_ca_certs={files['ca']}&ssl_certfile={files['cert']}"
                          f"&ssl_keyfile={files['key']}")  # fmt: skip
    tls = TlsOptions.from_url(url, tls=True, how="")
    assert tls is not None
    context = tls.context(url)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.get_ca_certs()  # the CA file was loaded

    off = TlsOptions(verify=False, check_hostname=False).context(url)
    assert off.verify_mode == ssl.CERT_NONE and not off.check_hostname


def test_a_file_that_is_not_pem_is_refused_when_the_context_is_made(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    url = DriverUrl.parse(f"tls://host?ssl_ca_certs={junk}")
    tls = TlsOptions.from_url(url, tls=True, how="")
    assert tls is not None
    with pytest.raises(ConfigurationError, match="the TLS files it names cannot be used"):
        tls.context(url)


def test_a_refused_certificate_is_a_refusal_whose_line_says_what_to_change() -> None:
    error = CertificateRefusedError("<Driver>: refused while sending: SSLError: nope")

    assert isinstance(error, BrokerRefusedError)
    assert str(error) == f"<Driver>: refused while sending: SSLError: nope - {error.hint}"
    assert "ssl_ca_certs=PATH" in error.hint


def _raised_from(outer: Exception, inner: BaseException) -> Exception:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except Exception as caught:
        return caught


def test_the_refused_certificate_is_found_down_the_chain_a_client_wraps_it_in() -> None:
    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] nope")
    wrapped = _raised_from(ConnectionError("Error 1 connecting"), verify)

    assert CertificateRefusedError.in_chain(verify)
    assert CertificateRefusedError.in_chain(wrapped)


def test_a_clients_own_class_or_words_for_it_count_when_the_driver_names_them() -> None:
    class HostnameMismatch(ValueError):
        pass

    mismatch = _raised_from(OSError("SSL validation failed"), HostnameMismatch("other host"))
    assert not CertificateRefusedError.in_chain(mismatch)
    assert CertificateRefusedError.in_chain(mismatch, HostnameMismatch)

    libpq = Exception('server certificate for "db" does not match host name "other"')
    assert not CertificateRefusedError.in_chain(libpq)
    assert CertificateRefusedError.in_chain(libpq, texts=("does not match host name",))
    # librdkafka keeps only OpenSSL's words.
    assert CertificateRefusedError.in_chain(
        Exception("SSL handshake failed: certificate verify failed")
    )


def test_another_tls_failure_is_not_a_refused_certificate() -> None:
    cut_short = _raised_from(ConnectionError("reset"), ssl.SSLEOFError(8, "EOF occurred"))

    assert not CertificateRefusedError.in_chain(cut_short)
    assert not CertificateRefusedError.in_chain(ConnectionRefusedError(111, "refused"))


def test_a_chain_that_loops_ends() -> None:
    first, second = OSError("a"), OSError("b")
    first.__context__, second.__context__ = second, first

    assert not CertificateRefusedError.in_chain(first)
