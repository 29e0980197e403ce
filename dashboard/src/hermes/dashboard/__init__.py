"""hermes-dashboard: ``hermes dashboard``, a web view of a Hermes deployment.

Server-rendered pages (no JavaScript, every asset in the wheel): queues and
what waits in them, the failed-message store with retry and delete, the live
workers from their heartbeats and the jobs they run now, periodic entries.
Binds 127.0.0.1 by default; any other address needs authentication; it
answers only the Host names it is reached by; every change is a POST from its
own pages carrying a CSRF token.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes.dashboard._app import create_app
    from hermes.dashboard._guard import Auth, Hosts
    from hermes.dashboard._state import Dashboard

__all__ = ["Auth", "Dashboard", "Hosts", "create_app"]

#: Each public name and its module, imported on first use: the plugin module
#: (``hermes.dashboard._plugin``) is loaded by every ``hermes`` command, and
#: importing this package must not bring Starlette and Jinja2 with it.
_HOMES = {"Auth": "_guard", "Hosts": "_guard", "create_app": "_app", "Dashboard": "_state"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
