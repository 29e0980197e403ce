"""Hermes on Redis, compatible with PHP Hermes 4.x on the same server.

``connect("redis://localhost:6379/0")`` builds a :class:`RedisSetDriver`;
:class:`RedisShutdown` stops workers through a Redis key.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes.drivers.redis._driver import RedisSetDriver, wake_key
    from hermes.drivers.redis._shutdown import RedisShutdown

__all__ = ["RedisSetDriver", "RedisShutdown", "wake_key"]

# Loading the plugin imports this package; redis-py is imported on first use
# of a name instead (PEP 562), so a process that never uses Redis skips it.
# Hidden from type checkers, which see the imports above and still flag typos.
if not TYPE_CHECKING:
    _HOMES = {
        "RedisSetDriver": "hermes.drivers.redis._driver",
        "wake_key": "hermes.drivers.redis._driver",
        "RedisShutdown": "hermes.drivers.redis._shutdown",
    }

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
