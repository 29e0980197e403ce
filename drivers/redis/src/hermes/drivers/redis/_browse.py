"""Reading Redis sets without popping from them: the dashboard's Queues page and
``hermes failed`` list and delete through this."""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from hermes.core.driver import DEFAULT_PRIORITY, BrowsePage, Driver
from hermes.drivers.redis._driver import RedisSetDriver

#: Members fetched per ``SSCAN``/``ZSCAN`` round trip.
_SCAN_COUNT = 500
#: Members asked of one scan when paging: a page of large bodies reads few more than it shows.
_PAGE_SCAN_COUNT = 10


class SetBrowser:
    """What waits on a driver: each priority's set, highest priority first, then the
    schedule (``SSCAN``, ``ZSCAN``). An entry is ``(key, member)``; deleting it is an
    ``SREM`` or a ``ZREM``. A member a worker takes between the listing and
    :meth:`remove` makes ``remove`` return False.
    """

    def __init__(self, driver: RedisSetDriver) -> None:
        self.driver = driver

    def _segments(self) -> list[tuple[str, int, bool]]:
        """``(key, priority, is the schedule)`` in listing order."""
        queues = sorted(self.driver.queues().items(), reverse=True)
        segments = [(key, priority, False) for priority, key in queues]
        return [*segments, (self.driver.schedule_key, DEFAULT_PRIORITY, True)]

    def entries(self) -> Iterator[tuple[Hashable, bytes | str]]:
        for key, _, scheduled in self._segments():
            client = self.driver.client
            scan = (
                (member for member, _ in client.zscan_iter(key, count=_SCAN_COUNT))
                if scheduled
                else client.sscan_iter(key, count=_SCAN_COUNT)
            )
            # A scan may return a member twice while the key changes; list each once.
            members = dict.fromkeys(scan)
            for member in members:
                yield (key, member), member

    def page(self, after: str | None, limit: int, max_bytes: int) -> BrowsePage:
        """A page in listing order; ``next`` is ``SEGMENT:CURSOR``, where to go on from.

        A page ends where a scan batch does (batches are small: it may pass
        ``limit`` or ``max_bytes`` by a few members), since a batch asked again
        after the key changed need not hold the same members.
        """
        segments = self._segments()
        index, cursor = _mark(after)
        taken: list[tuple[Hashable, bytes | str]] = []
        priorities: dict[Hashable, int] = {}
        size = 0
        while index < len(segments):
            key, priority, scheduled = segments[index]
            if scheduled:
                following, pairs = self.driver.client.zscan(key, cursor, count=_PAGE_SCAN_COUNT)
                members = [member for member, _ in pairs]
            else:
                following, members = self.driver.client.sscan(key, cursor, count=_PAGE_SCAN_COUNT)
            for member in members:
                entry = (key, member)
                taken.append((entry, member))
                priorities[entry] = priority
                size += len(member)
            cursor = int(following)
            if cursor == 0:
                index += 1
            if index == len(segments):
                return BrowsePage(taken, None, priorities)
            if len(taken) >= limit or size >= max_bytes:
                return BrowsePage(taken, f"{index}:{cursor}", priorities)
        return BrowsePage(taken, None, priorities)

    def remove(self, entry: Hashable) -> bool:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise TypeError(f"not an entry this browser listed: {entry!r}")
        key, member = entry
        client = self.driver.client
        if key == self.driver.schedule_key:
            return bool(client.zrem(key, member))
        return bool(client.srem(key, member))


def _mark(after: str | None) -> tuple[int, int]:
    """``(segment, cursor)`` of a page's ``next``; the start for None or a token not ours."""
    segment, _, cursor = (after or "").partition(":")
    if segment.isdigit() and cursor.isdigit():
        return int(segment), int(cursor)
    return 0, 0


def browse(driver: Driver) -> SetBrowser:
    """The plugin's ``browse``: a :class:`SetBrowser` on a :class:`RedisSetDriver`."""
    if not isinstance(driver, RedisSetDriver):
        raise TypeError(f"{driver!r} is not a RedisSetDriver")
    return SetBrowser(driver)
