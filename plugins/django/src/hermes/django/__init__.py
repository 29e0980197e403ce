"""Django tasks on Hermes: a task backend, and a worker command.

``TASKS = {"default": {"BACKEND": "hermes.django.HermesBackend", "OPTIONS":
{"url": ..., "results_url": ...}}}`` sends each ``@task`` as a Hermes message
(:class:`HermesBackend`); with ``"hermes.django"`` in ``INSTALLED_APPS``,
``python manage.py hermes_worker`` runs ``hermes worker`` on every installed
app's tasks. Uses ``django.tasks`` where it exists (Django 6), else the
``django_tasks`` backport (Django 5.2, which it is tested on).

Imported lazily: ``hermes.django`` is also the app's name, which Django
imports before settings are ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes.django._backend import HermesBackend as HermesBackend
    from hermes.django._backend import close_connections as close_connections
    from hermes.django._periodic import periodic as periodic

__all__ = ["HermesBackend", "close_connections", "periodic"]

#: Each name, and the module it is imported from when first used.
_MODULES = {
    "HermesBackend": "hermes.django._backend",
    "close_connections": "hermes.django._backend",
    "periodic": "hermes.django._periodic",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        import importlib

        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module 'hermes.django' has no attribute {name!r}")
