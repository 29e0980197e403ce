from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hermes.core.model._errors import ConfigurationError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
#: What a masked secret is shown as.
MASK = "***"
# The patterns below are compiled on first use (``re`` caches them), not at
# import: a process that imports Hermes may never parse or redact a URL.
#
# The password runs to the LAST "@" of the authority, as urlsplit reads it: an
# unencoded "@" in a password ("user:p@ss@host") must not leave "ss" in a log.
_PASSWORD_IN_URL = (
    r"(?i)(?P<head>[a-z][a-z0-9+.-]*://[^:/?#@\s]*:)(?P<password>[^/?#\s]*)(?=@[^@/?#\s]*)"
)
# ``?name=value`` / ``&name=value`` of a query string, wherever it appears in a text;
# the value ends where a URL quoted in an error message would end.
_OPTION_IN_TEXT = r"(?P<head>[?&;](?P<name>[^=&;#?\s'\"]+)=)(?P<value>[^&;#\s'\"]*)"
# ``'name': 'value'``: an options dict printed with repr().
_OPTION_IN_DICT = (
    r"(?P<head>(?P<q>['\"])(?P<name>[^'\"]+)(?P=q)\s*:\s*(?P<q2>['\"]))(?P<value>.*?)(?P=q2)"
)
#: Words that make an option's value a secret wherever they appear in its name
#: (``sasl.password``, ``ssl.key.password``, ``aws_secret_access_key``, ``ssl.key.pem``).
_SECRET_WORDS = frozenset(
    {
        "auth",
        "apikey",
        "credential",
        "credentials",
        "jaas",
        "pass",
        "passphrase",
        "passwd",
        "password",
        "pem",
        "pwd",
        "secret",
        "token",
    }
)
#: Words that make a following ``key`` a secret (``api_key``, ``private_key``); a
#: bare ``key`` is not one -- Redis's queue ``key``, RabbitMQ's routing keys.
_SECRET_KEY_KINDS = frozenset(
    {"access", "account", "api", "client", "encryption", "master", "private", "secret", "signing"}
)


#: A URL :func:`_split` reads itself: printable ASCII without spaces, ``[`` or ``]``.
#: Any other (an IPv6 literal, a raw non-ASCII password, a stray tab) goes to
#: ``urllib.parse``, imported then: with the ``ipaddress`` module it imports, it is
#: 0.4 MB of a worker whose client library does not load it (librdkafka).
_PLAIN_URL = r"[!-Z\\^-~]*"
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*"
_ESCAPED = r"(?:%[0-9A-Fa-f]{2})+"


def unquote(text: str) -> str:
    """``text`` with its ``%XX`` escapes decoded as UTF-8 (``urllib.parse.unquote``'s result)."""
    if "%" not in text:
        return text
    return re.sub(_ESCAPED, _decoded, text)


def _decoded(escapes: re.Match[str]) -> str:
    # A run of escapes at once: one character may take several (%C3%A9 is "é").
    return bytes.fromhex(escapes.group().replace("%", "")).decode(errors="replace")


def _split(url: str) -> tuple[str, str, str, str]:
    """``(scheme, netloc, path, query)`` of ``url``, as ``urllib.parse.urlsplit`` reads them.

    Raises ``ValueError`` where urlsplit does (an unclosed ``[``).
    """
    if not re.fullmatch(_PLAIN_URL, url):
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        return parts.scheme, parts.netloc, parts.path, parts.query
    scheme, colon, rest = url.partition(":")
    if colon and re.fullmatch(_SCHEME, scheme):
        scheme = scheme.lower()
    else:
        scheme, rest = "", url
    netloc = ""
    if rest.startswith("//"):
        ends = [i for i in (rest.find(c, 2) for c in "/?#") if i >= 0]
        end = min(ends, default=len(rest))
        netloc, rest = rest[2:end], rest[end:]
    path, _, query = rest.partition("#")[0].partition("?")
    return scheme, netloc, path, query


