"""DriverUrl: the one URL parser every driver uses, and password redaction."""

from __future__ import annotations

import subprocess
import sys
import urllib.parse

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hermes.core import ConfigurationError, redact_url
from hermes.core.driver import DriverUrl
from hermes.core.spi._url import is_secret_option, unquote


def test_every_part_of_a_url_is_parsed() -> None:
    url = DriverUrl.parse("AMQP://us%40er:p%2Fss@Broker.example:5672/my%20vhost?prefetch=10&x=")

    assert url.scheme == "amqp"
    assert (url.username, url.password) == ("us@er", "p/ss")
    assert (url.host, url.port) == ("broker.example", 5672)
    assert url.path == "my vhost"
    assert dict(url.options) == {"prefetch": "10", "x": ""}


def test_a_url_without_credentials_port_path_or_options_has_none_of_them() -> None:
    url = DriverUrl.parse("redis://localhost")

    assert (url.username, url.password, url.port, url.path, dict(url.options)) == (
        None,
        None,
        None,
        "",
        {},
    )


def test_a_path_without_host_is_kept() -> None:
    url = DriverUrl.parse("file:///var/spool/hermes")

    assert url.host is None
    assert url.path == "var/spool/hermes"


def test_a_url_without_a_scheme_is_refused_with_an_example() -> None:
    with pytest.raises(ConfigurationError, match=r"needs a scheme, e\.g\. redis://"):
        DriverUrl.parse("/just/a/path")


def test_an_invalid_port_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="invalid port"):
        DriverUrl.parse("redis://localhost:99999/0")


def test_an_option_given_twice_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="'db' appears twice"):
        DriverUrl.parse("redis://h/?db=1&db=2")


def test_typed_getters_convert_and_default() -> None:
    url = DriverUrl.parse("x://h?n=7&f=0.25&on=yes&off=False&s=text")

    assert url.get_int("n", 1) == 7
    assert url.get_int("missing", 3) == 3
    assert url.get_float("f", 1.0) == 0.25
    assert url.get_float("n", 1.0) == 7.0
    assert url.get_bool("on", False) is True
    assert url.get_bool("off", True) is False
    assert url.get_bool("missing", True) is True
    assert url.get_str("s", "d") == "text"
    assert url.get_str("missing", "d") == "d"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda u: u.get_int("v", 1),
            r"option v='abc' in 'x://u:\*\*\*@h\?v=abc' must be an integer",
        ),
        (lambda u: u.get_float("v", 1.0), r"option v='abc' .* must be a number"),
        (lambda u: u.get_bool("v", True), r"option v='abc' .* must be true or false"),
    ],
)
def test_a_wrong_option_value_names_the_option_the_value_and_the_expected_type(
    call: object, message: str
) -> None:
    url = DriverUrl.parse("x://u:secret@h?v=abc")

    with pytest.raises(ConfigurationError, match=message) as caught:
        call(url)  # type: ignore[operator]

    assert "secret" not in str(caught.value)


def test_a_value_below_the_minimum_is_refused() -> None:
    url = DriverUrl.parse("x://h?n=0&f=-1.5")

    with pytest.raises(ConfigurationError, match=r"n='0' .* must be an integer >= 1"):
        url.get_int("n", 5, minimum=1)
    with pytest.raises(ConfigurationError, match=r"f='-1.5' .* must be a number >= 0"):
        url.get_float("f", 5.0, minimum=0.0)


def test_unknown_options_are_refused_listing_the_allowed_ones() -> None:
    url = DriverUrl.parse("redis://h/0?colour=blue&queue=jobs&size=3")

    with pytest.raises(
        ConfigurationError,
        match=r"unknown option\(s\) colour, size in .*; redis:// accepts: priority, queue",
    ):
        url.reject_unknown(["queue", "priority"])


def test_unknown_keyword_options_are_refused_listing_the_accepted_ones_and_the_hint() -> None:
    url = DriverUrl.parse("redis://h/0")

    url.reject_unknown_keywords({"client": object()}, ["client"])
    with pytest.raises(ConfigurationError) as info:
        url.reject_unknown_keywords({"pool": 1, "client": 2, "colour": 3}, ["client"], "a hint")

    assert str(info.value) == (
        "unknown keyword option(s) colour, pool for redis://; accepted: client - a hint"
    )


def test_known_options_pass() -> None:
    DriverUrl.parse("redis://h/0?queue=jobs").reject_unknown({"queue"})


def test_with_options_adds_and_replaces_options() -> None:
    url = DriverUrl.parse("redis://h:1/0?queue=a")

    derived = DriverUrl.parse(url.with_options(queue="b", prefix="t"))

    assert dict(derived.options) == {"queue": "b", "prefix": "t"}
    assert (derived.host, derived.port, derived.path) == ("h", 1, "0")


