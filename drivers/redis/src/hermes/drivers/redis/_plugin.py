"""The ``redis://`` and ``rediss://`` entry in Hermes's driver registry.

Every ``connect()`` loads this module, whatever the scheme: redis-py and the
driver are imported when a Redis driver is built, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hermes.core import ConfigurationError, Shutdown, hookimpl
from hermes.core.driver import Driver, DriverPlugin, DriverUrl
from hermes.drivers.redis._capabilities import CAPABILITIES

if TYPE_CHECKING:
    import redis

    from hermes.core.driver import QueueBrowser
    from hermes.drivers.redis._driver import RedisSetDriver

_DRIVER_OPTIONS = ("key", "schedule_key", "refresh_interval", "prefix", "delivery", "lease_timeout")
#: TLS options of a ``rediss://`` URL, as redis-py names them. The server's
#: certificate is verified against ``ssl_ca_certs`` (default: the system's CAs)
#: and must name the URL's host, unless ``ssl_cert_reqs`` or
#: ``ssl_check_hostname`` say otherwise.
_TLS_OPTIONS = (
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
)
_CERT_REQS = ("required", "optional", "none")
_CLIENT_OPTIONS = ("socket_connect_timeout", "socket_timeout", *_TLS_OPTIONS)
#: Seconds a command may wait for Redis's reply before the server counts as
#: gone: what bounds a send, and a worker's notice of a silent server.
SOCKET_TIMEOUT_S = 5.0


def build_client(url: DriverUrl) -> redis.Redis[Any]:
    """The redis-py client for ``url``: host, port, database, credentials, TLS.

    Its own commands (``put``, ``purge``, ``teardown``, ``RedisShutdown``) are
    retried 3 times within about half a second after a dropped connection; a
    consumer handles its connection itself (see :class:`RedisSetDriver`).
    """
    import redis
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    if len(url.hosts) > 1:
        raise ConfigurationError(
            f"{url.redacted!r} lists {len(url.hosts)} hosts, but the Redis driver talks to "
            f"one server: give one host, e.g. {url.scheme}://localhost:6379/0"
        )
    if url.path and not url.path.isdigit():
        raise ConfigurationError(
            f"the path of {url.redacted!r} must be a database number, "
            f"e.g. {url.scheme}://localhost:6379/0"
        )
    return redis.Redis(
        host=url.host or "localhost",
        port=url.port or 6379,
        db=int(url.path or 0),
        username=url.username or None,
        password=url.password or None,
        socket_connect_timeout=url.get_float("socket_connect_timeout", 5.0, minimum=0.001),
        socket_timeout=url.get_float("socket_timeout", SOCKET_TIMEOUT_S, minimum=0.1),
        # Keepalive probes find a peer that vanished while nothing was sent
        # (the idle worker's BLPOP is bounded by socket_timeout as well).
        socket_keepalive=True,
        retry=Retry(ExponentialBackoff(cap=0.25, base=0.05), 3),
        **tls_settings(url),
    )


def tls_settings(url: DriverUrl) -> dict[str, Any]:
    """redis-py's TLS arguments for ``url``: none for ``redis://``, verifying ones for ``rediss://``.

    Verification is on unless the URL turns it off: ``ssl_cert_reqs=required``
    and ``ssl_check_hostname=true`` are the defaults, whatever the redis-py version.
    """
    if url.scheme != "rediss":
        for name in _TLS_OPTIONS:
            if name in url.options:
                raise ConfigurationError(
                    f"option {name} in {url.redacted!r} needs TLS: use rediss://"
                )
        return {}
    cert_reqs = url.get_str("ssl_cert_reqs", "required")
    if cert_reqs not in _CERT_REQS:
        raise ConfigurationError(
            f"ssl_cert_reqs in {url.redacted!r} must be one of {', '.join(_CERT_REQS)}, "
            f"got {cert_reqs!r}"
        )
    settings: dict[str, Any] = {
        "ssl": True,
        "ssl_cert_reqs": cert_reqs,
        # No hostname to check when the certificate is not checked at all.
        "ssl_check_hostname": cert_reqs != "none" and url.get_bool("ssl_check_hostname", True),
    }
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if name in url.options:
            settings[name] = url.options[name]
    return settings


def _from_url(url: DriverUrl, **options: Any) -> RedisSetDriver:
    import redis

    from hermes.drivers.redis._driver import RedisSetDriver

    url.reject_unknown((*_DRIVER_OPTIONS, *_CLIENT_OPTIONS))
    url.reject_unknown_keywords(options, ["client"], "client=redis.Redis(...) brings your own")
    client = options.pop("client", None)
    if client is not None and not isinstance(client, redis.Redis):
        raise ConfigurationError(f"client= must be a redis.Redis, got {type(client).__name__}")
    owned = client is None
    return RedisSetDriver(
        build_client(url) if client is None else client,
        key=url.get_str("key", "hermes"),
        refresh_interval=url.get_float("refresh_interval", 1.0, minimum=0.001),
        schedule_key=url.get_str("schedule_key", "hermes_schedule"),
        prefix=url.get_str("prefix", ""),
        close_client=owned,
        delivery=url.get_str("delivery", "at-most-once"),
        lease_timeout_s=(
            url.get_float("lease_timeout", 0.0) if "lease_timeout" in url.options else None
        ),
    )


def _isolate(url: DriverUrl, namespace: str) -> str:
    # A prefix, not just other key names: priority sets are named by the caller
    # (``setup_priority_queue("high", 200)``) and must be the namespace's too.
    return url.with_options(prefix=f"{url.get_str('prefix', '')}{namespace}:")


def _shutdown(driver: Driver) -> Shutdown:
    """PHP Hermes's ``RedisShutdown`` on the driver's Redis: ``<prefix>hermes_shutdown``.

    The prefix keeps apart the apps that share one Redis by prefix: stopping
    one app's workers must not stop another's. Without a prefix the key is
    PHP's own, ``hermes_shutdown``.
    """
    from hermes.drivers.redis._driver import RedisSetDriver
    from hermes.drivers.redis._shutdown import RedisShutdown

    if not isinstance(driver, RedisSetDriver):
        raise ConfigurationError(f"{driver!r} is not a Redis driver: it has no Redis to ask")
    return RedisShutdown(driver.client, key=f"{driver.prefix}hermes_shutdown")


def _browse(driver: Driver) -> QueueBrowser:
    """Lists and deletes members of the driver's default set: a failed-message store."""
    from hermes.drivers.redis._browse import browse

    return browse(driver)


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        DriverPlugin(
            name="redis",
            schemes=("redis", "rediss"),
            factory=_from_url,
            capabilities=CAPABILITIES,
            isolate=_isolate,
            example_url="redis://localhost:6379/0?key=hermes&schedule_key=hermes_schedule",
            shutdown=_shutdown,
            browse=_browse,
        )
    ]
