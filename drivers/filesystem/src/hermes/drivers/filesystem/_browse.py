"""Reading a queue directory without taking anything: what ``hermes failed`` needs."""

from __future__ import annotations

import bisect
import os
from collections.abc import Hashable, Iterator

from hermes.core.driver import BrowsePage, Driver
from hermes.core.drivertools import page_of
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

    def entries(self) -> Iterator[tuple[Hashable, bytes]]:
        for item in self._queued():
            body = self._read(item)
            if body is not None:
                yield item.name, body

    def page(self, after: str | None, limit: int, max_bytes: int) -> BrowsePage:
        """A page in the order workers take them; ``next`` is the last file name shown."""
        queued = self._queued()
        if after is not None:
            last = parse(after)
            if last is not None:  # files after it in that order: it may be gone meanwhile
                start = bisect.bisect_right(queued, _dequeue_order(last), key=_dequeue_order)
                queued = queued[start:]
        read = ((item.name, self._read(item)) for item in queued)
        taken = page_of(((n, b) for n, b in read if b is not None), limit, max_bytes)
        more = bool(taken) and str(taken[-1][0]) != queued[-1].name
        priorities = {item.name: item.priority for item in queued}
        shown: dict[Hashable, int] = {name: priorities[str(name)] for name, _ in taken}
        return BrowsePage(taken, str(taken[-1][0]) if more else None, shown)

    def _queued(self) -> list[QueuedName]:
        try:
            names = os.listdir(self._new_dir)
        except FileNotFoundError:
            return []  # nothing was ever sent here
        queued = [parsed for parsed in map(parse, names) if parsed is not None]
        queued.sort(key=_dequeue_order)
        return queued

    def _read(self, item: QueuedName) -> bytes | None:
        try:
            with open(os.path.join(self._new_dir, item.name), "rb") as file:
                return file.read()
        except FileNotFoundError:
            return None  # a worker took it meanwhile

    def remove(self, entry: Hashable) -> bool:
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
