"""Tallies in a queue directory: a directory per key in ``tallies/``, a file per member.

A key's directory is named like a record file (``k=workflow-members:...``, or
``h=`` and a hash when long); in it each member has a file named the same way
from the member, holding the member (percent-encoded) on its first line and
its value after it, and ``.expires`` holds the set's expiry (UNIX time, as
text). Every add renews it, written to ``tallies/.tmp/`` and renamed over it,
when that moves it by more than a second (:data:`EXPIRY_PRECISION_S`): a
burst of adds rewrites it about once a second.

Adding a member is creating its file, and creating is atomic: the file is
written in ``tallies/.tmp/`` first, then hard-linked to its name, which fails
if the name exists (``link`` never overwrites). So of any number of adds of
one member exactly one adds it, its value stays, and a reader sees a member's
whole file or none. The count is then a listing of the directory, taken after
the link: a listing shows every name linked before it began, so of concurrent
adds the one whose link comes last counts every member, its own included.

Adds of one key run at once, each holding a shared ``flock`` on the key's
stripe of ``tallies/.locks/`` (as records choose theirs); reads hold it too.
What removes members -- starting a set afresh, or sweeping out an expired one
-- holds it exclusively, so no add links into a set that is being removed and
no read lists half of one. An add that finds no live set (none, or expired)
waits for the exclusive lock, looks again, clears what an expired set left
and starts the set.

An expired set reads as empty. Sets nobody adds to again are swept out by
one process a minute, chosen by a lock of its own, from an add; the sweep
also removes what an adder that died left in ``.tmp/``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from urllib.parse import quote, unquote_to_bytes

from hermes.drivers.filesystem._claim import key_file_name
from hermes.drivers.filesystem._records import _files as _record_files
from hermes.drivers.filesystem._records import (
    _fsync_dir,
    _locked,
    sweep_now_and_then,
    write_tmp,
)

logger = logging.getLogger("hermes.drivers.filesystem")

#: The directory under the queue directory.
TALLIES_DIR = "tallies"
#: The file in a key's directory that holds the set's expiry.
EXPIRES = ".expires"
#: An add rewrites the expiry only when that moves it by more than this (seconds).
EXPIRY_PRECISION_S = 1.0
#: A file in ``.tmp/`` this old was left by an adder that died mid-write.
TMP_MAX_AGE_S = 3600.0
#: What one read of a member file asks for first.
_READ_SIZE = 1 << 16
#: Member files are named by :func:`key_file_name`: ``k=`` or ``h=``.
_MEMBER_PREFIXES = ("k=", "h=")

#: Per directory, when this process last looked whether a sweep was due.
_last_sweep_check: dict[str, float] = {}


def add(
    queue_dir: str, key: str, member: str, value: bytes, ttl_s: float, *, fsync: bool
) -> tuple[bool, int]:
    """Add ``member`` to ``key``'s set unless there; (added by this call, members now).

    With ``fsync`` the member file, the expiry and the directory entries are
    flushed to disk before it returns.
    """
    if not ttl_s > 0:
        raise ValueError(f"a tally's ttl_s must be > 0, got {ttl_s!r}")
    directory = os.path.join(queue_dir, TALLIES_DIR)
    name = key_file_name(key)
    set_dir = os.path.join(directory, name)
    member_name = key_file_name(member)
    body = quote(member, safe="").encode() + b"\n" + bytes(value)
    prepared = write_tmp(directory, body, fsync)
    try:
        answer: tuple[bool, int] | None = None
        with _locked(directory, name, shared=True):
            expires_at = _expiry(set_dir)
            if expires_at > time.time():
                answer = _add(directory, set_dir, expires_at, member_name, prepared, ttl_s, fsync)
        if answer is None:
            # No live set: start one, alone on the key's stripe.
            with _locked(directory, name):
                expires_at = _expiry(set_dir)
                if expires_at <= time.time():
                    _clear(set_dir)  # what an expired set left
                answer = _add(directory, set_dir, expires_at, member_name, prepared, ttl_s, fsync)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(prepared)
    try:
        sweep_now_and_then(directory, sweep, _last_sweep_check)
    except OSError as exc:
        # The member is added: a failed clean-up must not report it lost.
        logger.warning("could not sweep expired tallies in %s - %s", directory, exc)
    return answer


def read(queue_dir: str, key: str) -> dict[str, bytes]:
    """Every member of ``key``'s live set and its value; empty when there is none."""
    directory = os.path.join(queue_dir, TALLIES_DIR)
    name = key_file_name(key)
    set_dir = os.path.join(directory, name)
    if not _alive(set_dir):
        return {}  # no lock (nor lock file) needed to say so
    members: dict[str, bytes] = {}
    with _locked(directory, name, shared=True):
        if not _alive(set_dir):
            return {}
        for member_name in _member_names(set_dir):
            stored = _read_member(os.path.join(set_dir, member_name))
            if stored is not None:
                members[stored[0]] = stored[1]
    return members


