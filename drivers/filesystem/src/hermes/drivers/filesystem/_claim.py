"""Claims in a queue directory: one file per key in ``claims/``, its mtime the claim's expiry.

Winning is creating the file, and creating is atomic: the claim file is
written and given its expiry in ``claims/.tmp/`` first, then hard-linked to
its name, which fails if the name exists (``link`` never overwrites). A
file whose mtime has passed is an expired claim, and replacing it is the
delicate part, since two claimers may find it expired at once and a plain
``unlink`` by name could remove the fresh claim the other one just made.
So an expired file is removed only by the claimer that first hard-links it
to a tomb named after that very file (its inode and mtime): ``link`` lets
exactly one claimer create that name, the name can only ever stand for the
expired file, and while it exists nobody else removes the claim. The
remover then unlinks the claim's name and every claimer races on ``link``
again: one wins.

A claimer that dies holding a tomb would block the key; a tomb older than
:data:`STALE_TOMB_S` is taken for such a leftover and removed. Expired
files are swept out now and then (:data:`SWEEP_INTERVAL_S`) once they are
:data:`SWEEP_AFTER_S` past their expiry.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import uuid
from urllib.parse import quote

#: The directory under the queue directory.
CLAIMS_DIR = "claims"
#: A tomb this old was left by a claimer that died while replacing an expired claim.
STALE_TOMB_S = 10.0
#: How often one process sweeps old expired claims out.
SWEEP_INTERVAL_S = 60.0
#: An expired claim is swept out this long after its expiry (no scheduler looks that far back).
SWEEP_AFTER_S = 2 * 3600.0
#: Rounds of "create, or replace the expired one" before a claimer gives up (as the loser).
_ATTEMPTS = 5
#: Longer names are hashed: most filesystems allow 255 bytes.
_MAX_NAME = 200

_last_sweep: dict[str, float] = {}


def _link(prepared: str, path: str) -> bool:
    """Put the prepared claim file at ``path``; False when a claim already stands there."""
    try:
        os.link(prepared, path)
    except FileExistsError:
        return False  # held by someone: the caller looks whether it has expired
    return True


def claim(queue_dir: str, key: str, ttl_s: float) -> bool:
    """Create the claim file of ``key`` in ``queue_dir/claims`` unless a live one exists."""
    if not ttl_s > 0:
        raise ValueError(f"a claim's ttl_s must be > 0, got {ttl_s!r}")
    directory = os.path.join(queue_dir, CLAIMS_DIR)
    path = os.path.join(directory, key_file_name(key))
    prepared = _prepare(directory, time.time() + ttl_s)
    try:
        for _ in range(_ATTEMPTS):
            if _link(prepared, path):
                return True
            try:
                found = os.stat(path)
            except FileNotFoundError:
                continue  # removed meanwhile: race for it again
            if found.st_mtime_ns > time.time_ns():
                return False
            if not _remove_expired(directory, path, found):
                return False  # another claimer is replacing it: it, or a third one, wins
        return False
    finally:
        os.unlink(prepared)
        _maybe_sweep(directory)


def key_file_name(key: str) -> str:
    """``key`` as a file name: ``k=`` and the key percent-encoded (``h=`` and a hash if long)."""
    name = "k=" + quote(key, safe="@:-_+=,")
    if len(name) > _MAX_NAME:
        name = "h=" + hashlib.sha256(key.encode()).hexdigest()
    return name


def _prepare(directory: str, expiry: float) -> str:
    """A new file in ``directory/.tmp`` whose mtime is ``expiry``."""
    tmp_dir = os.path.join(directory, ".tmp")
    path = os.path.join(tmp_dir, uuid.uuid4().hex)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileNotFoundError:
        os.makedirs(tmp_dir, exist_ok=True)
        os.makedirs(os.path.join(directory, ".tomb"), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.utime(fd, ns=(time.time_ns(), int(expiry * 1e9)))
    finally:
        os.close(fd)
    return path


def _remove_expired(directory: str, path: str, found: os.stat_result) -> bool:
    """Remove the expired claim ``found`` at ``path`` if this caller is its one remover.

    True when the caller should race for the name again (it is gone, or the
    name holds another file now); False when another claimer is removing it.
    """
    identity = (found.st_ino, found.st_mtime_ns)
    tomb = os.path.join(directory, ".tomb", f"{os.path.basename(path)}.{identity[0]}.{identity[1]}")
    try:
        os.link(path, tomb)
    except FileNotFoundError:
        return True  # the claim is gone already
    except FileExistsError:
        try:
            age_s = time.time() - os.stat(tomb).st_ctime
        except FileNotFoundError:
            return True  # its remover finished
        if age_s < STALE_TOMB_S:
            return False
        # Its remover died between the link and the unlinks: clear the way.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tomb)
        return True
    try:
        linked = os.stat(tomb)
        if (linked.st_ino, linked.st_mtime_ns) == identity:
            # This tomb's name stands for the expired file alone, and only its
            # creator removes the claim: the name still holds that file.
            os.unlink(path)
    finally:
        os.unlink(tomb)
    return True


def _maybe_sweep(directory: str) -> None:
    now = time.time()
    if now - _last_sweep.get(directory, 0.0) < SWEEP_INTERVAL_S:
        return
    _last_sweep[directory] = now
    cutoff_ns = int((now - SWEEP_AFTER_S) * 1e9)
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                found = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # replaced or swept by another process meanwhile
            if found.st_mtime_ns < cutoff_ns:
                _remove_expired(directory, entry.path, found)
