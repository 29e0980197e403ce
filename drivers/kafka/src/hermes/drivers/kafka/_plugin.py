"""The ``kafka://`` entry in Hermes's driver registry.

``kafka://[user:password@]host:port[,host:port...]/TOPIC?group=NAME&...``:
options with a dot in their name (and ``acks``, ``retries``, ``partitioner``,
``debug``) are librdkafka settings, passed on as they are; the others are
Hermes's. ``user:password`` become ``sasl.username``/``sasl.password``; the
TLS options every driver takes (``ssl_ca_certs``...) become librdkafka's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hermes.core import ConfigurationError, hookimpl
from hermes.core.driver import DriverPlugin, DriverUrl
from hermes.core.drivertools import TlsOptions
from hermes.drivers.kafka import _settings
from hermes.drivers.kafka._capabilities import CAPABILITIES

if TYPE_CHECKING:
    from hermes.drivers.kafka._driver import KafkaDriver

_DEFAULT_PORT = 9092
#: Hermes's own URL options (the rest are librdkafka settings).
_DRIVER_OPTIONS = (
    "group",
    "commit_every",
    "commit_interval_s",
    "delay",
    "dead_letter_topic",
    "priority_topics",
    "partitions",
    "max_held",
    "create_topics",
)
#: librdkafka's name for what each TLS option sets; a URL gives one or the other.
_LIBRDKAFKA_TLS = {
    "ssl_ca_certs": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_cert_reqs": "enable.ssl.certificate.verification",
    "ssl_check_hostname": "ssl.endpoint.identification.algorithm",
}


def _is_librdkafka(option: str) -> bool:
    return "." in option or option in _settings.UNDOTTED


def librdkafka_config(url: DriverUrl) -> dict[str, Any]:
    """The librdkafka settings ``url`` carries: brokers, credentials and dotted options."""
    if not url.hosts:
        raise ConfigurationError(
            f"{url.redacted!r} names no broker: use kafka://host:port/TOPIC, "
            "e.g. kafka://localhost:9092/jobs"
        )
    config: dict[str, Any] = {
        "bootstrap.servers": ",".join(
            f"[{host}]:{port or _DEFAULT_PORT}"
            if ":" in host
            else f"{host}:{port or _DEFAULT_PORT}"
            for host, port in url.hosts
        )
    }
    if url.username:
        config["sasl.username"] = url.username
        config["sasl.password"] = url.password or ""
    config.update(_tls_config(url))
    config.update({key: value for key, value in url.options.items() if _is_librdkafka(key)})
    return config


def _tls_config(url: DriverUrl) -> dict[str, str]:
    """librdkafka's TLS settings for the URL's TLS options; they ask for TLS by themselves."""
    protocol = url.options.get("security.protocol")
    tls = TlsOptions.from_url(
        url,
        tls=None if protocol is None else protocol.lower() in ("ssl", "sasl_ssl"),
        how="add security.protocol=ssl (sasl_ssl with a user)",
        native=_LIBRDKAFKA_TLS,
    )
    if tls is None:
        return {}
    return {
        # SASL credentials in the URL go over TLS too.
        "security.protocol": "sasl_ssl" if url.username else "ssl",
        "enable.ssl.certificate.verification": "true" if tls.verify else "false",
        "ssl.endpoint.identification.algorithm": "https" if tls.check_hostname else "none",
        **tls.files("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"),
    }


def _from_url(url: DriverUrl, **options: Any) -> KafkaDriver:
    from hermes.drivers.kafka._driver import KafkaDriver  # confluent-kafka: only when used

    url.reject_unknown(
        [
            *_DRIVER_OPTIONS,
            *TlsOptions.NAMES,
            *(key for key in url.options if _is_librdkafka(key)),
        ]
    )
    url.reject_unknown_keywords(
        options, ["config"], "config={librdkafka settings} adds what a URL cannot carry"
    )
    extra = options.pop("config", None)
    if extra is not None and not isinstance(extra, Mapping):
        raise ConfigurationError(f"config= must be a dict, got {type(extra).__name__}")
    if not url.path:
        raise ConfigurationError(
            f"{url.redacted!r} names no topic: use kafka://host:port/TOPIC, "
            "e.g. kafka://localhost:9092/jobs"
        )
    return KafkaDriver(
        {**librdkafka_config(url), **(extra or {})},
        url.path,
        url.get_str("group", "hermes"),
        commit_every=url.get_int("commit_every", 1, minimum=0),
        commit_interval_s=url.get_float("commit_interval_s", 0.0, minimum=0.0),
        delay=url.get_bool("delay", False),
        dead_letter_topic=url.get_str("dead_letter_topic", "") or None,
        priority_topics=url.get_bool("priority_topics", False),
        partitions=url.get_int("partitions", 3, minimum=1),
        max_held=url.get_int("max_held", 1000, minimum=1),
        create_topics=url.get_bool("create_topics", True),
    )


def _isolate(url: DriverUrl, namespace: str) -> str:
    isolated = DriverUrl.parse(url.with_path(namespace))
    options = {"group": namespace}
    if url.options.get("dead_letter_topic"):
        options["dead_letter_topic"] = f"{namespace}.dead-letters"
    return isolated.with_options(**options)


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        DriverPlugin(
            name="kafka",
            schemes=("kafka",),
            factory=_from_url,
            capabilities=CAPABILITIES,
            isolate=_isolate,
            example_url="kafka://localhost:9092/hermes?group=workers",
        )
    ]
