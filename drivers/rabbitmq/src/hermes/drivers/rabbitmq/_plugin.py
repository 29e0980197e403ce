"""Registers ``amqp://`` and ``amqps://`` with Hermes.

Every ``connect()`` loads this module, whatever the scheme: pika and the
driver are imported when a RabbitMQ driver is built, not here.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from hermes.core import ConfigurationError, hookimpl, redact_url
from hermes.core.driver import DriverPlugin, DriverUrl
from hermes.core.drivertools import TlsOptions
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
    tls = TlsOptions.from_url(url, tls=url.scheme == "amqps", how="use amqps://")
    if tls is not None:
        # pika's own context for amqps:// verifies too, but it takes a CA file
        # only as a Python literal in its ssl_options option.
        parameters.ssl_options = pika.SSLOptions(tls.context(url))
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
                *TlsOptions.NAMES,
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
