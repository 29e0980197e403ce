"""Registers ``amqp://`` and ``amqps://`` with Hermes.

Every ``connect()`` loads this module, whatever the scheme: pika and the
driver are imported when a RabbitMQ driver is built, not here.
"""

from __future__ import annotations

import functools
import inspect
import ssl
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from hermes.core import ConfigurationError, hookimpl, redact_url
from hermes.core.driver import DriverPlugin, DriverUrl, error_text
from hermes.drivers.rabbitmq._capabilities import CAPABILITIES

if TYPE_CHECKING:
    import pika

    from hermes.drivers.rabbitmq._driver import LazyRabbitMqDriver

#: URL options of the driver itself (the query string is ``?queue=jobs&prefetch=10``).
DRIVER_OPTIONS = frozenset(
    {
        "queue",
        "prefetch",
        "refresh_interval",
        "consumer_tag",
        "durable",
        "confirm",
        "delay",
    }
)

#: Options earlier versions took, and why they are gone.
RETIRED_OPTIONS = {
    "reconnect_max_delay_s": (
        "the worker loop of hermes-core reconnects every driver, with a jittered backoff "
        "of at most 5 s"
    ),
}

#: URL options handed to pika's ``URLParameters`` as they are.
PIKA_OPTIONS = frozenset(
    {
        "heartbeat",
        "blocked_connection_timeout",
        "socket_timeout",
        "stack_timeout",
        "connection_attempts",
        "retry_delay",
        "channel_max",
        "frame_max",
        "locale",
    }
)

