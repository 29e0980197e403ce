"""The ``postgresql://`` and ``postgres://`` entry in Hermes's driver registry.

Every ``connect()`` loads this module, whatever the scheme: psycopg and the
driver are imported when a PostgreSQL driver is built, not here.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from hermes.core import ConfigurationError, hookimpl
from hermes.core.driver import Driver, DriverPlugin, DriverUrl
from hermes.core.drivertools import TlsOptions
from hermes.drivers.postgres._capabilities import (
    CAPABILITIES,
    LEASE_TIMEOUT_S,
    POLL_INTERVAL_S,
)

if TYPE_CHECKING:
    from hermes.core.driver import QueueBrowser
    from hermes.drivers.postgres._driver import PostgresDriver

#: Every option of the URL, with what it sets.
OPTIONS = {
    "table": "the messages table (default hermes_messages; set-aside bodies: <table>_rejected)",
    "schema": "the tables' schema (default public)",
    "queue": "the queue column: drivers with other queues may share one table (default default)",
    "lease_timeout": f"seconds a claimed row stays leased unrenewed (default {LEASE_TIMEOUT_S:g})",
    "poll_interval": f"longest idle wait between looks at the table (default {POLL_INTERVAL_S:g})",
    "create": "create the tables on first use (default true; false: run the DDL yourself)",
    "pool_size": "most pooled connections for sends and settles (default 10)",
    "connect_timeout": "seconds to wait for a connection (default 5)",
    "synchronous_settles": "claims and acks wait for the WAL flush like sends (default false)",
    "application_name": "shown in pg_stat_activity (default hermes)",
}
#: libpq settings passed through as they are.
_LIBPQ_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "target_session_attrs",
)
#: libpq's TCP settings, with Hermes's defaults: what bounds how long a worker
#: or an emit waits on a server that went silent (no reset, no reply).
#: Keepalive probes find a dead peer under an idle LISTEN in 5 + 2 x 3 = 11 s;
#: ``tcp_user_timeout`` (ms) drops a connection whose sent statement goes
#: unacknowledged for 10 s, which keepalives alone do not cover.
SILENCE_SETTINGS = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}
#: Options that ask for TLS: without an ``sslmode`` they mean ``verify-full``.
_TLS_FILES = ("sslrootcert", "sslcert", "sslkey")
#: libpq's name for what each TLS option sets; a URL gives one or the other.
_LIBPQ_TLS = {
    "ssl_ca_certs": "sslrootcert",
    "ssl_certfile": "sslcert",
    "ssl_keyfile": "sslkey",
    "ssl_cert_reqs": "sslmode",
    "ssl_check_hostname": "sslmode",
}


def _tls_settings(url: DriverUrl) -> dict[str, str]:
    """libpq's parameters for the URL's TLS options; they ask for TLS by themselves."""
    sslmode = url.options.get("sslmode")
    tls = TlsOptions.from_url(
        url,
        tls=False if sslmode == "disable" else None,
        how="leave out sslmode=disable",
        native=_LIBPQ_TLS,
    )
    if tls is None:
        return {}
    # verify-ca checks the CA only; require checks nothing (unless libpq finds
    # a root certificate of its own, ~/.postgresql/root.crt).
    sslmode = "verify-full" if tls.check_hostname else "verify-ca" if tls.verify else "require"
    return {"sslmode": sslmode, **tls.files("sslrootcert", "sslcert", "sslkey")}


def conninfo(url: DriverUrl) -> str:
    """The libpq connection string of ``url``: host, port, database, credentials, TLS."""
    from psycopg.conninfo import make_conninfo

    if len(url.hosts) > 1:
        raise ConfigurationError(
            f"{url.redacted!r} lists {len(url.hosts)} hosts; give one, "
            f"e.g. {url.scheme}://user@localhost:5432/app"
        )
    if "/" in url.path:
        raise ConfigurationError(
            f"the path of {url.redacted!r} must be a database name, "
            f"e.g. {url.scheme}://user@localhost:5432/app"
        )
    settings: dict[str, Any] = {
        "host": url.host or "localhost",
        "port": url.port or 5432,
        "dbname": url.path or None,
        "user": url.username or None,
        "password": url.password or None,
        "application_name": url.get_str("application_name", "hermes"),
    }
    settings.update(SILENCE_SETTINGS)
    settings.update(_tls_settings(url))
    settings.update(
        {
            name: url.options[name]
            for name in (*_LIBPQ_OPTIONS, *SILENCE_SETTINGS)
            if name in url.options
        }
    )
    if "sslmode" not in url.options and any(name in url.options for name in _TLS_FILES):
        # A URL that names a root certificate or a client certificate asks
        # for TLS: verify it fully, rather than libpq's default "prefer", which
        # would use TLS without checking who answers.
        settings["sslmode"] = "verify-full"
    return make_conninfo(**{key: value for key, value in settings.items() if value is not None})


def _from_url(url: DriverUrl, **options: Any) -> PostgresDriver:
    from hermes.drivers.postgres._driver import DEFAULT_QUEUE, DEFAULT_TABLE, PostgresDriver

    url.reject_unknown((*OPTIONS, *_LIBPQ_OPTIONS, *TlsOptions.NAMES, *SILENCE_SETTINGS))
    url.reject_unknown_keywords(options, ())
    try:
        return PostgresDriver(
            conninfo(url),
            table=url.get_str("table", DEFAULT_TABLE),
            schema=url.get_str("schema", "public"),
            queue=url.get_str("queue", DEFAULT_QUEUE),
            lease_timeout_s=url.get_float("lease_timeout", LEASE_TIMEOUT_S, minimum=0.1),
            poll_interval_s=url.get_float("poll_interval", POLL_INTERVAL_S, minimum=0.01),
            create=url.get_bool("create", True),
            pool_size=url.get_int("pool_size", 10, minimum=1),
            connect_timeout_s=url.get_float("connect_timeout", 5.0, minimum=1.0),
            synchronous_settles=url.get_bool("synchronous_settles", False),
            display_url=url.redacted,
        )
    except ValueError as exc:
        raise ConfigurationError(f"{url.redacted!r}: {exc}") from exc


def _isolate(url: DriverUrl, namespace: str) -> str:
    # A table of its own: teardown drops it without touching another namespace's.
    base = url.get_str("table", "hermes")
    name = f"{base}_{re.sub(r'[^a-z0-9_]', '_', namespace.lower())}"
    if len(name) > 48:
        import hashlib  # here: every connect() loads this plugin, whatever the scheme

        name = f"{base[:24]}_{hashlib.sha1(namespace.encode()).hexdigest()[:20]}"
    return url.with_options(table=name)


def _browse(driver: Driver) -> QueueBrowser:
    from hermes.drivers.postgres._driver import TableBrowser

    return TableBrowser(driver)


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        DriverPlugin(
            name="postgres",
            schemes=("postgresql", "postgres"),
            factory=_from_url,
            capabilities=CAPABILITIES,
            isolate=_isolate,
            example_url="postgresql://app:secret@localhost:5432/app?table=hermes_messages",
            browse=_browse,
        )
    ]
