"""Reading a queue directory without taking anything: what ``hermes failed`` needs."""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterator

from hermes.core import DriverError
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

    def entries(self) -> Iterator[tuple[Hashable, bytes]]:
        try:
            names = os.listdir(self._new_dir)
        except FileNotFoundError:
            return  # nothing was ever sent here
        except OSError as exc:
            raise DriverError(f"{self.driver.url}: cannot list new/: {exc}") from exc
        queued = [parsed for parsed in map(parse, names) if parsed is not None]
        queued.sort(key=_dequeue_order)
        for item in queued:
            try:
                with open(os.path.join(self._new_dir, item.name), "rb") as file:
                    body = file.read()
            except FileNotFoundError:
                continue  # a worker took it meanwhile
            except OSError as exc:
                raise DriverError(f"{self.driver.url}: cannot read new/{item.name}: {exc}") from exc
            yield item.name, body

    def remove(self, entry: Hashable) -> bool:
        try:
            os.unlink(os.path.join(self._new_dir, str(entry)))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise DriverError(f"{self.driver.url}: cannot delete new/{entry}: {exc}") from exc
        return True


def _dequeue_order(queued: QueuedName) -> tuple[int, int, int]:
    return (-queued.priority, queued.available_ns, queued.sequence)


def browse(driver: Driver) -> DirectoryBrowser:
    """The plugin's ``browse``: a :class:`DirectoryBrowser` on a :class:`FileSystemDriver`."""
    if not isinstance(driver, FileSystemDriver):
        raise TypeError(f"{driver!r} is not a FileSystemDriver")
    return DirectoryBrowser(driver)