def test_with_path_replaces_the_path() -> None:
    url = DriverUrl.parse("file:///tmp/q?x=1")

    derived = DriverUrl.parse(url.with_path("/tmp/other dir"))

    assert (derived.host, derived.path) == (None, "tmp/other dir")
    assert dict(derived.options) == {"x": "1"}
    assert url.with_path("tmp/other dir") == url.with_path("/tmp/other dir")


def test_with_path_keeps_host_and_port() -> None:
    url = DriverUrl.parse("redis://u:p@h:1/0")

    assert url.with_path("5") == "redis://u:p@h:1/5"


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("amqp://guest:guest@localhost:5672/", "amqp://guest:***@localhost:5672/"),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("amqp://user:p@ss@host/vhost", "amqp://user:***@host/vhost"),
        ("sqs://key:sec@h?x=a@b", "sqs://key:***@h?x=a@b"),
        ("redis://h:6379/0?x=a@b", "redis://h:6379/0?x=a@b"),
        ("redis://user@h/0", "redis://user@h/0"),
        (
            "from amqp://a:b@h1/ to redis://:c@h2/0 failed",
            "from amqp://a:***@h1/ to redis://:***@h2/0 failed",
        ),
    ],
)
def test_redact_url_masks_every_password_and_nothing_else(text: str, redacted: str) -> None:
    assert redact_url(text) == redacted


def test_a_parsed_url_shows_no_password_when_redacted_or_printed() -> None:
    url = DriverUrl.parse("amqp://guest:s3cret@localhost/?heartbeat=5")

    assert url.password == "s3cret"
    assert url.redacted == "amqp://guest:***@localhost/?heartbeat=5"
    assert "s3cret" not in repr(url)
    assert "s3cret" not in str(url)
    assert "s3cret" not in f"{[url]}"


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        (
            "kafka://host/t?sasl.password=s3cr3t&bogus=1",
            "kafka://host/t?sasl.password=***&bogus=1",
        ),
        (
            "unknown option(s) bogus in 'kafka://h/t?ssl.key.password=x&group=g'",
            "unknown option(s) bogus in 'kafka://h/t?ssl.key.password=***&group=g'",
        ),
        (
            "sqs://q?aws_secret_access_key=AK&region=eu",
            "sqs://q?aws_secret_access_key=***&region=eu",
        ),
        ("x://h?apiKey=1&private_key=2&token=3", "x://h?apiKey=***&private_key=***&token=***"),
        ("kafka://h/t?ssl.key.pem=-----BEGIN", "kafka://h/t?ssl.key.pem=***"),
        ("amqp://u:p@h/?passwd=a&x=b", "amqp://u:***@h/?passwd=***&x=b"),
        (
            "{'sasl.password': 'abc', 'bootstrap.servers': 'h:1'}",
            "{'sasl.password': '***', 'bootstrap.servers': 'h:1'}",
        ),
    ],
)
def test_redact_url_masks_every_option_whose_name_marks_a_secret(text: str, redacted: str) -> None:
    assert redact_url(text) == redacted


@pytest.mark.parametrize(
    "text",
    [
        "redis://h/0?key=hermes&schedule_key=hermes_schedule&prefix=app:",
        "amqp://h/?queue=q&x-dead-letter-routing-key=dead",
        "kafka://h/t?ssl_keyfile=/etc/k.pem&sasl.kerberos.keytab=/etc/k.tab",
        "sqs://q?region=eu&endpoint_url=http%3A%2F%2Flocalhost%3A5000",
    ],
)
def test_redact_url_leaves_options_that_are_not_secrets_alone(text: str) -> None:
    assert redact_url(text) == text


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("password", True),
        ("sasl.password", True),
        ("ssl.keystore.password", True),
        ("aws_secret_access_key", True),
        ("sasl.oauthbearer.client.secret", True),
        ("secretAccessKey", True),
        ("sessionToken", True),
        ("api_key", True),
        ("key", False),
        ("schedule_key", False),
        ("x-dead-letter-routing-key", False),
        ("queue", False),
        ("passive", False),
    ],
)
def test_is_secret_option_reads_the_words_of_the_name(name: str, secret: bool) -> None:
    assert is_secret_option(name) is secret


def test_a_wrong_value_of_a_secret_option_is_not_quoted_in_the_error() -> None:
    url = DriverUrl.parse("x://h?token=s3cr3t-not-a-number")

    with pytest.raises(
        ConfigurationError, match=r"option token=\*\*\* .* must be an integer"
    ) as caught:
        url.get_int("token", 0)

    assert "s3cr3t" not in str(caught.value)


def test_a_parsed_url_shows_no_secret_option_when_redacted_or_printed() -> None:
    url = DriverUrl.parse("kafka://h:9092/t?sasl.password=s3cr3t&group=g")

    assert url.options["sasl.password"] == "s3cr3t"
    assert url.redacted == "kafka://h:9092/t?sasl.password=***&group=g"
    assert "s3cr3t" not in repr(url)
    with pytest.raises(ConfigurationError) as caught:
        url.reject_unknown(["group"])
    assert "s3cr3t" not in str(caught.value)


