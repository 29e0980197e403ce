"""The process's Emitter, made on first use from ``settings.HERMES_URL``."""

from __future__ import annotations

import functools

from django.conf import settings

from hermes.core import Emitter, connect


@functools.cache
def emitter() -> Emitter:
    # One per process, shared by every request: the driver's send() is thread-safe,
    # and a driver made before a pre-fork server (gunicorn) forks works in the children.
    return Emitter(connect(settings.HERMES_URL))
