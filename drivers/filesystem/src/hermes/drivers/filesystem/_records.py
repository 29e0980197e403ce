"""Job records in a queue directory: one file per key in ``records/``.

A record file holds its expiry (UNIX time, as text) on its first line and
the record's bytes after it; its mtime is when the record was created (a
write over a live record sets the new file's mtime to the old one's), which
orders a scan and pages: a page's cursor is ``<mtime_ns>:<file name>`` of the
last file it read, and a page lists one directory and reads the files it
shows. Keys are named like claims (``k=job:4f1c...``, or ``h=`` and a hash
when long).

A write goes to ``records/.tmp/`` and is renamed over the key's file, so a
reader (which takes no lock) sees the old record or the new one, never half
of one. A compare-and-set holds an exclusive ``flock`` on one of
:data:`LOCK_STRIPES` lock files in ``records/.locks/``, chosen by the key's
file name, from its read to its rename: writers of one key take turns across
processes and threads (each call opens the lock file itself, so threads of
one process exclude each other too, and nothing is held across a fork).
Lock files are never deleted, so no lock is ever taken on a removed file.

An expired record counts as absent, and is deleted (under its lock, once
seen still expired) by the reader that finds it. The files of records nobody
reads again are swept out by one process a minute, chosen by a lock of its
own; the sweep also removes what a writer that died left in ``.tmp/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Hashable, Iterator
from urllib.parse import unquote

from hermes.core.driver import BrowsePage
from hermes.drivers.filesystem._claim import key_file_name

logger = logging.getLogger("hermes.drivers.filesystem")

#: The directory under the queue directory.
RECORDS_DIR = "records"
#: How many lock files the keys are spread over.
LOCK_STRIPES = 64
#: How often (at most) one process of the machine sweeps expired records out.
SWEEP_INTERVAL_S = 60.0
#: A file in ``.tmp/`` this old was left by a writer that died mid-write.
TMP_MAX_AGE_S = 3600.0
#: What one read of a record file asks for first.
_READ_SIZE = 1 << 16

#: Per directory, when this process last looked whether a sweep was due.
_last_sweep_check: dict[str, float] = {}


def get(queue_dir: str, key: str) -> bytes | None:
    """The unexpired bytes under ``key``; an expired file found is deleted."""
    directory = os.path.join(queue_dir, RECORDS_DIR)
    name = key_file_name(key)
    stored = _read(directory, name)
    if stored is None:
        return None
    expires_at, value = stored
    if expires_at > time.time():
        return value
    with _locked(directory, name):
        _current(directory, name)  # deletes it if it is still the expired one
    return None


def put(
    queue_dir: str, key: str, value: bytes, ttl_s: float, expect: bytes | None, *, fsync: bool
) -> bool:
    """Write ``value`` if the unexpired bytes stored now are ``expect`` (None: none).

    With ``fsync`` the file and ``records/`` are flushed to disk before it returns.
    """
    if not ttl_s > 0:
        raise ValueError(f"a record's ttl_s must be > 0, got {ttl_s!r}")
    directory = os.path.join(queue_dir, RECORDS_DIR)
    name = key_file_name(key)
    body = repr(time.time() + ttl_s).encode() + b"\n" + bytes(value)
    with _locked(directory, name):
        if _current(directory, name) != expect:
            return False
        created_ns = None
        if expect is not None:  # a live record: it keeps its place
            with contextlib.suppress(FileNotFoundError):
                created_ns = os.stat(os.path.join(directory, name)).st_mtime_ns
        _write(directory, name, body, fsync, created_ns or time.time_ns())
    try:
        _maybe_sweep(directory)
    except OSError as exc:
        # The record is written: a failed clean-up must not report it lost.
        logger.warning("could not sweep expired job records in %s - %s", directory, exc)
    return True


def scan(queue_dir: str, limit: int) -> list[bytes]:
    """Up to ``limit`` unexpired records, the most recently created first.

    The names are sorted by mtime from one listing; only the files needed to
    fill ``limit`` (and the expired ones met on the way) are read.
    """
    if limit <= 0:
        return []
    directory = os.path.join(queue_dir, RECORDS_DIR)
    now = time.time()
    values: list[bytes] = []
    for _, name in sorted(_files(directory), reverse=True):
        stored = _read(directory, name)
        if stored is not None and stored[0] > now:
            values.append(stored[1])
            if len(values) >= limit:
                break
    return values


def page(
    queue_dir: str, after: str | None, limit: int, max_bytes: int, oldest_first: bool
) -> BrowsePage:
    """Up to ``limit`` unexpired records past ``after`` in creation order (see
    ``SupportsRecordPages``); reads the files it lists and one more, or ``limit`` more
    expired ones at most."""
    past: tuple[int, str] | None = None
    if after is not None:
        mtime, colon, name = after.partition(":")
        if not colon or not mtime.isdigit():
            raise ValueError(f"not a page of this store's job records: {after!r}")
        past = (int(mtime), name)
    limit = max(1, limit)
    directory = os.path.join(queue_dir, RECORDS_DIR)
    files = sorted(
        (
            found
            for found in _files(directory)
            if past is None or (found > past if oldest_first else found < past)
        ),
        reverse=not oldest_first,
    )
    now = time.time()
    entries: list[tuple[Hashable, bytes | str]] = []
    size = 0
    last: tuple[int, str] | None = None
    for read, found in enumerate(files):
        if len(entries) >= limit or (entries and size >= max_bytes) or read >= 2 * limit:
            break
        last = found
        stored = _read(directory, found[1])
        if stored is not None and stored[0] > now:
            entries.append((_key_of(found[1]), stored[1]))
            size += len(stored[1])
    else:
        last = None  # every file past ``after`` was read
    return BrowsePage(entries, None if last is None else f"{last[0]}:{last[1]}")


def _key_of(name: str) -> str:
    """The key a record file is named after (its file name when hashed)."""
    return unquote(name[2:]) if name.startswith("k=") else name


def sweep(queue_dir: str) -> None:
    """Delete every expired record file, and old leftovers in ``.tmp/``."""
    directory = os.path.join(queue_dir, RECORDS_DIR)
    now = time.time()
    for _, name in list(_files(directory)):
        stored = _read(directory, name)
        if stored is not None and stored[0] <= now:
            with _locked(directory, name):
                _current(directory, name)
    cutoff = now - TMP_MAX_AGE_S
    with contextlib.suppress(FileNotFoundError), os.scandir(_tmp_dir(directory)) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                # ctime: a new file's mtime is set to its record's creation.
                if entry.stat(follow_symlinks=False).st_ctime < cutoff:
                    os.unlink(entry.path)


# Files -----------------------------------------------------------------------


def _files(directory: str) -> Iterator[tuple[int, str]]:
    """``(mtime_ns, name)`` of every record file."""
    try:
        entries = os.scandir(directory)
    except FileNotFoundError:
        return  # nothing was ever written here
    with entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue  # .tmp, .locks
            try:
                found = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # swept meanwhile
            yield found.st_mtime_ns, entry.name


def _read(directory: str, name: str) -> tuple[float, bytes] | None:
    """The expiry and bytes in file ``name``; None when there is none (or it is no record)."""
    try:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = os.read(fd, _READ_SIZE)
        if len(data) == _READ_SIZE:  # a large record: read on to the end
            parts = [data]
            while chunk := os.read(fd, _READ_SIZE):
                parts.append(chunk)
            data = b"".join(parts)
    except IsADirectoryError:
        return None  # not ours: a record is a file
    finally:
        os.close(fd)
    head, newline, value = data.partition(b"\n")
    try:
        expires_at = float(head)
    except ValueError:
        return None  # not written here: taken for no record
    return (expires_at, value) if newline else None


def _current(directory: str, name: str) -> bytes | None:
    """The unexpired bytes in ``name``, deleting the file if expired; under its lock."""
    stored = _read(directory, name)
    if stored is None:
        return None
    if stored[0] > time.time():
        return stored[1]
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, name))
    return None


def _tmp_dir(directory: str) -> str:
    return os.path.join(directory, ".tmp")


def write_tmp(directory: str, body: bytes, fsync: bool) -> str:
    """A new file in ``directory/.tmp`` holding all of ``body`` (flushed with ``fsync``);
    its path. Nothing is left behind when a write fails."""
    tmp_dir = _tmp_dir(directory)
    path = os.path.join(tmp_dir, uuid.uuid4().hex)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(path, flags, 0o666)
    except FileNotFoundError:
        os.makedirs(tmp_dir, exist_ok=True)
        fd = os.open(path, flags, 0o666)
    try:
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    return path


def _write(
    directory: str, name: str, body: bytes, fsync: bool, created_ns: int | None = None
) -> None:
    """Replace file ``name`` by one holding ``body``, its mtime ``created_ns`` if given."""
    tmp = write_tmp(directory, body, fsync)
    try:
        if created_ns is not None:
            os.utime(tmp, ns=(created_ns, created_ns))
        os.rename(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if fsync:
        _fsync_dir(directory)


# Locks -----------------------------------------------------------------------


@contextlib.contextmanager
def _locked(directory: str, name: str, *, shared: bool = False) -> Iterator[None]:
    """Hold the lock of the stripe of record file ``name`` (``shared``: with other sharers)."""
    stripe = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4]) % LOCK_STRIPES
    fd = _open_lock(directory, f"{stripe:02d}")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


def _open_lock(directory: str, lock_name: str) -> int:
    locks_dir = os.path.join(directory, ".locks")
    path = os.path.join(locks_dir, lock_name)
    try:
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except FileNotFoundError:
        os.makedirs(locks_dir, exist_ok=True)
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)


def _maybe_sweep(directory: str) -> None:
    sweep_now_and_then(directory, sweep, _last_sweep_check)


def sweep_now_and_then(
    directory: str, sweep: Callable[[str], object], checked: dict[str, float]
) -> None:
    """``sweep`` the queue of ``directory`` if no process of the machine did in the last
    :data:`SWEEP_INTERVAL_S` (``checked``: when this process last looked, per directory)."""
    now = time.time()
    if now - checked.get(directory, 0.0) < SWEEP_INTERVAL_S:
        return
    checked[directory] = now
    # The sweep lock file's mtime is when the last sweep began.
    fd = _open_lock(directory, "sweep")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another process is sweeping
        if os.fstat(fd).st_mtime > now - SWEEP_INTERVAL_S:
            return  # another process swept a moment ago
        os.utime(fd)
        sweep(os.path.dirname(directory))
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
