"""TLS to a broker: the URL options every driver reads, and a certificate the client refused.

Every driver that talks TLS takes the same five options in its URL, with one
meaning, and maps them onto its client (redis-py's arguments, an
``ssl.SSLContext`` for pika, botocore's ``verify``, librdkafka's ``ssl.*``
settings, libpq's ``ssl*`` parameters):

======================  ==========================================================
``ssl_ca_certs``        PEM file of the CA that signed the server's certificate
                        (default: the CAs the client trusts, the system's)
``ssl_certfile``        PEM file of a client certificate, for a server that asks
``ssl_keyfile``         its private key, when ``ssl_certfile`` does not hold it
``ssl_cert_reqs``       ``required`` (default): verify the server's certificate;
                        ``none``: do not
``ssl_check_hostname``  ``true`` (default): the certificate must name the URL's
                        host; ``false``: any host's will do (it is still verified)
======================  ==========================================================

A certificate that does not verify is :class:`CertificateRefusedError`, with
one line that says what to change, whichever driver met it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hermes.core.model._errors import BrokerRefusedError, ConfigurationError, error_text
from hermes.core.spi._url import DriverUrl

if TYPE_CHECKING:
    import ssl

#: The values of ``ssl_cert_reqs``.
_CERT_REQS = ("required", "none")
#: Why ``ssl_cert_reqs=optional`` (redis-py's, ``ssl.CERT_OPTIONAL``) is not one of them.
_OPTIONAL_MEANT = " (a client verifies any certificate it is shown: write required)"
#: What clients say when a certificate did not verify, where they keep only a text
#: (libpq, librdkafka) or wrap the ``ssl`` error in one of their own.
_REFUSED_TEXTS = ("certificate verify failed",)
#: How far down ``__cause__``/``__context__`` a client's wrapping may put ``ssl``'s error.
_CHAIN_DEPTH = 8


@dataclass(frozen=True)
class TlsOptions:
    """A URL's TLS options, checked; what a driver hands its client.

    Read with :meth:`from_url`. A driver maps each field onto its client's own
    setting; it never reads the ``ssl_*`` options itself.
    """

    #: Every option name, for :meth:`DriverUrl.reject_unknown`.
    NAMES: ClassVar[tuple[str, ...]] = (
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_cert_reqs",
        "ssl_check_hostname",
    )

    #: The CA file that verifies the server (None: the client's own CAs).
    ca_file: str | None = None
    #: The client certificate, for a server that asks for one (None: none).
    cert_file: str | None = None
    #: The client certificate's key, when it is not in :attr:`cert_file`.
    key_file: str | None = None
    #: Whether the server's certificate is verified (``ssl_cert_reqs=required``).
    verify: bool = True
    #: Whether the certificate must name the URL's host; never while not :attr:`verify`.
    check_hostname: bool = True

    @classmethod
    def from_url(
        cls,
        url: DriverUrl,
        *,
        tls: bool | None,
        how: str,
        native: Mapping[str, str] | None = None,
    ) -> TlsOptions | None:
        """``url``'s TLS options, or None when it does not ask for TLS.

        ``tls`` is whether the URL asks for TLS by itself (its scheme, a
        ``security.protocol``); None where nothing else says, and an option
        given then asks for TLS. An option on a URL that does not ask for
        TLS is refused with ``how`` to ask for it (``"use rediss://"``).
        ``native`` maps an option to the client's own name for the same
        setting, which the driver takes too (``ssl_ca_certs`` ->
        ``sslrootcert``): a URL that gives both is refused.

        Raises :class:`ConfigurationError`, naming the option, for a value
        that is not one, a key without its certificate, a CA with
        verification off, and a file that is not there or not readable.
        """
        given = [name for name in cls.NAMES if name in url.options]
        for name in given:
            other = (native or {}).get(name)
            if other is not None and other in url.options:
                raise ConfigurationError(
                    f"{url.redacted!r} gives both {name} and {other}, which mean the same: give one"
                )
        if tls is False or (tls is None and not given):
            if given:
                raise ConfigurationError(f"option {given[0]} in {url.redacted!r} needs TLS: {how}")
            return None
        cert_reqs = url.get_str("ssl_cert_reqs", "required")
        if cert_reqs not in _CERT_REQS:
            why = _OPTIONAL_MEANT if cert_reqs == "optional" else ""
            raise ConfigurationError(
                f"ssl_cert_reqs in {url.redacted!r} must be one of {', '.join(_CERT_REQS)}, "
                f"got {cert_reqs!r}{why}"
            )
        verify = cert_reqs == "required"
        check_hostname = url.get_bool("ssl_check_hostname", True)  # read even when unused
        options = cls(
            ca_file=url.options.get("ssl_ca_certs") or None,
            cert_file=url.options.get("ssl_certfile") or None,
            key_file=url.options.get("ssl_keyfile") or None,
            verify=verify,
            check_hostname=verify and check_hostname,
        )
        if options.ca_file and not verify:
            raise ConfigurationError(
                f"{url.redacted!r}: ssl_ca_certs has no use with ssl_cert_reqs=none"
            )
        if options.key_file and not options.cert_file:
            raise ConfigurationError(
                f"ssl_keyfile in {url.redacted!r} needs ssl_certfile: the client certificate "
                "it is for"
            )
        for name, path in (
            ("ssl_ca_certs", options.ca_file),
            ("ssl_certfile", options.cert_file),
            ("ssl_keyfile", options.key_file),
        ):
            # Checked here, at connect(): the client would find out at each
            # connection, as a server it cannot reach.
            if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise ConfigurationError(
                    f"{url.redacted!r}: the TLS files it names cannot be used - {name} names "
                    f"{path!r}, which is not a readable file"
                )
        return options

    def files(self, ca: str, cert: str, key: str) -> dict[str, str]:
        """The files given, under the client's names for the CA, certificate and key files."""
        named = ((ca, self.ca_file), (cert, self.cert_file), (key, self.key_file))
        return {name: path for name, path in named if path}

    def context(self, url: DriverUrl) -> ssl.SSLContext:
        """An ``ssl.SSLContext`` of these options, for a client that takes one.

        Raises :class:`ConfigurationError` when a file is not PEM, or the key
        does not match the certificate.
        """
        import ssl

        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ValueError) as exc:
            raise ConfigurationError(
                f"{url.redacted!r}: the TLS files it names cannot be used - {error_text(exc)}"
            ) from exc
        context.check_hostname = self.check_hostname  # off before verification can be
        if not self.verify:
            context.verify_mode = ssl.CERT_NONE
        return context


