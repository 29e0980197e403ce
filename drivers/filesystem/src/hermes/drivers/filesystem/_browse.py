"""Reading a queue directory without taking anything: what ``hermes failed`` needs."""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterator

from hermes.core.driver import Driver
from hermes.drivers.filesystem._driver import FileSystemDriver
from hermes.drivers.filesystem._names import QueuedName, parse


class DirectoryBrowser:
    """The files waiting in ``new/``, in dequeue order; deleting one is an ``unlink``.

    Files a worker has claimed (in ``processing/``) are not listed. A file a
    worker claims between the listing and the read is skipped; one it claims
    before :meth:`remove` makes ``remove`` return False.
    """

    def __init__(self, driver: FileSystemDriver) -> None:
        self.driver = driver
        self._new_dir = os.path.join(driver.path, "new")

    # A store calls these directly, outside core's translation.

    def entries(self) -> Iterator[tuple[Hashable, bytes]]:
        with self.driver.translating("listing new/"):
            try:
                names = os.listdir(self._new_dir)
            except FileNotFoundError:
                return  # nothing was ever sent here
        queued = [parsed for parsed in map(parse, names) if parsed is not None]
        queued.sort(key=_dequeue_order)
        for item in queued:
            with self.driver.translating(f"reading new/{item.name}"):
                try:
                    with open(os.path.join(self._new_dir, item.name), "rb") as file:
                        body = file.read()
                except FileNotFoundError:
                    continue  # a worker took it meanwhile
            yield item.name, body

    def remove(self, entry: Hashable) -> bool:
        with self.driver.translating(f"deleting new/{entry}"):
            try:
                os.unlink(os.path.join(self._new_dir, str(entry)))
            except FileNotFoundError:
                return False
        return True


def _dequeue_order(queued: QueuedName) -> tuple[int, int, int]:
    return (-queued.priority, queued.available_ns, queued.sequence)


def browse(driver: Driver) -> DirectoryBrowser:
    """The plugin's ``browse``: a :class:`DirectoryBrowser` on a :class:`FileSystemDriver`."""
    if not isinstance(driver, FileSystemDriver):
        raise TypeError(f"{driver!r} is not a FileSystemDriver")
    return DirectoryBrowser(driver)
