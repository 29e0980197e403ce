"""Hermes on Redis, compatible with PHP Hermes 4.x on the same server.

``connect("redis://localhost:6379/0")`` builds a :class:`RedisSetDriver`;
:class:`RedisShutdown` stops workers through a Redis key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes.core.drivertools import lazy_exports

if TYPE_CHECKING:
    from hermes.drivers.redis._driver import (
        RedisRefusedError,
        RedisSetDriver,
        RedisTlsError,
        deliveries_key,
        held_key,
        inflight_key,
        rejected_key,
        wake_key,
    )
    from hermes.drivers.redis._shutdown import RedisShutdown

__all__ = [
    "RedisRefusedError",
    "RedisSetDriver",
    "RedisShutdown",
    "RedisTlsError",
    "deliveries_key",
    "held_key",
    "inflight_key",
    "rejected_key",
    "wake_key",
]

# Loading the plugin imports this package; redis-py is imported on first use of a
# name instead, so a process that never uses this broker does not pay for it.
if not TYPE_CHECKING:  # type checkers read the imports above, and still flag typos
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "RedisRefusedError": "._driver",
            "RedisSetDriver": "._driver",
            "RedisTlsError": "._driver",
            "deliveries_key": "._driver",
            "held_key": "._driver",
            "inflight_key": "._driver",
            "rejected_key": "._driver",
            "wake_key": "._driver",
            "RedisShutdown": "._shutdown",
        },
    )