class CertificateRefusedError(BrokerRefusedError):
    """The server's TLS certificate did not verify: another CA's, expired, or another host's.

    Retrying cannot make it verify: a worker stops, and ``hermes`` exits 2.
    The text ends with what to change, the same for every driver.
    """

    #: What to change, appended to the text of every refusal of a certificate.
    hint = (
        "the server's TLS certificate was not accepted: give the CA that signed it "
        "(ssl_ca_certs=PATH in the URL), renew an expired certificate, or connect by a "
        "host name the certificate names"
    )

    def __init__(self, text: str) -> None:
        # BrokerRefusedError's own, not super()'s: a driver's subclass that also
        # derives from its refusal with a hint of its own gets this hint once.
        BrokerRefusedError.__init__(self, f"{text} - {self.hint}")

    @staticmethod
    def in_chain(
        exc: BaseException,
        *kinds: type[BaseException],
        texts: tuple[str, ...] = (),
    ) -> bool:
        """Whether ``exc``, or what it was raised from, is a certificate that did not verify.

        Each exception down ``__cause__`` and ``__context__`` counts when it is
        ``ssl``'s ``SSLCertVerificationError``, one of ``kinds`` (a client's
        own class for it: urllib3's host name mismatch), or its text says
        ``certificate verify failed`` or one of ``texts`` (a client that keeps
        only OpenSSL's words: libpq, librdkafka). Any other TLS failure, a
        handshake cut short, is not a refusal: the server may be back.
        """
        import ssl

        refused: tuple[type[BaseException], ...] = (ssl.SSLCertVerificationError, *kinds)
        needles = (*_REFUSED_TEXTS, *texts)
        seen: BaseException | None = exc
        for _ in range(_CHAIN_DEPTH):
            if seen is None:
                return False
            if isinstance(seen, refused):
                return True
            text = str(seen).lower()
            if any(needle.lower() in text for needle in needles):
                return True
            seen = seen.__cause__ or seen.__context__
        return False
