"""librdkafka handles across ``fork()``: each is destroyed only in the process that made it.

:class:`~hermes.core.drivertools.PerProcess` makes a new client in a forked child and
drops its reference to the parent's. Destroying a librdkafka handle joins its
threads, and in a child those threads do not exist: the join waits a second
per handle (measured) or crashes the child (seen when the parent's handle was
collected there as part of an old exception's traceback). So:

* a driver's live handles are listed by the process that made them
  (:class:`Handles`), and a forked child takes one more reference to each of
  the parent's, never dropped;
* a handle a driver is done with is *retired*: held until nothing else holds
  it, then destroyed by :func:`destroy_unused` in its own process -- at the
  driver's close and just before every ``fork()``. A child inherits the
  retired handles still held elsewhere, and never destroys them either.

The child pays for the references with the parent's handles' memory, which
``fork()`` shares with the parent until written.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Callable
from typing import TypeVar

from hermes.core.drivertools import PerProcess

T = TypeVar("T")

#: Handles this process made and is done with, until nothing else holds them.
_retired: list[object] = []


class Handles:
    """One driver's librdkafka handles, by the process that made them, until retired there."""

    def __init__(self) -> None:
        self._by_pid: dict[int, list[object]] = {}
        _registries.add(self)

    def per_process(
        self, make: Callable[[], T], close: Callable[[T], None] | None = None
    ) -> PerProcess[T]:
        """A holder that makes each process its own handle and retires it once discarded."""

        def factory() -> T:
            handle = make()
            self._by_pid.setdefault(os.getpid(), []).append(handle)
            return handle

        def retire(handle: T) -> None:
            with contextlib.suppress(ValueError):  # librdkafka handles compare by identity
                self._by_pid.get(os.getpid(), []).remove(handle)
            _retired.append(handle)
            if close is not None:
                close(handle)

        return PerProcess(factory, retire)

    def holds_any(self) -> bool:
        """Whether any process's handles are listed here."""
        return any(self._by_pid.values())

    def inherited(self) -> list[object]:
        """The handles other processes made (in a forked child: the parent's)."""
        pid = os.getpid()
        return [h for made_in, handles in self._by_pid.items() if made_in != pid for h in handles]


#: Every driver's handles, so a forked child finds the parent's. Weak: a driver
#: that is gone takes its handles along; one that is garbage not collected yet
#: is still here, and a child keeps its handles.
_registries: weakref.WeakSet[Handles] = weakref.WeakSet()


def destroy_unused() -> None:
    """Destroy the retired handles nothing else holds any more (in this, their own process)."""
    i = 0
    while i < len(_retired):
        # Two references: the list's, and the one getrefcount is handed.
        if sys.getrefcount(_retired[i]) <= 2:
            del _retired[i]
        else:
            i += 1


def _before_fork() -> None:
    destroy_unused()
    if _retired or any(registry.holds_any() for registry in list(_registries)):
        # Imported here, in the forking thread, for the child: an import the child
        # began itself could wait for ever on a lock another of the parent's
        # threads held at the fork. (A worker that never forks never pays for it.)
        import ctypes  # noqa: F401


def _keep_inherited() -> None:
    """In a forked child: one reference to each of the parent's handles that is never dropped."""
    inherited = [h for registry in list(_registries) for h in registry.inherited()]
    inherited += _retired
    _retired.clear()
    if not inherited:
        return
    import ctypes  # already imported by _before_fork: no import lock is taken

    for handle in inherited:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))


os.register_at_fork(before=_before_fork, after_in_child=_keep_inherited)
