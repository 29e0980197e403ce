"""hermes-dashboard: ``hermes dashboard``, a web view of a Hermes deployment.

Server-rendered pages (no JavaScript, every asset in the wheel): queues and
what waits in them, the failed-message store with retry and delete, the live
workers from their heartbeats and the jobs they run now, periodic entries.
Binds 127.0.0.1 by default; any other address needs authentication or
``--read-only``; every change is a POST carrying a CSRF token.
"""

from hermes.dashboard._app import Auth, create_app
from hermes.dashboard._state import Dashboard

__all__ = ["Auth", "Dashboard", "create_app"]
