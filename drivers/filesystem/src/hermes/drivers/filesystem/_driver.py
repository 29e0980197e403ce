"""FileSystemDriver: a queue in a directory, for one machine and no server."""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import math
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from hermes.core import (
    DEFAULT_PRIORITY,
    BrokerRefusedError,
    BrokerUnavailableError,
    ConfigurationError,
    DriverError,
)
from hermes.core.driver import (
    BrowsePage,
    Consumer,
    Driver,
    LimitRule,
    Outgoing,
    QueueStats,
    Received,
    Take,
)
from hermes.drivers.filesystem import _claim, _heartbeat, _limits, _records, _tallies
from hermes.drivers.filesystem._capabilities import CAPABILITIES
from hermes.drivers.filesystem._names import SCHEME, QueuedName, next_name, parse
from hermes.drivers.filesystem._worker import LOCK_NAME, WorkerClaims, recover_dead_workers

logger = logging.getLogger("hermes.drivers.filesystem")

#: Priorities must fit the file-name scheme.
_PRIORITY_LIMIT = 10**18
#: A listing of ``new/`` is redone at least this often, whatever its mtime says.
_FULL_LISTING_S = 1.0
#: What one read of a message file asks for: a regular file's read returns
#: less only at its end, so a message smaller than this takes one read.
_READ_SIZE = 1 << 16
#: Partial files a sender left in ``tmp/`` (it died mid-write) are removed after this.
_TMP_MAX_AGE_S = 3600.0
#: How often ``tmp/`` is checked for such leftovers.
_TMP_CLEANUP_S = 60.0
#: link() failures that mean "this filesystem has no hard links here".
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV}
#: OS errors no retry fixes, beyond PermissionError and NotADirectoryError: a
#: read-only mount. The worker stops and says so.
_REFUSED_ERRNOS = {errno.EROFS}
#: How often (at least) record_wait() reads the record again: a file has no notification.
_RECORD_POLL_S = 0.05
#: OS errors that often pass and are no fault of the queue (out of file
#: descriptors, memory or space, a flaky disk): a worker backs off and tries again.
_PASSING_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC, errno.EIO, errno.EBUSY}


