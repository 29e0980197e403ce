"""The ``sqs://`` scheme: builds an AmazonSqsDriver from a URL.

Every ``connect()`` loads this module, whatever the scheme: boto3 and the
driver are imported when an SQS driver is built, not here.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from hermes.core import ConfigurationError, hookimpl, redact_url
from hermes.core.driver import DriverPlugin, DriverUrl
from hermes.core.drivertools import TlsOptions
from hermes.drivers.sqs._capabilities import CAPABILITIES

if TYPE_CHECKING:
    from hermes.drivers.sqs._driver import AmazonSqsDriver

#: Seconds to open a connection to the endpoint.
CONNECT_TIMEOUT_S = 3.0
#: Seconds a request waits for its reply beyond the long poll's ``wait_time``:
#: SQS answers in milliseconds, so a silent endpoint is one that went away.
READ_TIMEOUT_S = 3.0
#: Tries per request. One retry rides out a throttle or a dropped connection;
#: more would multiply how long an emit to a silent endpoint blocks
#: (each try waits its own timeout): about 10 s with these defaults.
MAX_ATTEMPTS = 2

#: Every option ``sqs://`` accepts, with what it sets.
OPTIONS = {
    "region": "AWS region (else the AWS chain: AWS_DEFAULT_REGION, profile)",
    "endpoint_url": "SQS endpoint, percent-encoded (a local SQS-compatible server)",
    "profile": "AWS profile of the shared config/credentials files",
    "visibility_timeout": "seconds a received message stays hidden (default 30)",
    "wait_time": "long-poll seconds per ReceiveMessage, 0-20, at most the worker's 1 s (default 1)",
    "batch_size": "messages per ReceiveMessage, 1-10 (default 10)",
    "heartbeat": "renew visibility while a handler runs (default true)",
    "dead_letter_queue": "queue SQS moves messages to after max_receive_count receipts",
    "max_receive_count": "receipts before the dead-letter queue (default 5)",
    "retention": "MessageRetentionPeriod in seconds",
    "delay": "honour execute_at with DelaySeconds and re-hiding (default false)",
    "connect_timeout": f"seconds to open a connection (default {CONNECT_TIMEOUT_S:g})",
    "read_timeout": f"seconds a request waits for the reply beyond wait_time "
    f"(default {READ_TIMEOUT_S:g})",
    "max_attempts": f"tries per request, the first included (default {MAX_ATTEMPTS})",
    "ssl_ca_certs": "PEM file of the CA that signed an https endpoint's certificate "
    "(default: the CAs botocore trusts)",
    "ssl_certfile": "PEM file of a client certificate, for an endpoint that asks for one",
    "ssl_keyfile": "its private key, when ssl_certfile does not hold it",
    "ssl_cert_reqs": "required (default): verify the endpoint's certificate; none: do not",
    "ssl_check_hostname": "true (default): the certificate must name endpoint_url's host",
}


def _tls(url: DriverUrl) -> dict[str, Any]:
    """boto3's ``verify`` (the CA file, or False) and botocore's ``client_cert`` for ``url``."""
    endpoint = url.options.get("endpoint_url") or ""
    tls = TlsOptions.from_url(
        url, tls=not endpoint.startswith("http://"), how="use an https:// endpoint_url"
    )
    if tls is None:
        return {"verify": None, "client_cert": None}
    if tls.verify and not tls.check_hostname:
        raise ConfigurationError(
            f"{url.redacted!r}: botocore checks the host name whenever it verifies the "
            "certificate, so ssl_check_hostname=false needs ssl_cert_reqs=none"
        )
    client_cert: str | tuple[str, str] | None = tls.cert_file
    if tls.cert_file and tls.key_file:
        client_cert = (tls.cert_file, tls.key_file)
    return {"verify": tls.ca_file if tls.verify else False, "client_cert": client_cert}


@functools.cache
def keyword_options() -> frozenset[str]:
    """Keyword options of ``connect()`` (objects a URL cannot carry, or overrides)."""
    from hermes.drivers.sqs._driver import AmazonSqsDriver

    # The plugin builds the client and owns it; the queue name comes from the URL.
    built_here = {"client", "queue_name", "client_factory", "close_client"}
    return frozenset(inspect.signature(AmazonSqsDriver).parameters) - built_here


def _queue_name(url: DriverUrl) -> str:
    # The URL's host is lowercased by the parser; SQS names are case-sensitive.
    netloc = urlsplit(url.raw).netloc
    if "@" in netloc or ":" in netloc:
        raise ConfigurationError(
            f"{url.redacted!r}: sqs:// takes no credentials or port; the queue name goes "
            "where the host would be (sqs://QUEUE?region=…), credentials come from the "
            "AWS chain (environment, profile, role)"
        )
    if netloc and url.path:
        raise ConfigurationError(
            f"{url.redacted!r}: write the queue as sqs://QUEUE, without a path"
        )
    name = netloc or url.path
    if not name:
        raise ConfigurationError(
            f"{url.redacted!r}: name the queue, e.g. sqs://jobs?region=eu-west-1"
        )
    return name


def _client_factory(url: DriverUrl, wait_time_s: int) -> Any:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ProfileNotFound

    region = url.options.get("region") or None
    endpoint_url = url.options.get("endpoint_url") or None
    tls = _tls(url)
    profile = url.options.get("profile") or None
    config = Config(
        connect_timeout=url.get_float("connect_timeout", CONNECT_TIMEOUT_S, minimum=0.1),
        # A long poll holds the request open for wait_time_s.
        read_timeout=wait_time_s + url.get_float("read_timeout", READ_TIMEOUT_S, minimum=0.1),
        retries={
            "mode": "standard",
            "max_attempts": url.get_int("max_attempts", MAX_ATTEMPTS, minimum=1),
        },
        client_cert=tls["client_cert"],
    )
    try:
        session = boto3.session.Session(profile_name=profile, region_name=region)
    except ProfileNotFound as exc:
        raise ConfigurationError(f"{url.redacted!r}: {redact_url(str(exc))}") from exc
    if session.region_name is None:
        raise ConfigurationError(
            f"{url.redacted!r}: no AWS region; add ?region=… or set AWS_DEFAULT_REGION"
        )
    if session.get_credentials() is None:
        raise ConfigurationError(
            f"{url.redacted!r}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, ?profile=…, or run with an instance/task role"
        )

    def factory() -> Any:
        return boto3.session.Session(profile_name=profile, region_name=region).client(
            "sqs", endpoint_url=endpoint_url, config=config, verify=tls["verify"]
        )

    return factory


def from_url(url: DriverUrl, **options: Any) -> AmazonSqsDriver:
    """``sqs://QUEUE?region=…&endpoint_url=…``; keyword ``options`` go to the driver."""
    from botocore.exceptions import BotoCoreError

    from hermes.drivers.sqs._driver import AmazonSqsDriver

    url.reject_unknown(OPTIONS)
    url.reject_unknown_keywords(options, keyword_options())
    queue_name = _queue_name(url)
    wait_time_s = url.get_int("wait_time", 1, minimum=0)
    settings: dict[str, Any] = {
        "wait_time_s": wait_time_s,
        "batch_size": url.get_int("batch_size", 10, minimum=1),
        "visibility_timeout_s": url.get_int("visibility_timeout", 30, minimum=1),
        "heartbeat": url.get_bool("heartbeat", True),
        "delay": url.get_bool("delay", False),
        "dead_letter_queue": url.options.get("dead_letter_queue") or None,
    }
    if "max_receive_count" in url.options:
        settings["max_receive_count"] = url.get_int("max_receive_count", 5, minimum=1)
    if "retention" in url.options:
        settings["retention_s"] = url.get_int("retention", 345600, minimum=60)
    settings.update(options)
    try:
        factory = _client_factory(url, int(settings["wait_time_s"]))
        client = factory()
    except BotoCoreError as exc:
        raise ConfigurationError(
            f"{url.redacted!r}: cannot build an SQS client - {redact_url(str(exc))}"
        ) from exc
    try:
        return AmazonSqsDriver(
            client, queue_name, client_factory=factory, close_client=True, **settings
        )
    except ConfigurationError as exc:
        client.close()
        raise ConfigurationError(f"{url.redacted!r}: {redact_url(str(exc))}") from exc


def isolate(url: DriverUrl, namespace: str) -> str:
    """The same endpoint and options with queue ``namespace`` (and DLQ ``namespace-dlq``)."""
    options = dict(url.options)
    if "dead_letter_queue" in options:
        options["dead_letter_queue"] = f"{namespace}-dlq"
    parts = urlsplit(url.raw)
    return urlunsplit(parts._replace(netloc=namespace, path="", query=urlencode(options)))


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        DriverPlugin(
            name="sqs",
            schemes=("sqs",),
            factory=from_url,
            capabilities=CAPABILITIES,
            isolate=isolate,
            example_url="sqs://jobs?region=eu-west-1",
        )
    ]
