"""Reading a Redis set without popping from it: what ``hermes failed`` needs."""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from hermes.core.driver import BrowsePage, Driver
from hermes.drivers.redis._driver import RedisSetDriver

#: Members fetched per ``SSCAN`` round trip.
_SCAN_COUNT = 500
#: Members asked of one ``SSCAN`` when paging: a page of large bodies reads few more than it shows.
_PAGE_SCAN_COUNT = 10


class SetBrowser:
    """The members of a driver's default-priority set (``SSCAN``); deleting one is ``SREM``.

    Messages in the schedule (``execute_at`` in the future) are not listed:
    a failed-message store sends nothing there. A member a worker pops
    between the listing and :meth:`remove` makes ``remove`` return False.
    """

    def __init__(self, driver: RedisSetDriver) -> None:
        self.driver = driver

    def entries(self) -> Iterator[tuple[Hashable, bytes | str]]:
        # A store calls this directly, outside core's translation.
        with self.driver.translating(f"listing {self.driver.key!r}"):
            # SSCAN may return a member twice while the set changes; list each once.
            members = dict.fromkeys(
                self.driver.client.sscan_iter(self.driver.key, count=_SCAN_COUNT)
            )
        for member in members:
            yield member, member

    def page(self, after: str | None, limit: int, max_bytes: int) -> BrowsePage:
        """A page in ``SSCAN`` order, ``next`` the scan cursor to go on from.

        A page ends where an ``SSCAN`` batch does (batches are small: it may pass
        ``limit`` or ``max_bytes`` by a few members), since a batch asked again
        after the set changed need not hold the same members.
        """
        cursor = int(after) if after and after.isdigit() else 0
        taken: list[tuple[Hashable, bytes | str]] = []
        size = 0
        with self.driver.translating(f"listing {self.driver.key!r}"):
            while True:
                following, members = self.driver.client.sscan(
                    self.driver.key, cursor, count=_PAGE_SCAN_COUNT
                )
                taken += [(member, member) for member in members]
                size += sum(len(member) for member in members)
                cursor = int(following)
                if cursor == 0:
                    return BrowsePage(taken, None)
                if len(taken) >= limit or size >= max_bytes:
                    return BrowsePage(taken, str(cursor))

    def remove(self, entry: Hashable) -> bool:
        with self.driver.translating(f"deleting from {self.driver.key!r}"):
            return bool(self.driver.client.srem(self.driver.key, entry))  # type: ignore[arg-type]


def browse(driver: Driver) -> SetBrowser:
    """The plugin's ``browse``: a :class:`SetBrowser` on a :class:`RedisSetDriver`."""
    if not isinstance(driver, RedisSetDriver):
        raise TypeError(f"{driver!r} is not a RedisSetDriver")
    return SetBrowser(driver)