class FileSystemDriver(Driver):
    """Messages as files in a directory shared by the processes of one machine.

    Layout under ``path`` (created on first use)::

        tmp/          a message being written, and worker directories being set up
        new/          queued messages, named so the order is known without reading them
        processing/   processing/<worker-id>/: files a live worker has claimed
        quarantine/   files found in new/ that are not Hermes messages, each with
                      a <name>.reason text file saying why
        claims/       claims of keys (see ``SupportsClaim``), one file each
        workers/      heartbeats of running workers, one JSON file each
        records/      job records (``SupportsRecords``), one file per job
        limits/       fleet-wide limits (``SupportsLimits``), one JSON file per key
        tallies/      tallies (``SupportsTally``), a directory per key, a file per member

    :meth:`put` writes each body (serialized by core) to a file in ``tmp/``
    and renames it into ``new/`` (atomic;
    with ``fsync`` the file and ``new/`` are flushed to disk first, so a sent
    message survives a power cut). A worker claims the next due file by an
    atomic rename into its own directory under ``processing/``, calls the
    callback, then deletes it: at-least-once. A callback that raises puts the
    file back in ``new/`` under its old name, so it keeps its place.

    Order: among files whose time has come (``execute_at``, or when they were
    sent), the highest priority first, FIFO within a priority; a delayed
    message stays in ``new/`` until due. See :mod:`._names` for the scheme.

    Crashes: each worker holds a lock on its ``processing/`` directory while it
    runs. Workers check every ``recovery_interval_s`` (and when they start)
    for directories whose lock is free -- their owner died -- and return those
    files to ``new/``; a live worker's files are never touched. A file whose
    handler outlived the worker's grace period stays claimed, its lock held,
    until the worker's process exits; then it is recovered the same way.

    Errors are declared for core to translate: no permission, a file where a
    directory should be, or a read-only filesystem mean the queue refused
    this process (a worker stops); running out of file descriptors, memory
    or space, or an I/O error, mean it is unavailable for now (a worker backs
    off and tries again); any other OS error is a :class:`DriverError`.

    An idle worker stats ``new/`` every ``poll_interval_s`` and lists it only
    when it changed (or every second regardless). While busy it relists at most
    every ``poll_interval_s`` (longer for a very large backlog), so a
    higher-priority message sent meanwhile overtakes within about that time.

    POSIX only (``flock``, atomic ``rename``); the processes must share one
    machine's filesystem -- network filesystems without working ``flock`` are
    not supported.
    """

    capabilities = CAPABILITIES
    refused_errors = (PermissionError, NotADirectoryError)
    client_errors = (OSError,)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = True,
        poll_interval_s: float = 0.02,
        recovery_interval_s: float = 1.0,
    ) -> None:
        if not 0 < poll_interval_s <= 1:
            raise ConfigurationError(
                f"poll_interval_s must be > 0 and <= 1 second, got {poll_interval_s!r}"
            )
        if not 0 < recovery_interval_s <= 3600:
            raise ConfigurationError(
                f"recovery_interval_s must be > 0 and <= 3600 seconds, got {recovery_interval_s!r}"
            )
        directory = os.fspath(path)
        if not directory:  # abspath("") would be the working directory
            raise ConfigurationError("an empty path cannot be a queue directory")
        #: The queue directory, absolute.
        self.path = os.path.abspath(os.path.expanduser(directory))
        if self.path == os.sep:
            raise ConfigurationError(f"{self.path!r} cannot be a queue directory")
        #: Flush each message file and ``new/`` to disk before ``send()`` returns.
        self.fsync = fsync
        #: Idle worker: how often ``new/`` is checked for changes.
        self.poll_interval_s = poll_interval_s
        #: How often a worker looks for dead workers' claimed files.
        self.recovery_interval_s = recovery_interval_s
        self.capabilities = replace(
            type(self).capabilities,
            redelivery_timeout_s=recovery_interval_s,
            wake_up_s=poll_interval_s,
        )
        self._tmp_dir = os.path.join(self.path, "tmp")
        self._new_dir = os.path.join(self.path, "new")
        self._processing_dir = os.path.join(self.path, "processing")
        #: Where files that are not Hermes messages are moved, each with a ``.reason`` file.
        self.quarantine_dir = os.path.join(self.path, "quarantine")
        #: Files are named by priority, so the queue names given to setup are not kept.
        self._priorities: set[int] = {DEFAULT_PRIORITY}

    @property
    def url(self) -> str:
        """``file:///the/queue/directory``."""
        return "file://" + quote(self.path)

    def __repr__(self) -> str:
        return f"<FileSystemDriver {self.url}>"

    # Sending -----------------------------------------------------------------

    def setup_priority_queue(self, name: str, priority: int) -> None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigurationError(f"priority must be an int, got {priority!r}")
        if abs(priority) >= _PRIORITY_LIMIT:
            raise ConfigurationError(f"priority must be between ±10**18, got {priority}")
        self._priorities.add(priority)

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        """Write every item to ``tmp/``, then rename them into ``new/`` with one flush of it.

        A future ``execute_at`` becomes the file name's due time. An item not
        renamed when a write fails is deleted from ``tmp/``.
        """
        if priority not in self._priorities:
            raise self.unknown_priority(priority, self._priorities)
        staged: list[str] = []
        renamed = 0
        try:
            for item in items:
                name = next_name(priority, item.execute_at)
                fd = self._create_tmp(name)
                staged.append(name)
                try:
                    _write_all(fd, item.body)
                    if self.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            for name in staged:
                source = os.path.join(self._tmp_dir, name)
                target = os.path.join(self._new_dir, name)
                try:
                    os.rename(source, target)
                except FileNotFoundError:
                    # new/ went away under us (a purge racing this send): make it again.
                    self._make_dirs()
                    os.rename(source, target)
                renamed += 1
            if self.fsync:
                _fsync_dir(self._new_dir)
        finally:
            for name in staged[renamed:]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self._tmp_dir, name))

    def classify_error(self, exc: BaseException) -> type[DriverError] | None:
        """OS errors by their errno where the exception class alone does not say it."""
        if isinstance(exc, OSError):
            if exc.errno in _REFUSED_ERRNOS:
                return BrokerRefusedError
            if exc.errno in _PASSING_ERRNOS:
                return BrokerUnavailableError
        return super().classify_error(exc)

    def _create_tmp(self, name: str) -> int:
        path = os.path.join(self._tmp_dir, name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            return os.open(path, flags, 0o666)
        except FileNotFoundError:
            # Directories are created on first use, and again after a purge.
            self._make_dirs()
            return os.open(path, flags, 0o666)

    # Receiving ---------------------------------------------------------------

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _FileConsumer(self, self.check_priorities(self._priorities, priorities))

    def _claim(self, name: str, claimed: str, claims: WorkerClaims) -> bool:
        """Move ``new/<name>`` to ``claimed``; False if another worker took it first."""
        try:
            os.rename(f"{self._new_dir}/{name}", claimed)
        except FileNotFoundError:
            # Another worker won it -- or the queue was purged under us.
            if not claims.is_registered():
                self._make_dirs()
                claims.register()
            return False
        return True

    def _read(self, claimed: str, name: str) -> bytes | None:
        """The claimed file's bytes; None if it was quarantined as unreadable, or purged.

        ``name`` is the file's name once claimed: the one it keeps if it goes back.
        """
        try:
            # os.open and os.read, not open(): a file object costs more than the
            # read itself (measured: 9.8 against 4.3 µs for a small message).
            fd = os.open(claimed, os.O_RDONLY)
            try:
                data = os.read(fd, _READ_SIZE)
                if len(data) == _READ_SIZE:  # a large message: read on to the end
                    parts = [data]
                    while chunk := os.read(fd, _READ_SIZE):
                        parts.append(chunk)
                    data = b"".join(parts)
            finally:
                os.close(fd)
            return data
        except IsADirectoryError as exc:
            self._quarantine(claimed, name, f"cannot read the file: {exc}")
            return None
        except FileNotFoundError:
            return None  # the queue was purged between the claim and the read
        except OSError:
            # Often passing (EMFILE, EIO) and no fault of the message: it keeps its place.
            self._put_back(claimed, name)
            raise

    def _put_back(self, claimed: str, name: str) -> None:
        try:
            os.rename(claimed, os.path.join(self._new_dir, name))
        except OSError as exc:
            # It stays claimed; the worker returns it to new/ when it exits.
            logger.error("%s: could not return %s to new/ - %s", self.url, name, exc)

    # Poison ------------------------------------------------------------------

    def _quarantine(self, claimed: str, name: str, reason: str, level: int = logging.ERROR) -> None:
        _make_dir(self.quarantine_dir)
        target = _move_without_overwriting(claimed, self.quarantine_dir, name)
        when = datetime.now(UTC).isoformat(timespec="seconds")
        with open(target + ".reason", "x", encoding="utf-8") as file:
            file.write(
                f"{reason}\n\nfile: new/{name}\nqueue: {self.path}\n"
                f"quarantined: {when} by process {os.getpid()}\n"
            )
        logger.log(
            level,
            "%s: quarantined new/%s as %s - %s (reason in %s.reason)",
            self.url,
            name,
            target,
            reason,
            target,
        )

    # Housekeeping ------------------------------------------------------------

    def _make_dirs(self) -> None:
        # tmp/ last: a sender that finds tmp/ (made by another thread or process a
        # moment ago) must also find new/ for its rename.
        for path in (self._new_dir, self._processing_dir, self.quarantine_dir, self._tmp_dir):
            _make_dir(path)

    def _clean_tmp(self) -> None:
        cutoff = time.time() - _TMP_MAX_AGE_S
        try:
            entries = list(os.scandir(self._tmp_dir))
        except FileNotFoundError:
            return
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            except FileNotFoundError:
                # Another worker cleaned it up first: nothing left to report.
                continue
            logger.warning(
                "%s: removed %s, left unfinished in tmp/ for over an hour by a process that died",
                self.url,
                entry.path,
            )

    def find_priority_queues(self) -> dict[int, str]:
        """Priorities of the files waiting in ``new/`` that are not set up here.

        File names carry their priority, so every queue is in one directory;
        the names returned are only labels (this driver keeps none).
        """
        found: dict[int, str] = {}
        for name in _names_in(self._new_dir):
            queued = parse(name)
            if queued is not None and queued.priority not in self._priorities:
                found[queued.priority] = f"priority_{queued.priority}"
        return found

    def queue_stats(self) -> list[QueueStats]:
        """Counts from directory listings: ``new/`` (ready or scheduled by the file name's
        time), every worker's ``processing/`` directory, and ``quarantine/``."""
        now_ns = time.time_ns()
        counts: dict[int, collections.Counter[str]] = {
            p: collections.Counter() for p in self._priorities
        }

        def count(directory: str, what: Callable[[QueuedName], str]) -> None:
            for name in _names_in(directory):
                if name.endswith(".reason") or name == LOCK_NAME:
                    continue
                queued = parse(name)
                priority = queued.priority if queued is not None else DEFAULT_PRIORITY
                row = counts.setdefault(priority, collections.Counter())
                row[what(queued) if queued is not None else "set_aside"] += 1

        count(
            self._new_dir,
            lambda q: "ready" if q.available_ns <= now_ns else "scheduled",
        )
        for worker in _names_in(self._processing_dir):
            count(os.path.join(self._processing_dir, worker), lambda q: "in_flight")
        count(self.quarantine_dir, lambda q: "set_aside")
        return [
            QueueStats(
                priority,
                os.path.join(self.path, "new"),
                ready=row["ready"],
                scheduled=row["scheduled"],
                in_flight=row["in_flight"],
                set_aside=row["set_aside"],
            )
            for priority, row in sorted(counts.items(), reverse=True)
        ]

    def purge(self, priority: int | None = None) -> int:
        """Delete the message files of ``priority`` (every priority: None) in ``new/``."""
        if priority is not None and priority not in self._priorities:
            raise self.unknown_priority(priority, self._priorities)
        removed = 0
        for name in _names_in(self._new_dir):
            queued = parse(name)
            if queued is None or (priority is not None and queued.priority != priority):
                continue
            try:
                os.unlink(os.path.join(self._new_dir, name))
            except FileNotFoundError:
                continue  # a worker claimed it meanwhile: it is not waiting any more
            removed += 1
        return removed

    def teardown(self) -> None:
        """Delete the queue: every message (queued, claimed, quarantined) and the directories."""
        workers_dir = os.path.join(self.path, _heartbeat.WORKERS_DIR)
        for path in (
            self._new_dir,
            self._processing_dir,
            self.quarantine_dir,
            self._tmp_dir,
            workers_dir,
            os.path.join(self.path, _records.RECORDS_DIR),
            os.path.join(self.path, _limits.LIMITS_DIR),
            os.path.join(self.path, _tallies.TALLIES_DIR),
        ):
            _remove_tree(path)
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            # Already gone (another purge): the queue is deleted either way.
            pass
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
            # Files of the user's own next to our directories: not ours to delete.

    def claim(self, key: str, ttl_s: float) -> bool:
        """A file in ``claims/`` made with ``link``: see :mod:`._claim` and ``SupportsClaim``."""
        return _claim.claim(self.path, key, ttl_s)

    def beat(self, record: Mapping[str, Any], ttl_s: float) -> None:
        """A JSON file in ``workers/``, replaced atomically; see ``SupportsHeartbeats``."""
        _heartbeat.beat(self.path, record, ttl_s)

    def forget(self, worker_id: str) -> None:
        _heartbeat.forget(self.path, worker_id)

    def heartbeats(self) -> list[dict[str, Any]]:
        return _heartbeat.heartbeats(self.path)

    # Job records: files in records/, see ._records and SupportsRecords ---------

    def record_get(self, key: str) -> bytes | None:
        return _records.get(self.path, key)

    def record_put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        """Compare-and-set under a ``flock``; the write is a rename, flushed with ``fsync``."""
        return _records.put(self.path, key, value, ttl_s, expect, fsync=self.fsync)

    def record_wait(self, key: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        """Reads the record every 50 ms (or ``poll_interval_s`` if longer) until it changes."""
        interval_s = max(_RECORD_POLL_S, self.poll_interval_s)
        deadline = time.monotonic() + timeout_s
        while True:
            current = _records.get(self.path, key)
            left = deadline - time.monotonic()
            if current != seen or left <= 0:
                return current
            time.sleep(min(interval_s, left))

    def record_scan(self, limit: int) -> list[bytes]:
        """Newest first by the files' mtimes; only as many files read as ``limit`` needs."""
        return _records.scan(self.path, limit)

    def record_page(
        self, after: str | None, limit: int, max_bytes: int, *, oldest_first: bool = False
    ) -> BrowsePage:
        """One listing of ``records/`` by mtime (a record's creation), then the files shown."""
        return _records.page(self.path, after, limit, max_bytes, oldest_first)

    # Limits: files in limits/, see ._limits and SupportsLimits --------------------

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        """Decided under a ``flock`` with ``time.time()``; the state is written by a rename."""
        return _limits.take(self.path, key, rule, slot, charged, lease_s, fsync=self.fsync)

    def limit_release(self, key: str, slot: str) -> None:
        _limits.release(self.path, key, slot, fsync=self.fsync)

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        return _limits.renew(self.path, key, slot, lease_s, fsync=self.fsync)

    def limit_scan(self, limit: int) -> list[tuple[str, bytes]]:
        """The keys whose state still holds a slot or promises a turn."""
        return _limits.scan(self.path, limit)

    # Tallies: directories in tallies/, see ._tallies and SupportsTally -----------

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        """A member file hard-linked into the key's directory, then counted by a listing."""
        return _tallies.add(self.path, key, member, value, ttl_s, fsync=self.fsync)

    def tally_read(self, key: str) -> dict[str, bytes]:
        return _tallies.read(self.path, key)


class _FileConsumer(Consumer):
    """One worker's claims on the queue directory.

    The worker directory is registered (and locked) on the first receive.
    ``ack`` deletes the claimed file, ``release`` renames it back into ``new/``
    under its old name, ``reject`` moves it to ``quarantine/``: each is one
    filesystem call, safe from any thread.

    ``close`` returns to ``new/`` only what was claimed and never handed out.
    A file handed out and not settled (its handler outlived the grace period)
    stays claimed, and the worker directory stays locked, until this process
    exits: giving it back now would let another worker run it while its
    handler may still be running. Then the dead-worker recovery returns it.
    """

    def __init__(self, driver: FileSystemDriver, order: list[int]) -> None:
        self.driver = driver
        self.order = order
        self.claims = WorkerClaims(driver._tmp_dir, driver._processing_dir, driver._new_dir)
        self.scan = _Scan(driver._new_dir, order, driver.poll_interval_s, driver._make_dirs)
        self.warned = set(driver._priorities)  # known priorities need no warning
        self.next_recovery = self.next_cleanup = self.next_housekeeping = 0.0
        #: Names of the files handed out and not settled yet (set.add and
        #: set.discard are atomic: handler threads settle concurrently).
        self.held: set[str] = set()

    def receive(self, timeout_s: float) -> Received | None:
        driver, claims = self.driver, self.claims
        if not claims.registered:
            driver._make_dirs()
            claims.register()
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() >= self.next_housekeeping:
                self._housekeeping()
            queued = self.scan.next_due()
            if self.scan.strays:
                for stray in self.scan.take_strays():
                    self._quarantine_stray(stray)
            if self.scan.priorities_seen:
                self._warn_unread_priorities()
            if queued is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                time.sleep(min(self.scan.idle_wait_s(), left))
                continue
            # The worker directory may have been removed by a purge: a failed
            # claim finds out and registers it again. The claimed name counts
            # this delivery (see _names); a release or a recovery keeps it.
            name = queued.claimed_name()
            claimed = f"{claims.path}/{name}"
            if not driver._claim(queued.name, claimed, claims):
                continue
            data = driver._read(claimed, name)
            if data is not None:
                self.held.add(name)
                return Received(
                    data,
                    queued.priority,
                    (claimed, name, queued.name),
                    origin=f"new/{queued.name}",
                    delivery_count=queued.deliveries + 1,
                )

    # Each settle forgets the file first: if the settle fails, the file is still
    # claimed but no handler holds it any more, so close may give it back.

    def ack(self, received: Received) -> None:
        claimed, name, _ = received.token
        self.held.discard(name)
        try:  # not contextlib.suppress: this runs once per message
            os.unlink(claimed)
        except FileNotFoundError:
            pass  # purged meanwhile: nothing to delete

    def release(self, received: Received) -> None:
        claimed, name, _ = received.token
        self.held.discard(name)
        self.driver._put_back(claimed, name)

    def reject(self, received: Received, reason: str) -> None:
        # Core has logged the reason already; the move itself is an INFO line.
        # Quarantined under the name it had in new/, which the reason quotes.
        claimed, name, queued_name = received.token
        self.held.discard(name)
        self.driver._quarantine(claimed, queued_name, reason, level=logging.INFO)

    def close(self) -> None:
        try:
            self.claims.release(keep=set(self.held))
        except OSError as exc:
            logger.error(
                "%s: could not remove worker directory %s - %s",
                self.driver.url,
                self.claims.path,
                exc,
            )

    def _housekeeping(self) -> None:
        driver = self.driver
        now = time.monotonic()
        if now >= self.next_recovery:
            recover_dead_workers(driver._processing_dir, driver._new_dir, self.claims.worker_id)
            self.next_recovery = now + driver.recovery_interval_s
        if now >= self.next_cleanup:
            driver._clean_tmp()
            self.next_cleanup = now + _TMP_CLEANUP_S
        self.next_housekeeping = min(self.next_recovery, self.next_cleanup)

    def _quarantine_stray(self, name: str) -> None:
        # Claim it first, so exactly one worker quarantines it.
        claimed = os.path.join(self.claims.path, name if name != LOCK_NAME else name + "~")
        if self.driver._claim(name, claimed, self.claims):
            self.driver._quarantine(
                claimed, name, f"the file name does not follow the Hermes scheme {SCHEME}"
            )

    def _warn_unread_priorities(self) -> None:
        for priority in self.scan.priorities_seen - self.warned:
            self.warned.add(priority)
            logger.warning(
                "%s: new/ holds messages of priority %d, which this worker does not read; "
                "call setup_priority_queue(name, %d) (hermes worker: --priority) to read them",
                self.driver.url,
                priority,
                priority,
            )


class _Scan:
    """One worker's sorted view of ``new/``: relisted when ``new/`` changes, not per message.

    A listing sorts each priority's names as text -- the names are zero-padded,
    so their text order is the dequeue order -- and a name is parsed only when
    it reaches the head of its queue. A backlog of 100,000 costs one pass over
    the directory and a sort of strings per listing, not 100,000 parsed objects.
    """

    def __init__(
        self, new_dir: str, order: list[int], poll_interval_s: float, make_dirs: Callable[[], None]
    ) -> None:
        self._new_dir = new_dir
        self._order = order
        self._poll_interval_s = poll_interval_s
        self._make_dirs = make_dirs
        #: Each read priority's names in ``new/``, in dequeue order.
        self._queues: dict[int, deque[str]] = {p: deque() for p in order}
        #: The parsed first name of a queue, once looked at.
        self._heads: dict[int, QueuedName] = {}
        #: A name's text before its first dot -> the priority it belongs to.
        self._prefixes = {str(p): p for p in order}
        #: Names in ``new/`` that are not message files (reported once each).
        self.strays: list[str] = []
        #: Priorities outside ``order`` that the listings found in ``new/``.
        self.priorities_seen: set[int] = set()
        #: ``new/``'s mtime before the last listing, and when (wall clock) it started.
        self._mtime_ns = -1
        self._listed_ns = 0
        self._listed_at = -math.inf
        self._listing_cost_s = 0.0
        #: While busy, ``new/`` is looked at (a stat) no more often than the poll interval.
        self._look_at = 0.0

    def next_due(self) -> QueuedName | None:
        """The best due file (highest priority, then oldest), taken off the view."""
        priority = self._first_due()
        if self._stale(priority is not None):
            self._list()
            priority = self._first_due()
        if priority is None:
            return None
        self._queues[priority].popleft()
        return self._heads.pop(priority)

    def take_strays(self) -> list[str]:
        """Names found in ``new/`` that are not message files (each reported once per listing)."""
        strays, self.strays = self.strays, []
        return strays

    def idle_wait_s(self) -> float:
        """How long to sleep: until the next check of ``new/`` or the next delayed file."""
        wait = self._poll_interval_s
        now_ns = time.time_ns()
        for priority in self._order:
            head = self._head(priority)
            if head is not None:
                wait = min(wait, max(0.0, (head.available_ns - now_ns) / 1e9))
        return wait

    def _head(self, priority: int) -> QueuedName | None:
        """The first message file of ``priority``'s queue; names that are not, to the strays."""
        head = self._heads.get(priority)
        if head is not None:
            return head
        queue = self._queues[priority]
        while queue:
            queued = parse(queue[0])
            if queued is not None and queued.priority == priority:
                self._heads[priority] = queued
                return queued
            self.strays.append(queue.popleft())
        return None

    def _first_due(self) -> int | None:
        now_ns = time.time_ns()
        for priority in self._order:
            head = self._head(priority)
            if head is not None and head.available_ns <= now_ns:
                return priority
        return None

    def _stale(self, have_due: bool) -> bool:
        now = time.monotonic()
        since_listing = now - self._listed_at
        # Busy: our own claims change the mtime too. Relist at most every poll
        # interval, and spend at most ~10% of the time listing a huge backlog.
        busy_relist_s = max(self._poll_interval_s, 10 * self._listing_cost_s)
        if have_due and (
            since_listing < min(busy_relist_s, _FULL_LISTING_S) or now < self._look_at
        ):
            # Every mtime case below answers False here: skip the stat on the hot path.
            return False
        self._look_at = now + self._poll_interval_s
        try:
            mtime_ns = os.stat(self._new_dir).st_mtime_ns
        except FileNotFoundError:
            self._make_dirs()
            return True
        # Directory mtimes come from a coarse clock (a few ms; whole seconds on
        # some filesystems): a file added just after a listing can leave the
        # mtime unchanged. Trust "unchanged" only once the listing began well
        # after the last change.
        margin_ns = 2_500_000_000 if self._mtime_ns % 1_000_000_000 == 0 else 50_000_000
        if mtime_ns == self._mtime_ns and self._mtime_ns < self._listed_ns - margin_ns:
            return since_listing >= _FULL_LISTING_S
        if not have_due:
            return True
        return since_listing >= busy_relist_s

    def _list(self) -> None:
        started = time.monotonic()
        listed_ns = time.time_ns()
        prefixes = self._prefixes
        found: dict[int, list[str]] = {p: [] for p in self._order}
        strays: list[str] = []
        try:
            mtime_ns = os.stat(self._new_dir).st_mtime_ns
            with os.scandir(self._new_dir) as entries:
                for entry in entries:
                    name = entry.name
                    priority = prefixes.get(name[: name.find(".")])
                    if priority is not None:
                        found[priority].append(name)
                    else:
                        self._sort_out(name, found, strays)
        except FileNotFoundError:  # purged: an empty queue until the directories are back
            self._make_dirs()
            mtime_ns = -1
        for priority, names in found.items():
            names.sort()
            self._queues[priority] = deque(names)
        self._heads.clear()
        self.strays = strays
        self._mtime_ns, self._listed_ns, self._listed_at = mtime_ns, listed_ns, started
        self._listing_cost_s = time.monotonic() - started

    def _sort_out(self, name: str, found: dict[int, list[str]], strays: list[str]) -> None:
        """A name whose text before the first dot is not a priority read here."""
        queued = parse(name)
        if queued is None:
            strays.append(name)
        elif queued.priority in found:  # written unlike this driver writes it ("0100.")
            found[queued.priority].append(name)
        else:
            self.priorities_seen.add(queued.priority)


def _make_dir(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError as exc:
        # A file where the directory should be: refused like a path under a file.
        raise NotADirectoryError(errno.ENOTDIR, "a file is in the way", path) from exc


def _names_in(directory: str) -> list[str]:
    """The entries of ``directory``; none if it does not exist (yet, or any more)."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _write_all(fd: int, body: bytes) -> None:
    view = memoryview(body)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move_without_overwriting(source: str, directory: str, name: str) -> str:
    """Move ``source`` into ``directory`` as ``name`` (``name.1``, ... if taken); the new path."""
    attempt = 0
    while True:
        target = os.path.join(directory, name if attempt == 0 else f"{name}.{attempt}")
        attempt += 1
        if os.path.lexists(target) or os.path.lexists(target + ".reason"):
            continue
        if os.path.isdir(source) and not os.path.islink(source):
            os.rename(source, target)  # a directory dropped into new/
            return target
        try:
            # link() refuses to replace an existing name, unlike rename().
            os.link(source, target, follow_symlinks=False)
        except FileExistsError:
            # Another worker quarantined a file of that name meanwhile: next suffix.
            continue
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            os.rename(source, target)  # checked free just above
            return target
        os.unlink(source)
        return target


def _remove_tree(path: str) -> None:
    """``rmtree`` that tolerates workers moving files in the tree meanwhile."""
    for _ in range(5):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            if not os.path.lexists(path):
                return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
        # An entry vanished or appeared while deleting: go again.
    if os.path.lexists(path):
        shutil.rmtree(path)
