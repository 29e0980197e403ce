"""A page of what a queue browser lists: the shape every driver's browser returns."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BrowsePage:
    """One page of a :class:`~hermes.core.driver.QueueBrowser`'s listing."""

    #: ``(entry, body)`` of each message on the page, in the browser's order.
    entries: list[tuple[Hashable, bytes | str]]
    #: The ``after`` of the next page; None on the last.
    next: str | None
    #: The priority each entry waits in, where the browser lists several queues
    #: (a scheduled message: the one it goes to when due); absent: not said.
    priorities: Mapping[Hashable, int] = field(default_factory=dict)


def page_of(
    entries: Iterable[tuple[Hashable, bytes | str]], limit: int, max_bytes: int
) -> list[tuple[Hashable, bytes | str]]:
    """The first ``limit`` of ``entries``, or fewer once their bodies reach ``max_bytes``
    (one at least); takes no entry past those it returns."""
    taken: list[tuple[Hashable, bytes | str]] = []
    size = 0
    found = iter(entries)
    while len(taken) < limit and not (taken and size >= max_bytes):
        item = next(found, None)
        if item is None:
            break
        taken.append(item)
        size += len(item[1])
    return taken
