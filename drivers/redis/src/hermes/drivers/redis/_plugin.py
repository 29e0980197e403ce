"""The ``redis://`` and ``rediss://`` entry in Hermes's driver registry.

Every ``connect()`` loads this module, whatever the scheme: redis-py and the
driver are imported when a Redis driver is built, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hermes.core import ConfigurationError, Shutdown, hookimpl
from hermes.core.driver import Driver, DriverPlugin, DriverUrl
from hermes.core.drivertools import TlsOptions
from hermes.drivers.redis._capabilities import CAPABILITIES

if TYPE_CHECKING:
    import redis
    from redis.retry import Retry

    from hermes.core.driver import QueueBrowser
    from hermes.drivers.redis._driver import RedisSetDriver

_DRIVER_OPTIONS = (
    "key",
    "schedule_key",
    "refresh_interval",
    "prefix",
    "delivery",
    "lease_timeout",
    "prefetch",
    "wait_replicas",
    "wait_timeout",
)
#: Options of a ``redis+sentinel://`` URL about the Sentinels themselves.
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
_CLIENT_OPTIONS = (
    "socket_connect_timeout",
    "socket_timeout",
    *TlsOptions.NAMES,
    *_SENTINEL_OPTIONS,
)
#: The schemes of a Redis found through Sentinel (``+`` TLS to the master and the Sentinels).
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Seconds a command may wait for Redis's reply before the server counts as
#: gone: what bounds a send, and a worker's notice of a silent server.
SOCKET_TIMEOUT_S = 5.0


def build_client(url: DriverUrl) -> redis.Redis[Any]:
    """The redis-py client for ``url``: host, port, database, credentials, TLS.

    Its own commands (``put``, ``purge``, ``teardown``, ``RedisShutdown``) are
    retried 3 times within about half a second after a dropped connection; a
    consumer handles its connection itself (see :class:`RedisSetDriver`).
    A timeout is not retried: see :func:`_retry`.
    """
    import redis

    if url.scheme in SENTINEL_SCHEMES:
        return _sentinel_client(url)
    for name in _SENTINEL_OPTIONS:
        if name in url.options:
            raise ConfigurationError(
                f"option {name} in {url.redacted!r} is for Sentinel: use redis+sentinel://"
            )
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
        retry=_retry(),
        **tls_settings(url),
    )


def _sentinel_client(url: DriverUrl) -> redis.Redis[Any]:
    """A client of the master that Sentinel names, found again after every failover.

    ``redis+sentinel://[user:password@]s1:26379,s2:26379/SERVICE[/DB]``, as
    redis-py spells it: the hosts are Sentinels, the first path segment the
    monitored master's name. The URL's user and password are the master's;
    ``sentinel_username`` and ``sentinel_password`` the Sentinels' own. Each
    new connection asks the Sentinels for the current master, so a worker
    or an emitter that loses its connection in a failover reconnects to the
    promoted replica (the worker through core's backoff).
    """
    from redis.sentinel import Sentinel

    service, _, db = url.path.partition("/")
    if not service or (db and not db.isdigit()):
        raise ConfigurationError(
            f"the path of {url.redacted!r} must be the master's name and a database number, "
            f"e.g. {url.scheme}://localhost:26379,localhost:26380/mymaster/0"
        )
    timeouts: dict[str, Any] = {
        "socket_connect_timeout": url.get_float("socket_connect_timeout", 5.0, minimum=0.001),
        "socket_timeout": url.get_float("socket_timeout", SOCKET_TIMEOUT_S, minimum=0.1),
        "socket_keepalive": True,
    }
    tls = tls_settings(url)
    sentinel_kwargs: dict[str, Any] = {**timeouts, **tls}
    if "sentinel_username" in url.options:
        sentinel_kwargs["username"] = url.options["sentinel_username"]
    if "sentinel_password" in url.options:
        sentinel_kwargs["password"] = url.options["sentinel_password"]
    sentinel = Sentinel(
        [(host, port or 26379) for host, port in url.hosts],
        sentinel_kwargs=sentinel_kwargs,
        **timeouts,
        **tls,
    )
    return sentinel.master_for(
        service,
        db=int(db or 0),
        username=url.username or None,
        password=url.password or None,
        retry=_retry(),
        **timeouts,
        **tls,
    )


def _retry() -> Retry:
    """Retry a command whose connection was dropped, but not one that timed out.

    A reset or closed connection (a restart, an idle connection the server
    dropped) is worth a new one at once. A timeout means the server went
    silent: each retry would wait ``socket_connect_timeout`` again, so an
    emit raises after one ``socket_timeout`` instead of several.
    """
    import redis
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    return Retry(
        ExponentialBackoff(cap=0.25, base=0.05), 3, supported_errors=(redis.ConnectionError,)
    )


def tls_settings(url: DriverUrl) -> dict[str, Any]:
    """redis-py's TLS arguments for ``url``: none for ``redis://``, verifying ones for ``rediss://``."""
    tls = TlsOptions.from_url(
        url, tls=url.scheme in ("rediss", "rediss+sentinel"), how="use rediss://"
    )
    if tls is None:
        return {}
    return {
        "ssl": True,
        # Given whatever the redis-py version's defaults are.
        "ssl_cert_reqs": "required" if tls.verify else "none",
        "ssl_check_hostname": tls.check_hostname,
        **tls.files("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"),
    }


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
        wait_replicas=url.get_int("wait_replicas", 0, minimum=0),
        wait_timeout_s=url.get_float("wait_timeout", 1.0, minimum=0.001),
        prefetch=url.get_int("prefetch", 1, minimum=1),
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
            schemes=("redis", "rediss", *SENTINEL_SCHEMES),
            factory=_from_url,
            capabilities=CAPABILITIES,
            isolate=_isolate,
            example_url="redis://localhost:6379/0?key=hermes&schedule_key=hermes_schedule",
            shutdown=_shutdown,
            browse=_browse,
        )
    ]