def sweep(queue_dir: str) -> None:
    """Delete every expired set, and old leftovers in ``.tmp/``."""
    directory = os.path.join(queue_dir, TALLIES_DIR)
    for _, name in list(_record_files(directory)):
        set_dir = os.path.join(directory, name)
        if _alive(set_dir):
            continue
        with _locked(directory, name):
            if not _alive(set_dir):
                _remove(set_dir)
    cutoff = time.time() - TMP_MAX_AGE_S
    with (
        contextlib.suppress(FileNotFoundError),
        os.scandir(os.path.join(directory, ".tmp")) as entries,
    ):
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)


# Sets ------------------------------------------------------------------------


def _add(
    directory: str,
    set_dir: str,
    expires_at: float,
    member_name: str,
    prepared: str,
    ttl_s: float,
    fsync: bool,
) -> tuple[bool, int]:
    """Renew the set's expiry (``expires_at`` now), link the prepared member file, count.

    Under the stripe's lock. The expiry is rewritten only when it would move
    by more than :data:`EXPIRY_PRECISION_S` (half the ttl, if shorter): adds
    in a burst rewrite it about once a second, not once each.
    """
    deadline = time.time() + ttl_s
    renewed = expires_at < deadline - min(EXPIRY_PRECISION_S, ttl_s / 2)
    if renewed:
        _write_expiry(directory, set_dir, deadline, fsync)
    try:
        os.link(prepared, os.path.join(set_dir, member_name))
        added = True
    except FileExistsError:
        added = False  # there already: its first value stays
    if fsync and (added or renewed):
        _fsync_dir(set_dir)
    # Listed after the link: every member linked before now is counted.
    return added, len(_member_names(set_dir))


def _expiry(set_dir: str) -> float:
    """When the set in ``set_dir`` expires (UNIX time); 0 when there is none."""
    try:
        with open(os.path.join(set_dir, EXPIRES), "rb") as file:
            return float(file.read(64))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError):
        return 0.0  # no set, or not one written here


def _alive(set_dir: str) -> bool:
    """Whether the set in ``set_dir`` exists and has not expired."""
    return _expiry(set_dir) > time.time()


def _write_expiry(directory: str, set_dir: str, deadline: float, fsync: bool) -> None:
    """Replace the set's ``.expires`` by a rename; the set's directory is made if new."""
    expires = write_tmp(directory, repr(deadline).encode(), fsync)
    try:
        try:
            os.rename(expires, os.path.join(set_dir, EXPIRES))
        except FileNotFoundError:
            # A new set (only ever made under the exclusive lock).
            os.makedirs(set_dir, exist_ok=True)
            if fsync:
                _fsync_dir(directory)
            os.rename(expires, os.path.join(set_dir, EXPIRES))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(expires)
        raise


def _clear(set_dir: str) -> None:
    """Delete the members of an expired set, then its expiry; under the exclusive lock.

    Members go first: a remover that dies midway leaves a set that is still
    expired, never members that a new expiry would bring back.
    """
    for member_name in _member_names(set_dir):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(set_dir, member_name))
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        os.unlink(os.path.join(set_dir, EXPIRES))


def _remove(set_dir: str) -> None:
    """Delete an expired set and its directory; under the exclusive lock."""
    try:
        _clear(set_dir)
        os.rmdir(set_dir)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.ENOTDIR, errno.EEXIST):
            raise
        # Files of someone else's in it, or no directory: not ours to delete.


def _member_names(set_dir: str) -> list[str]:
    """The names of the member files in ``set_dir``; none if it does not exist."""
    try:
        names = os.listdir(set_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [name for name in names if name.startswith(_MEMBER_PREFIXES)]


def _read_member(path: str) -> tuple[str, bytes] | None:
    """The member and value in the file at ``path``; None when it is none of ours."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = os.read(fd, _READ_SIZE)
        if len(data) == _READ_SIZE:  # a large value: read on to the end
            parts = [data]
            while chunk := os.read(fd, _READ_SIZE):
                parts.append(chunk)
            data = b"".join(parts)
    except IsADirectoryError:
        return None
    finally:
        os.close(fd)
    head, newline, value = data.partition(b"\n")
    if not newline:
        return None
    try:
        member = unquote_to_bytes(head).decode()
    except UnicodeDecodeError:
        return None
    return member, value
