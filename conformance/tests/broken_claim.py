"""Deliberately broken claims: the kit's claim row must fail each of them.

Loaded into the kit's runs with ``--hermes-plugin broken_claim``; each is a
memory driver whose ``claim`` has one bug, named by its URL scheme.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from hermes.core import hookimpl
from hermes.core.driver import DriverPlugin, DriverUrl
from hermes.core.spi._memory import MemoryDriver

#: Every broken driver's claims, by key: when each expires (monotonic seconds).
_claims: dict[str, float] = {}
_lock = threading.Lock()


class NotAtomic(MemoryDriver):
    """Looks, then sets, with a gap between: concurrent claimers all see the key free."""

    def claim(self, key: str, ttl_s: float) -> bool:
        now = time.monotonic()
        if _claims.get(self.name + key, now) > now:
            return False
        time.sleep(0.01)  # another claimer looks meanwhile
        _claims[self.name + key] = now + ttl_s
        return True


class NeverExpires(MemoryDriver):
    """Ignores the ttl: a claim once won is held for ever."""

    def claim(self, key: str, ttl_s: float) -> bool:
        with _lock:
            if self.name + key in _claims:
                return False
            _claims[self.name + key] = float("inf")
            return True


class ExpiresAtOnce(MemoryDriver):
    """Ignores the ttl the other way: a claim is free again a moment after it was won."""

    def claim(self, key: str, ttl_s: float) -> bool:
        now = time.monotonic()
        with _lock:
            if _claims.get(self.name + key, now) > now:
                return False
            _claims[self.name + key] = now + 0.05
            return True


BROKEN = {
    "claim-not-atomic": NotAtomic,
    "claim-never-expires": NeverExpires,
    "claim-expires-at-once": ExpiresAtOnce,
}


class BrokenMemory(MemoryDriver):
    """A memory driver with one bug, named by its URL scheme (the limits and tally rows')."""

    #: The URL scheme, which names the bug.
    scheme = ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.scheme}://{self.name}>"


def describe_variant(variants: Sequence[type[BrokenMemory]], scheme: str) -> str | None:
    """The bug ``scheme`` names among ``variants`` (its class docstring), or None."""
    for cls in variants:
        if cls.scheme == scheme:
            return " ".join((cls.__doc__ or "").split())
    return None


def memory_plugin(scheme: str, cls: type[MemoryDriver]) -> DriverPlugin:
    """The plugin of ``scheme``: a broken variant ``cls`` of the memory driver.

    The broken stores of the heartbeat, limits and tally rows register theirs with it too.
    """

    def build(url: DriverUrl) -> MemoryDriver:
        return cls(f"{scheme}-{url.host or url.path or 'default'}")

    return DriverPlugin(
        name=scheme,
        schemes=(scheme,),
        factory=build,
        capabilities=cls.capabilities,
        isolate=lambda url, namespace: f"{scheme}://{namespace}",
        example_url=f"{scheme}://jobs",
    )


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [memory_plugin(scheme, cls) for scheme, cls in BROKEN.items()]
