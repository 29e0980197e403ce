"""Periodic tasks, run by ``manage.py hermes_worker --scheduler``.

Declared next to the task, above its ``@task``::

    @periodic(cron="0 3 * * *")        # in settings.TIME_ZONE unless timezone= says
    @task
    def nightly_report() -> None: ...

or in the backend's settings, for tasks you do not own::

    "OPTIONS": {..., "periodic": {
        "cleanup": {"task": "shop.tasks.cleanup", "every": 3600, "kwargs": {"days": 30}},
    }}

Each entry sends its task, with its arguments, at its task's priority, on
each tick: ``every`` seconds (multiples since the epoch) or on each tick of a
``cron`` expression. However many workers run ``--scheduler``, each tick is
sent once (Hermes's scheduler claims it on the broker). A worker schedules
the tasks of the queue it reads; another queue's are left to its workers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from hermes.core.schedule import Schedule
from hermes.django._compat import Task

T = TypeVar("T")

#: The keys of one entry of ``OPTIONS["periodic"]``.
ENTRY_KEYS = frozenset({"task", "every", "cron", "args", "kwargs", "timezone"})


@dataclass(frozen=True)
class PeriodicTask:
    """One periodic entry: which task, when, with what."""

    name: str
    task: Task[Any, Any]
    every: float | None = None
    cron: str | None = None
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    timezone: str | None = None


#: The entries declared with :func:`periodic`, by name, as their modules were imported.
_declared: dict[str, PeriodicTask] = {}


def periodic(
    *,
    every: float | None = None,
    cron: str | None = None,
    name: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    timezone: str | None = None,
) -> Callable[[T], T]:
    """Decorator, above ``@task``: send the task every ``every`` seconds or on ``cron``'s ticks.

    ``name`` (default: the task's module path) names the entry; two entries
    of one name are refused. ``timezone`` is the cron expression's (default
    ``settings.TIME_ZONE``).
    """
    _when(every, cron, f"@periodic on {name or 'a task'}")

    def declare(task: T) -> T:
        if not isinstance(task, Task):
            raise ImproperlyConfigured(
                f"@periodic decorates a task: put it above @task, not on {task!r}"
            )
        entry = PeriodicTask(
            name or task.module_path, task, every, cron, tuple(args), dict(kwargs or {}), timezone
        )
        declared = _declared.get(entry.name)
        if declared is not None and declared != entry:
            raise ImproperlyConfigured(
                f"two periodic entries are named {entry.name!r}: give each its own name="
            )
        _declared[entry.name] = entry
        return task

    return declare


def from_options(given: object, where: str) -> list[PeriodicTask]:
    """The entries of ``OPTIONS["periodic"]`` (``where`` names it in errors), tasks imported."""
    if given is None:
        return []
    if not isinstance(given, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict of name -> entry, got {given!r}")
    entries = []
    for name, spec in given.items():
        at = f"{where}[{name!r}]"
        if not isinstance(spec, Mapping):
            raise ImproperlyConfigured(f"{at} must be a dict with task and every or cron")
        unknown = sorted(set(spec) - ENTRY_KEYS)
        if unknown:
            raise ImproperlyConfigured(f"{at}: unknown keys {unknown}; known: {sorted(ENTRY_KEYS)}")
        path = spec.get("task")
        try:
            task = import_string(path) if isinstance(path, str) else None
        except ImportError as exc:
            raise ImproperlyConfigured(f"{at}: task {path!r} cannot be imported - {exc}") from None
        if not isinstance(task, Task):
            raise ImproperlyConfigured(f"{at}: task must name a @task function, got {path!r}")
        every, cron = spec.get("every"), spec.get("cron")
        _when(every, cron, at)
        args, kwargs = spec.get("args", ()), spec.get("kwargs", {})
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise ImproperlyConfigured(f"{at}: args must be a list, got {args!r}")
        if not isinstance(kwargs, Mapping):
            raise ImproperlyConfigured(f"{at}: kwargs must be a dict, got {kwargs!r}")
        entries.append(
            PeriodicTask(
                str(name), task, every, cron, tuple(args), dict(kwargs), spec.get("timezone")
            )
        )
    return entries


def declared() -> list[PeriodicTask]:
    """The entries :func:`periodic` declared in the modules imported so far."""
    return list(_declared.values())


def schedule_of(
    entries: Sequence[PeriodicTask],
    payload: Callable[[PeriodicTask], Any],
    priority: Callable[[Task[Any, Any]], int],
) -> Schedule:
    """A Hermes :class:`~hermes.core.schedule.Schedule` of ``entries``.

    ``payload`` makes an entry's message payload (its arguments as the
    backend sends them); ``priority`` the Hermes priority of its task.
    """
    schedule = Schedule()
    for entry in entries:
        common: dict[str, Any] = {
            "type": entry.task.module_path,
            "name": entry.name,
            "payload": payload(entry),
            "priority": priority(entry.task),
        }
        try:
            if entry.cron is not None:
                zone = entry.timezone or getattr(settings, "TIME_ZONE", None) or "UTC"
                schedule.cron(entry.cron, timezone=zone, **common)
            else:
                assert entry.every is not None  # _when() holds one of the two
                schedule.every(seconds=entry.every, **common)
        except Exception as exc:  # Hermes's ConfigurationError: a bad cron, zone or name
            raise ImproperlyConfigured(f"periodic entry {entry.name!r}: {exc}") from None
    return schedule


def _when(every: object, cron: object, where: str) -> None:
    if (every is None) == (cron is None):
        raise ImproperlyConfigured(f"{where}: give every= (seconds) or cron=, one of them")
    if every is not None and (
        isinstance(every, bool) or not isinstance(every, int | float) or every <= 0
    ):
        raise ImproperlyConfigured(
            f"{where}: every must be a number of seconds above 0, got {every!r}"
        )
    if cron is not None and not isinstance(cron, str):
        raise ImproperlyConfigured(f"{where}: cron must be a cron expression, got {cron!r}")