#: TLS options of an ``amqps://`` URL, named as the Redis driver's (Python's
#: ``ssl`` names). The server's certificate is verified against ``ssl_ca_certs``
#: (default: the system's CAs) and must name the URL's host, unless
#: ``ssl_cert_reqs=none`` or ``ssl_check_hostname=false`` say otherwise.
TLS_OPTIONS = frozenset(
    {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname"}
)
CERT_REQS = ("required", "none")

#: Queue arguments (``x-...`` options) that are strings or booleans; any other
#: ``x-...`` option that looks like an integer is sent as one.
STRING_ARGUMENTS = frozenset(
    {
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-queue-type",
        "x-overflow",
        "x-queue-mode",
        "x-queue-master-locator",
        "x-queue-leader-locator",
        "x-max-age",
    }
)
BOOL_ARGUMENTS = frozenset({"x-single-active-consumer"})


@functools.cache
def keyword_options() -> frozenset[str]:
    """Keyword options of ``connect()`` (objects a URL cannot carry, or overrides)."""
    from hermes.drivers.rabbitmq._driver import LazyRabbitMqDriver

    return frozenset(inspect.signature(LazyRabbitMqDriver).parameters) - {"parameters"}


def _queue_arguments(url: DriverUrl) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    for name in sorted(url.options):
        if not name.startswith("x-"):
            continue
        if name in STRING_ARGUMENTS:
            arguments[name] = url.get_str(name, "")
        elif name in BOOL_ARGUMENTS:
            arguments[name] = url.get_bool(name, False)
        else:
            value = url.get_str(name, "")
            try:
                arguments[name] = int(value)
            except ValueError:
                arguments[name] = value
    return arguments


def tls_context(url: DriverUrl) -> ssl.SSLContext | None:
    """The TLS context of an ``amqps://`` URL (None for ``amqp://``): verifying unless told not to.

    The files are read here, so a missing or unreadable one fails at
    ``connect()``, not at the first connection.
    """
    if url.scheme != "amqps":
        given = sorted(TLS_OPTIONS.intersection(url.options))
        if given:
            raise ConfigurationError(
                f"option {given[0]} in {url.redacted!r} needs TLS: use amqps://"
            )
        return None
    cert_reqs = url.get_str("ssl_cert_reqs", "required")
    if cert_reqs not in CERT_REQS:
        raise ConfigurationError(
            f"ssl_cert_reqs in {url.redacted!r} must be one of {', '.join(CERT_REQS)}, "
            f"got {cert_reqs!r}"
        )
    check_hostname = url.get_bool("ssl_check_hostname", True)
    certfile, keyfile = url.options.get("ssl_certfile"), url.options.get("ssl_keyfile")
    if keyfile and not certfile:
        raise ConfigurationError(
            f"ssl_keyfile in {url.redacted!r} needs ssl_certfile: the client certificate it is for"
        )
    try:
        context = ssl.create_default_context(cafile=url.options.get("ssl_ca_certs") or None)
        if certfile:
            context.load_cert_chain(certfile, keyfile or None)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(
            f"{url.redacted!r}: the TLS files it names cannot be used - {error_text(exc)}"
        ) from exc
    if cert_reqs == "none":
        context.check_hostname = False  # must be off before verification can be
        context.verify_mode = ssl.CERT_NONE
    elif not check_hostname:
        context.check_hostname = False
    return context


def _pika_parameters(url: DriverUrl) -> pika.URLParameters:
    import pika

    parts = urlsplit(url.raw)
    query = urlencode({k: v for k, v in url.options.items() if k in PIKA_OPTIONS})
    try:
        parameters = pika.URLParameters(urlunsplit(parts._replace(query=query, fragment="")))
    except ValueError as exc:
        raise ConfigurationError(
            f"{url.redacted!r} is not a usable RabbitMQ URL: {redact_url(str(exc))}"
        ) from exc
    context = tls_context(url)
    if context is not None:
        # pika's own context for amqps:// verifies too, but it takes a CA file
        # only as a Python literal in its ssl_options option.
        parameters.ssl_options = pika.SSLOptions(context)
    return parameters


def from_url(url: DriverUrl, **options: Any) -> LazyRabbitMqDriver:
    """Build the driver for ``amqp://user:pass@host:port/vhost?queue=NAME&...``."""
    from hermes.drivers.rabbitmq._driver import LazyRabbitMqDriver

    for name, why in RETIRED_OPTIONS.items():
        if name in url.options:
            raise ConfigurationError(f"{url.redacted!r}: {name} is no longer an option: {why}")
    try:
        url.reject_unknown(
            [
                *DRIVER_OPTIONS,
                *PIKA_OPTIONS,
                *TLS_OPTIONS,
                *(name for name in url.options if name.startswith("x-")),
            ]
        )
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"{exc}, and queue arguments x-... (e.g. x-dead-letter-exchange=dlx)"
        ) from None
    url.reject_unknown_keywords(options, keyword_options())
    if url.host is None:
        raise ConfigurationError(
            f"{url.redacted!r} names no host; e.g. amqp://guest:guest@localhost:5672/?queue=jobs"
        )
    kwargs: dict[str, Any] = {
        "queue": url.get_str("queue", "hermes"),
        "prefetch": url.get_int("prefetch", 1, minimum=1),
        "refresh_interval": url.get_float("refresh_interval", 0, minimum=0),
        "consumer_tag": url.get_str("consumer_tag", "hermes"),
        "durable": url.get_bool("durable", True),
        "confirm": url.get_bool("confirm", True),
        "delay": url.get_bool("delay", False),
        "queue_arguments": _queue_arguments(url),
    }
    given_arguments = options.pop("queue_arguments", None) or {}
    kwargs["queue_arguments"] = {**kwargs["queue_arguments"], **given_arguments}
    kwargs.update(options)
    return LazyRabbitMqDriver(_pika_parameters(url), **kwargs)


def isolate(url: DriverUrl, namespace: str) -> str:
    """The same broker and options, with every queue under the name ``namespace``."""
    return url.with_options(queue=namespace)


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        DriverPlugin(
            name="rabbitmq",
            schemes=("amqp", "amqps"),
            factory=from_url,
            capabilities=CAPABILITIES,
            isolate=isolate,
            example_url="amqp://guest:guest@localhost:5672/?queue=hermes",
        )
    ]