# DriverUrl splits plain ASCII URLs itself and hands any other to urllib.parse;
# either way it must read a URL as urllib.parse does. What it read with urllib.parse:


def _read_by_urllib(url: str) -> object:
    """The parts ``DriverUrl.parse`` gave ``url`` when it used urllib.parse, or the refusal."""
    try:
        parts = urllib.parse.urlsplit(url)
        if not parts.scheme:
            return "no scheme"
        items = parts.netloc.rpartition("@")[2].split(",")
        hosts = []
        for item in items:
            one = urllib.parse.urlsplit("//" + item)
            port = one.port
            if one.hostname:
                hosts.append((one.hostname, port))
            elif len(items) > 1:
                return "empty host"
        host, port = hosts[0] if hosts else (None, parts.port)
        options: dict[str, str] = {}
        for key, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
            if key in options:
                return "option twice"
            options[key] = value
    except ValueError:
        return "invalid"

    def decoded(text: str | None) -> str | None:
        return None if text is None else urllib.parse.unquote(text)

    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return (
        parts.scheme,
        decoded(parts.username),
        decoded(parts.password),
        host,
        port,
        urllib.parse.unquote(path),
        options,
        tuple(hosts),
    )


def _read_by_hermes(url: str) -> object:
    try:
        got = DriverUrl.parse(url)
    except ConfigurationError as exc:
        for words, refusal in (
            ("needs a scheme", "no scheme"),
            ("lists an empty host", "empty host"),
            ("appears twice", "option twice"),
            ("invalid port", "invalid"),
            ("not a valid URL", "invalid"),
        ):
            if words in str(exc):
                return refusal
        raise
    return (
        got.scheme,
        got.username,
        got.password,
        got.host,
        got.port,
        got.path,
        dict(got.options),
        got.hosts,
    )


#: Pieces a broker URL is made of, and the characters that trip parsers up.
# fmt: off
_URL_PIECES = st.sampled_from([
    *"abcXYZ019:/?#@%[]=&+,.-_~!$'()*; \t\x00é",
    "redis", "amqp+ssl", "://", "//", "%41", "%2F", "%40", "%C3%A9", "%E2%82", "%zz", "%4",
    "localhost", "Host.Example", "[::1]", "[fe80::1%eTh0]", "[v1.x]", ":6379", ":0",
    ":65536", ":-1", ":٣", "?a=1", "&a=2", "&b", "=x", "user:p@ss@", "h1:1,h2:2",
])
_ESCAPE_PIECES = st.sampled_from(["%", "%4", "%41", "%c3", "%A9", "%E2%82%AC", "%ff", "é", "+"])
# fmt: on
_HEADS = st.sampled_from(
    ["redis://", "amqp://u:p@", "x://h", "kafka://h:1,", "file:", "redis:/", ""]
)


@settings(max_examples=3000, deadline=None)
@given(st.tuples(_HEADS, st.lists(_URL_PIECES, max_size=14)).map(lambda t: t[0] + "".join(t[1])))
@example("redis://u%3Ax:p%40ss@Host:6379/0?db=1&x=&y")
@example("redis://[::1]:6379/0")
@example("kafka://h1:9092,,h2:9092/t")
@example("1redis://h")
@example(" redis://h\t/0")
@example("redis://h:12:34/0")
@example("redis://h:65536/0")
@example("redis://u@h#x/y?z=1")
@example("redis://h?x=1#/y")
def test_a_url_is_read_as_urllib_parse_reads_it(url: str) -> None:
    assert _read_by_hermes(url) == _read_by_urllib(url)


@settings(max_examples=1000, deadline=None)
@given(st.lists(_ESCAPE_PIECES, max_size=10).map("".join) | st.text())
def test_escapes_are_decoded_as_urllib_parse_decodes_them(text: str) -> None:
    assert unquote(text) == urllib.parse.unquote(text)


def test_a_plain_url_is_read_without_importing_urllib_parse() -> None:
    # urllib.parse, with the ipaddress module it imports, is 0.4 MB of a worker's
    # memory; C client libraries (librdkafka) do not import it themselves.
    code = (
        "import sys; from hermes.core.driver import DriverUrl; "
        "url = DriverUrl.parse('kafka://u:p%40ss@h1:9092,h2/t?group=g&x='); "
        "DriverUrl.parse('redis://[::1]:6379/0') if sys.argv[1:] else None; "
        "print(url.password, url.hosts, sorted({'urllib.parse', 'ipaddress'} & set(sys.modules)))"
    )
    run = [sys.executable, "-c", code]
    plain = subprocess.run(run, capture_output=True, text=True, check=True)
    ipv6 = subprocess.run([*run, "ipv6"], capture_output=True, text=True, check=True)

    assert plain.stdout.split() == ["p@ss", "(('h1',", "9092),", "('h2',", "None))", "[]"]
    assert ipv6.stdout.split()[-2:] == ["['ipaddress',", "'urllib.parse']"]
