"""Hermes's embedded driver: a queue in a directory, no server (``file://``).

``connect("file:///var/spool/hermes")`` or ``FileSystemDriver("/var/spool/hermes")``.
Several worker processes on one machine can share the directory; each message
goes to one of them, and a worker that dies has its messages handed out again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes.core.drivertools import lazy_exports

if TYPE_CHECKING:
    from hermes.drivers.filesystem._driver import FileSystemDriver
    from hermes.drivers.filesystem._plugin import directory_from_url

__all__ = ["FileSystemDriver", "directory_from_url"]

# Loading the plugin imports this package; the driver is imported on first use
# of a name instead, so a worker on another broker does not pay for it.
if not TYPE_CHECKING:  # type checkers read the imports above, and still flag typos
    __getattr__, __dir__ = lazy_exports(
        __name__, {"FileSystemDriver": "._driver", "directory_from_url": "._plugin"}
    )
