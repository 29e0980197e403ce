from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a package that re-exports names lazily (PEP 562).

    Loading a driver plugin imports its package; a package that imports its
    client library there makes every process that lists drivers pay for
    every broker's client. Instead::

        if not TYPE_CHECKING:  # type checkers read the real imports above
            __getattr__, __dir__ = lazy_exports(__name__, {"RedisSetDriver": "._driver"})

    ``homes`` maps each exported name to the module (relative to ``package``
    when it starts with a dot) that defines it; it is imported on first access.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
