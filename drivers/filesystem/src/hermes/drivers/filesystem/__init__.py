"""Hermes's embedded driver: a queue in a directory, no server (``file://``).

``connect("file:///var/spool/hermes")`` or ``FileSystemDriver("/var/spool/hermes")``.
Several worker processes on one machine can share the directory; each message
goes to one of them, and a worker that dies has its messages handed out again.
"""

from hermes.drivers.filesystem._driver import FileSystemDriver
from hermes.drivers.filesystem._plugin import directory_from_url

__all__ = ["FileSystemDriver", "directory_from_url"]
