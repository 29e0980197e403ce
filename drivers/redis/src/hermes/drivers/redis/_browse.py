"""Reading a Redis set without popping from it: what ``hermes failed`` needs."""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from hermes.core.driver import Driver
from hermes.drivers.redis._driver import RedisSetDriver

#: Members fetched per ``SSCAN`` round trip.
_SCAN_COUNT = 500


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

    def remove(self, entry: Hashable) -> bool:
        with self.driver.translating(f"deleting from {self.driver.key!r}"):
            return bool(self.driver.client.srem(self.driver.key, entry))  # type: ignore[arg-type]


def browse(driver: Driver) -> SetBrowser:
    """The plugin's ``browse``: a :class:`SetBrowser` on a :class:`RedisSetDriver`."""
    if not isinstance(driver, RedisSetDriver):
        raise TypeError(f"{driver!r} is not a RedisSetDriver")
    return SetBrowser(driver)
