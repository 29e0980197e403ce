"""Registers ``file://`` with Hermes: ``connect("file:///var/spool/hermes")``."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from hermes.core import ConfigurationError, hookimpl
from hermes.core.driver import Driver, DriverPlugin, DriverUrl
from hermes.drivers.filesystem._capabilities import CAPABILITIES

if TYPE_CHECKING:
    from hermes.core.driver import QueueBrowser
    from hermes.drivers.filesystem._driver import FileSystemDriver

#: Options a ``file://`` URL may carry, e.g. ``file:///var/spool/hermes?fsync=false``.
URL_OPTIONS = ("fsync", "poll_interval_s", "recovery_interval_s")

_NAMESPACE = re.compile(r"[a-z0-9][a-z0-9-]{0,47}")


def directory_from_url(url: DriverUrl) -> str:
    """The queue directory a ``file://`` URL names, as written (absolute or relative).

    ``file:///abs/path`` and ``file://localhost/abs/path`` are absolute;
    ``file://relative/path`` (and ``file:relative/path``) are relative to the
    working directory, and ``~`` is expanded by the driver.
    """
    parts = urlsplit(url.raw)  # DriverUrl lower-cases the host; a directory keeps its case
    if "@" in parts.netloc or url.port is not None:
        raise ConfigurationError(
            f"{url.redacted!r}: a file:// URL names a directory and takes no user, "
            "password or port; write file:///absolute/path or file://relative/path"
        )
    netloc, path = unquote(parts.netloc), unquote(parts.path)
    directory = path if netloc in ("", "localhost") else netloc + path
    if not directory or directory == "/":
        raise ConfigurationError(
            f"{url.redacted!r} names no queue directory; "
            "write e.g. file:///var/spool/hermes or file://./hermes-queue"
        )
    return directory


def driver_from_url(url: DriverUrl, **options: Any) -> FileSystemDriver:
    """Build the driver; keyword ``options`` override the URL's."""
    url.reject_unknown(URL_OPTIONS)
    url.reject_unknown_keywords(options, URL_OPTIONS)
    settings: dict[str, Any] = {
        "fsync": url.get_bool("fsync", True),
        "poll_interval_s": url.get_float("poll_interval_s", 0.02),
        "recovery_interval_s": url.get_float("recovery_interval_s", 1.0),
    }
    settings.update(options)
    from hermes.drivers.filesystem._driver import FileSystemDriver  # on use, not on plugin load

    return FileSystemDriver(directory_from_url(url), **settings)


def isolate(url: DriverUrl, namespace: str) -> str:
    """``file:///<queue directory>/<namespace>``, absolute, with the same options."""
    if not _NAMESPACE.fullmatch(namespace):
        raise ConfigurationError(
            f"namespace {namespace!r} must be 1-48 characters of a-z, 0-9 and '-'"
        )
    directory = os.path.abspath(os.path.expanduser(directory_from_url(url)))
    parts = urlsplit(url.raw)
    return urlunsplit(("file", "", quote(os.path.join(directory, namespace)), parts.query, ""))


def browse(driver: Driver) -> QueueBrowser:
    """Lists and deletes the files in ``new/``: a failed-message store."""
    from hermes.drivers.filesystem._browse import browse

    return browse(driver)


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        DriverPlugin(
            name="filesystem",
            schemes=("file",),
            factory=driver_from_url,
            capabilities=CAPABILITIES,
            isolate=isolate,
            example_url="file:///var/spool/hermes",
            browse=browse,
        )
    ]
