"""Fleet-wide limits in a queue directory: one JSON file per limit key in ``limits/``.

A file is named like a claim or a record (``k=charge:customer-7``, or ``h=``
and a hash when long) and holds ``{"key": ..., "state": ...}``: the key, so
a scan can name it whatever its file is called, and its state as
:func:`hermes.core.drivertools.limit_state.encode` writes it.

Each decision (take, release, renewal) holds an exclusive ``flock`` on one of
the lock stripes in ``limits/.locks/``, chosen by the file name, from its
read to its write, exactly as job records do: reads the state, runs
:func:`~hermes.core.drivertools.limit_state.take`, ``release`` or ``renew`` with
``time.time()`` (one machine, one clock) and writes the new state to
``limits/.tmp/`` and renames it over the key's file, so a reader that takes
no lock sees one state or the next, never half of one. A file that cannot be
read as a state (cut short by a crash) counts as a key nothing has used.

A scan lists the keys whose state still says something
(:func:`~hermes.core.drivertools.limit_state.keep_for` above 0). A file whose state
says nothing and that nobody wrote for :data:`KEEP_AFTER_S` is deleted, under
its lock and once seen so again, by the scan that meets it, and by a sweep
that one process of the machine runs at most once a minute from a take.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator

from hermes.core.driver import LimitRule, Take
from hermes.core.drivertools import limit_state
from hermes.drivers.filesystem._claim import key_file_name
from hermes.drivers.filesystem._records import _files as _record_files
from hermes.drivers.filesystem._records import _locked, _write, sweep_now_and_then

logger = logging.getLogger("hermes.drivers.filesystem")

#: The directory under the queue directory.
LIMITS_DIR = "limits"
#: Seconds a file is kept, unwritten, after its state stopped saying anything.
KEEP_AFTER_S = 60.0
#: A file in ``.tmp/`` this old was left by a writer that died mid-write.
TMP_MAX_AGE_S = 3600.0
#: A state file larger than this is not one of ours.
_MAX_FILE = 1 << 20

#: Per directory, when this process last looked whether a sweep was due.
_last_sweep_check: dict[str, float] = {}


def take(
    queue_dir: str,
    key: str,
    rule: LimitRule,
    slot: str,
    charged: bool,
    lease_s: float,
    *,
    fsync: bool,
) -> Take:
    """Decide one start of a job of ``key`` (see ``SupportsLimits.limit_take``)."""
    directory = os.path.join(queue_dir, LIMITS_DIR)
    name = key_file_name(key)
    with _locked(directory, name):
        state = _state_of(directory, name, key)
        if state is None:
            state = limit_state.fresh()
        answer = limit_state.take(state, rule, slot, charged, lease_s, time.time())
        _write(directory, name, _body(key, state), fsync)
    try:
        _maybe_sweep(directory)
    except OSError as exc:
        # The decision is written: a failed clean-up must not undo it.
        logger.warning("could not sweep unused limit files in %s - %s", directory, exc)
    return answer


def release(queue_dir: str, key: str, slot: str, *, fsync: bool) -> None:
    """Free ``slot`` of ``key``; nothing is written when it is not held."""
    directory = os.path.join(queue_dir, LIMITS_DIR)
    name = key_file_name(key)
    with _locked(directory, name):
        state = _state_of(directory, name, key)
        if state is None or slot not in state["slots"]:
            return
        limit_state.release(state, slot, time.time())
        _write(directory, name, _body(key, state), fsync)


def renew(queue_dir: str, key: str, slot: str, lease_s: float, *, fsync: bool) -> bool:
    """Extend ``slot``'s lease; False (and nothing written) when it is no longer held."""
    directory = os.path.join(queue_dir, LIMITS_DIR)
    name = key_file_name(key)
    with _locked(directory, name):
        state = _state_of(directory, name, key)
        if state is None or not limit_state.renew(state, slot, lease_s, time.time()):
            return False
        _write(directory, name, _body(key, state), fsync)
    return True


def scan(queue_dir: str, limit: int) -> list[tuple[str, bytes]]:
    """Up to ``limit`` keys whose state says something, with that state.

    Reads the files in directory order until it has ``limit``; a file met on
    the way whose state says nothing and that nobody wrote for
    :data:`KEEP_AFTER_S` is deleted.
    """
    if limit <= 0:
        return []
    directory = os.path.join(queue_dir, LIMITS_DIR)
    found: list[tuple[str, bytes]] = []
    for name, mtime in list(_files(directory)):
        stored = _read(directory, name)
        now = time.time()
        if stored is not None and limit_state.keep_for(stored[1], now) > 0:
            found.append((stored[0], limit_state.encode(stored[1])))
            if len(found) >= limit:
                break
        elif mtime <= now - KEEP_AFTER_S:
            _remove_unused(directory, name)
    return found


def sweep(queue_dir: str) -> None:
    """Delete the files whose state says nothing and that were not written for a while."""
    directory = os.path.join(queue_dir, LIMITS_DIR)
    for name, mtime in list(_files(directory)):
        now = time.time()
        if mtime > now - KEEP_AFTER_S:
            continue
        stored = _read(directory, name)
        if stored is None or limit_state.keep_for(stored[1], now) <= 0:
            _remove_unused(directory, name)
    cutoff = time.time() - TMP_MAX_AGE_S
    with (
        contextlib.suppress(FileNotFoundError),
        os.scandir(os.path.join(directory, ".tmp")) as entries,
    ):
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)


# Files -----------------------------------------------------------------------


def _body(key: str, state: limit_state.State) -> bytes:
    return json.dumps({"key": key, "state": state}, separators=(",", ":")).encode()


def _files(directory: str) -> Iterator[tuple[str, float]]:
    """``(name, mtime)`` of every state file."""
    for mtime_ns, name in _record_files(directory):
        yield name, mtime_ns / 1e9


def _read(directory: str, name: str) -> tuple[str, limit_state.State] | None:
    """The key and state in file ``name``; None when there is none, or it is no state."""
    try:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = os.read(fd, _MAX_FILE)
    except IsADirectoryError:
        return None  # not ours: a state is a file
    finally:
        os.close(fd)
    try:
        stored = json.loads(data)
        key, state = stored["key"], stored["state"]
        if not isinstance(key, str) or not isinstance(state.get("slots"), dict):
            return None
        limit_state.keep_for(state, 0.0)  # every field a decision reads is there
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        return None  # cut short or not written here: no state
    return key, state


def _state_of(directory: str, name: str, key: str) -> limit_state.State | None:
    """The state of ``key`` in file ``name``, None if it has none; under the file's lock."""
    stored = _read(directory, name)
    if stored is None or stored[0] != key:
        return None  # a hashed name shared with another key would be overwritten
    return stored[1]


def _remove_unused(directory: str, name: str) -> None:
    """Delete file ``name`` if, under its lock, its state still says nothing."""
    with _locked(directory, name):
        try:
            mtime = os.stat(os.path.join(directory, name)).st_mtime
        except FileNotFoundError:
            return
        now = time.time()
        if mtime > now - KEEP_AFTER_S:
            return  # written meanwhile
        stored = _read(directory, name)
        if stored is not None and limit_state.keep_for(stored[1], now) > 0:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))


def _maybe_sweep(directory: str) -> None:
    sweep_now_and_then(directory, sweep, _last_sweep_check)
