"""Who holds a claimed file: one directory per worker under ``processing/``, guarded by a lock.

A worker claims a message by renaming it from ``new/`` into
``processing/<worker-id>/``. For as long as it runs, the worker holds an
exclusive ``flock`` on ``processing/<worker-id>/.lock``; the kernel drops the
lock when the process dies, however it dies. Anyone who can take that lock
without blocking therefore knows the owner is gone and returns its files to
``new/`` (keeping their names, so they keep their place in the order). A live
worker's lock cannot be taken, so its files are never touched, and no pid is
ever compared, so pid reuse cannot confuse it.

A worker directory appears under ``processing/`` only with its lock already
held: it is built in ``tmp/`` and renamed into place.

A worker that stops while handlers still run (they outlived the grace period)
keeps the lock of their files until its process exits, so that nobody runs
them twice at once; the recovery above then returns them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Collection

from hermes.core.drivertools import owner_id

logger = logging.getLogger("hermes.drivers.filesystem")

#: The lock file inside every worker directory.
LOCK_NAME = ".lock"

#: Lock descriptors of worker directories left with files whose handlers still
#: ran: held on purpose until the process exits (the kernel then drops them).
_KEPT_LOCKS: list[int] = []


class WorkerClaims:
    """This worker's directory under ``processing/``, locked while it exists."""

    def __init__(self, tmp_dir: str, processing_dir: str, new_dir: str) -> None:
        self._tmp_dir = tmp_dir
        self._processing_dir = processing_dir
        self._new_dir = new_dir
        self._lock_fd: int | None = None
        #: ``<host>:<pid>:<random hex>``, the name of this worker's directory.
        self.worker_id = ""
        #: ``processing/<worker_id>``, where claimed files wait for their callback.
        self.path = ""

    def register(self) -> None:
        """Create and lock a fresh worker directory (again, if it was removed under us)."""
        self.release()
        worker_id = owner_id()
        staging = os.path.join(self._tmp_dir, f"{worker_id}.worker")
        os.mkdir(staging)
        fd = os.open(os.path.join(staging, LOCK_NAME), os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path = os.path.join(self._processing_dir, worker_id)
            os.rename(staging, path)
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd, self.worker_id, self.path = fd, worker_id, path

    @property
    def registered(self) -> bool:
        """True once :meth:`register` made (and locked) a directory, until :meth:`release`."""
        return self._lock_fd is not None

    def is_registered(self) -> bool:
        """False when the directory vanished (the queue was purged while we ran)."""
        return self._lock_fd is not None and os.path.isdir(self.path)

    def release(self, keep: Collection[str] = ()) -> None:
        """Return what is claimed to ``new/``, except ``keep``; then remove the directory, unlock.

        ``keep`` names files whose handlers may still run. If any of them is
        still here, the directory stays, and stays locked, until the process
        exits: the dead-worker recovery of another worker returns them then.
        """
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        kept = 0
        try:
            returned = return_files(self.path, self._new_dir, keep)
            if returned:
                logger.warning(
                    "worker %s returned %d unfinished message(s) to %s on exit",
                    self.worker_id,
                    returned,
                    self._new_dir,
                )
            kept = len(set(keep) & set(_claimed_names(self.path)))
            if kept:
                logger.warning(
                    "worker %s leaves %d message(s) claimed in %s: their handlers still run; "
                    "they return to %s once this process (pid %d) exits",
                    self.worker_id,
                    kept,
                    self.path,
                    self._new_dir,
                    os.getpid(),
                )
                _KEPT_LOCKS.append(fd)
                return
            with contextlib.suppress(FileNotFoundError):  # purged under us: nothing to remove
                os.unlink(os.path.join(self.path, LOCK_NAME))
            _remove_dir(self.path)
        finally:
            if not kept:
                os.close(fd)


def _remove_dir(path: str) -> None:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass  # removed by a racing recoverer, or purged
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY:
            raise
        # A racing recoverer is still returning files; it removes the directory.


def _claimed_names(worker_dir: str) -> list[str]:
    """The message files in ``worker_dir`` (its lock file aside); none if it is gone."""
    try:
        return [name for name in os.listdir(worker_dir) if name != LOCK_NAME]
    except FileNotFoundError:
        return []


def return_files(worker_dir: str, new_dir: str, keep: Collection[str] = ()) -> int:
    """Move the claimed files of ``worker_dir``, but ``keep``, back to ``new/``; how many."""
    returned = 0
    for name in _claimed_names(worker_dir):
        if name in keep:
            continue
        try:
            os.rename(os.path.join(worker_dir, name), os.path.join(new_dir, name))
        except FileNotFoundError:
            continue  # another worker returned it first
        returned += 1
    return returned


def recover_dead_workers(processing_dir: str, new_dir: str, own_id: str) -> int:
    """Return the files of every worker whose lock is free; the number of files returned."""
    try:
        entries = [entry for entry in os.scandir(processing_dir) if entry.name != own_id]
    except FileNotFoundError:
        return 0
    returned = 0
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            returned += _recover(entry.path, entry.name, new_dir)
    return returned


def _recover(worker_dir: str, worker_id: str, new_dir: str) -> int:
    lock_path = os.path.join(worker_dir, LOCK_NAME)
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        # A live worker always has its lock file; without one the directory is
        # a leftover (its owner or a recoverer died while removing it).
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # the owner is alive
        returned = return_files(worker_dir, new_dir)
        if returned:
            logger.warning(
                "worker %s died; returned its %d unfinished message(s) to %s",
                worker_id,
                returned,
                new_dir,
            )
        with contextlib.suppress(FileNotFoundError):  # another recoverer got there first
            os.unlink(lock_path)
        _remove_dir(worker_dir)
        return returned
    finally:
        if fd is not None:
            os.close(fd)