def _host_port(item: str) -> tuple[str | None, int | None]:
    """``(hostname, port)`` of one ``host[:port]``, as urlsplit's ``hostname`` and ``port``.

    Raises ``ValueError`` for a port that is not a number from 0 to 65535.
    """
    if "[" in item or "]" in item:
        from urllib.parse import urlsplit

        one = urlsplit("//" + item)
        return one.hostname, one.port
    name, _, port = item.partition(":")
    if not port:
        number = None
    elif port.isdigit() and port.isascii():
        number = int(port)
        if number > 65535:
            raise ValueError("Port out of range 0-65535")
    else:
        raise ValueError(f"Port could not be cast to integer value as {port!r}")
    if not name:
        return None, number
    name, percent, zone = name.partition("%")
    return name.lower() + percent + zone, number


def _query(query: str) -> list[tuple[str, str]]:
    """The ``name=value`` pairs of ``query`` (``parse_qsl(query, keep_blank_values=True)``)."""
    pairs = []
    for item in query.split("&") if query else ():
        if item:
            name, _, value = item.partition("=")
            pairs.append((unquote(name.replace("+", " ")), unquote(value.replace("+", " "))))
    return pairs


def is_secret_option(name: str) -> bool:
    """Whether the option ``name`` (``sasl.password``, ``apiKey``...) holds a secret."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", unquote(name))
    words = re.findall(r"[a-z0-9]+", spaced.lower())
    if _SECRET_WORDS.intersection(words):
        return True
    return any(
        word == "key" and words[i - 1] in _SECRET_KEY_KINDS for i, word in enumerate(words) if i
    )


def _mask_option(match: re.Match[str]) -> str:
    if is_secret_option(match.group("name")) and match.group("value"):
        return match.group("head") + MASK + match.string[match.end("value") : match.end()]
    return match.group(0)


def redact_url(text: str) -> str:
    """``text`` with every secret of every URL in it replaced by ``***``.

    Masks the password of ``scheme://user:password@host`` and the value of every
    option whose name marks a secret (:func:`is_secret_option`), whether it is in
    a query string (``?sasl.password=...``) or a printed dict (``{'token': '...'}``).
    Hermes passes every URL, option and error text it logs, raises or prints
    through here.
    """
    password_in_url, option_in_text, option_in_dict = _redactors()
    text = password_in_url.sub(lambda m: m.group("head") + MASK, text)
    if "=" in text:
        text = option_in_text.sub(_mask_option, text)
    if ":" in text:
        text = option_in_dict.sub(_mask_option, text)
    return text


@functools.cache
def _redactors() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    # Compiled at the first redaction and kept: the CLI's log formatter redacts
    # every line a worker writes.
    return re.compile(_PASSWORD_IN_URL), re.compile(_OPTION_IN_TEXT), re.compile(_OPTION_IN_DICT)


def _host_port_of(item: str, url: str) -> tuple[str | None, int | None]:
    try:
        return _host_port(item)
    except ValueError as exc:
        raise ConfigurationError(f"{redact_url(url)!r} has an invalid port: {exc}") from exc


def _hosts(items: list[str], url: str) -> tuple[tuple[str, int | None], ...]:
    """The ``host[:port]`` items of an authority as ``(host, port)`` pairs."""
    hosts: list[tuple[str, int | None]] = []
    for item in items:
        host, port = _host_port_of(item, url)
        if host:
            hosts.append((host, port))
        elif len(items) > 1:
            raise ConfigurationError(f"{redact_url(url)!r} lists an empty host: {item!r}")
    return tuple(hosts)


@dataclass(frozen=True)
class DriverUrl:
    """A broker URL, parsed once for every driver the same way.

    ``scheme://user:password@host:port/path?option=value``; a broker that takes
    several seed hosts may list them, ``kafka://h1:9092,h2:9092/topic``
    (:attr:`hosts` has them all, :attr:`host`/:attr:`port` the first). Options are read
    through the typed getters, which name the option and the URL (password
    masked) when a value is wrong; :meth:`reject_unknown` lists the options a
    driver accepts when a URL carries one it does not know.
    """

    raw: str
    scheme: str
    username: str | None
    password: str | None
    host: str | None
    port: int | None
    #: The path without its leading ``/``, percent-decoded.
    path: str
    options: Mapping[str, str] = field(default_factory=dict)
    #: Every ``(host, port)`` of the authority, in order; one entry unless it lists several.
    hosts: tuple[tuple[str, int | None], ...] = ()

    @classmethod
    def parse(cls, url: str) -> DriverUrl:
        try:
            scheme, netloc, path, query = _split(url)
        except ValueError as exc:  # an unclosed "[" of an IPv6 literal
            raise ConfigurationError(f"{redact_url(url)!r} is not a valid URL: {exc}") from exc
        if not scheme:
            raise ConfigurationError(
                f"{redact_url(url)!r} is not a broker URL: it needs a scheme, e.g. redis://localhost:6379/0"
            )
        userinfo, at, hostinfo = netloc.rpartition("@")
        username, colon, password = userinfo.partition(":")
        hosts = _hosts(hostinfo.split(","), url)
        host, port = hosts[0] if hosts else (None, _host_port_of(hostinfo, url)[1])
        options: dict[str, str] = {}
        for key, value in _query(query):
            if key in options:
                raise ConfigurationError(f"option {key!r} appears twice in {redact_url(url)!r}")
            options[key] = value
        return cls(
            raw=url,
            scheme=scheme,
            username=unquote(username) if at else None,
            password=unquote(password) if colon else None,
            host=host,
            port=port,
            path=unquote(path[1:] if path.startswith("/") else path),
            options=options,
            hosts=hosts,
        )

    def __repr__(self) -> str:
        return f"DriverUrl({self.redacted!r})"

    @property
    def redacted(self) -> str:
        """The URL with its password and secret options masked, for logs, errors and ``repr()``."""
        return redact_url(self.raw)

    def reject_unknown(self, allowed: Iterable[str]) -> None:
        allowed = set(allowed)
        unknown = sorted(set(self.options) - allowed)
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {', '.join(unknown)} in {self.redacted!r}; "
                f"{self.scheme}:// accepts: {', '.join(sorted(allowed)) or 'no options'}"
            )

    def reject_unknown_keywords(
        self, options: Iterable[str], accepted: Iterable[str], hint: str = ""
    ) -> None:
        """Refuse keyword options of ``connect()`` that this URL's driver does not take."""
        accepted = set(accepted)
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise ConfigurationError(
                f"unknown keyword option(s) {', '.join(unknown)} for {self.scheme}://; "
                f"accepted: {', '.join(sorted(accepted)) or 'none'}"
                + (f" - {hint}" if hint else "")
            )

    def _bad(self, name: str, value: str, expected: str) -> ConfigurationError:
        shown = MASK if is_secret_option(name) else repr(value)
        return ConfigurationError(f"option {name}={shown} in {self.redacted!r} must be {expected}")

    def get_str(self, name: str, default: str) -> str:
        return self.options.get(name, default)

    def get_int(self, name: str, default: int, *, minimum: int | None = None) -> int:
        value = self.options.get(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise self._bad(name, value, "an integer") from None
        if minimum is not None and number < minimum:
            raise self._bad(name, value, f"an integer >= {minimum}")
        return number

    def get_float(self, name: str, default: float, *, minimum: float | None = None) -> float:
        value = self.options.get(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise self._bad(name, value, "a number") from None
        if minimum is not None and number < minimum:
            raise self._bad(name, value, f"a number >= {minimum}")
        return number

    def get_bool(self, name: str, default: bool) -> bool:
        value = self.options.get(name)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise self._bad(name, value, "true or false")

    def with_options(self, **options: str) -> str:
        """The raw URL with ``options`` added or replaced (used to derive test URLs)."""
        from urllib.parse import urlencode, urlsplit, urlunsplit

        parts = urlsplit(self.raw)
        merged = {**self.options, **options}
        return urlunsplit(parts._replace(query=urlencode(merged)))

    def with_path(self, path: str) -> str:
        """The raw URL with its path replaced by ``path`` (percent-encoded here).

        A leading ``/`` is optional: ``with_path("/tmp/q")`` and ``with_path("tmp/q")``
        give the same URL (a doubled slash would turn ``tmp`` into the host).
        """
        from urllib.parse import quote, urlsplit, urlunsplit

        parts = urlsplit(self.raw)
        return urlunsplit(parts._replace(path="/" + quote(path.lstrip("/"), safe="/")))
