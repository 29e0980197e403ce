"""The file-name scheme of ``new/``: the dequeue order, readable without opening a file.

A message file is called ``<priority>.<available_ns>.<sequence>.<origin>.json``:

* ``priority`` -- the ``send()`` priority, a (possibly negative) integer;
* ``available_ns`` -- when the message may run, in UNIX nanoseconds: its
  ``execute_at`` when that lies in the future, otherwise the moment it was
  sent (never decreasing within one process, so a process's messages keep
  their order even if the clock steps back);
* ``sequence`` -- a per-process counter that orders messages of one process
  with the same ``available_ns``;
* ``origin`` -- the sending process's pid in hex plus random hex digits, so two
  processes never produce the same name (a pid reused later gets other digits).

A worker's claim renames the file into its own directory with
``.d<deliveries>`` before ``.json`` -- how many times it has been claimed,
this claim included -- and a release or a dead worker's recovery puts it back
in ``new/`` under that name, so the next claim counts one more. The claim
stays one atomic rename.

Workers take, among the files whose ``available_ns`` has passed, the highest
priority first and within it the smallest ``(available_ns, sequence)``: FIFO by
the time a message became runnable, as a queue that holds delayed messages
until due would deliver them. ``available_ns`` and ``sequence`` are
zero-padded so ``ls`` lists one priority in dequeue order.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import NamedTuple

#: The largest ``available_ns`` a name carries (20 digits; the year 5138).
_MAX_NS = 10**20 - 1

_PATTERN = re.compile(
    r"(-?[0-9]{1,18})\.([0-9]{1,20})\.([0-9]{1,20})\.([0-9a-f]{1,40})(?:\.d([0-9]{1,9}))?\.json"
)

#: Shown in the quarantine reason of a file whose name does not fit.
SCHEME = "<priority>.<available_ns>.<sequence>.<origin>[.d<deliveries>].json"


class QueuedName(NamedTuple):
    """A parsed message file name; tuples of one priority sort into dequeue order."""

    available_ns: int
    sequence: int
    origin: str
    priority: int
    name: str
    #: How many times a worker has claimed it (0: never).
    deliveries: int = 0

    def claimed_name(self) -> str:
        """The name a claim gives it: one delivery more than now."""
        if not self.deliveries:  # the usual case: a first claim
            return self.name[:-5] + ".d1.json"
        stem = self.name.removesuffix(".json")
        stem = stem[: stem.rindex(".d")]
        return f"{stem}.d{self.deliveries + 1}.json"


def parse(name: str) -> QueuedName | None:
    """The parts of ``name``, or None when it does not follow :data:`SCHEME`."""
    match = _PATTERN.fullmatch(name)
    if match is None:
        return None
    priority, available, sequence, origin, deliveries = match.groups()
    return QueuedName(
        int(available), int(sequence), origin, int(priority), name, int(deliveries or 0)
    )


class _NameSource:
    """Hands out unique, ordered names; one per process, reset in a forked child."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._origin = f"{os.getpid():x}{os.urandom(4).hex()}"
        self._sequence = 0
        self._last_ns = 0

    def next(self, priority: int, execute_at: float | None) -> str:
        now_ns = time.time_ns()
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
            if execute_at is not None and execute_at * 1e9 > now_ns:
                available_ns = min(int(execute_at * 1e9), _MAX_NS)
            else:
                available_ns = self._last_ns = max(now_ns, self._last_ns + 1)
        return f"{priority}.{available_ns:020d}.{sequence:012d}.{self._origin}.json"


_source = _NameSource()
os.register_at_fork(after_in_child=_source._reset)


def next_name(priority: int, execute_at: float | None = None) -> str:
    """A fresh file name for a message of ``priority`` due at ``execute_at`` (None: now)."""
    return _source.next(priority, execute_at)
