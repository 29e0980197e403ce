"""Periodic jobs: the names for declaring entries and running a scheduler from Python.

Most applications need none of these: entries are declared on the
``HandlerRegistry`` (``handlers.every(...)``, ``handlers.cron(...)``) and run
by ``hermes scheduler`` or ``hermes worker --scheduler``. A payload function
receives a :class:`Tick`.
"""

from hermes.core.app._schedule import CatchUp, Entry, Schedule, Tick
from hermes.core.run._scheduler import LocalClaims, Scheduler, TickResult

__all__ = ["CatchUp", "Entry", "LocalClaims", "Schedule", "Scheduler", "Tick", "TickResult"]
