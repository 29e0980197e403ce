"""A worker's eye on the job records: cancels of the jobs it runs, and jobs lost elsewhere.

The records store is shared by every process, so a cancel reaches a running
job through its record: :meth:`~hermes.core.jobs.Jobs.cancel` sets
``cancel_requested`` and the worker running the job hears of it. One
:class:`RecordWatch` thread per worker does the listening for all of its
running jobs, blocked in the store's wait (Redis pub/sub, a condition in
memory; one record at a time on a store that cannot wait on several), never
polling faster than the store's own wait does. A job is looked at once it
has run :data:`WATCH_AFTER_S` (or when the wait in progress ends, at most
:data:`WATCH_ROUND_S` later): a job that ends sooner costs the store nothing
here (a cancel that reaches it then comes too late to stop anything, and
stays noted in its record), and the first look reads the record, so a cancel
made before it is heard.

The same thread sweeps for lost jobs while the worker publishes heartbeats:
every heartbeat interval at most one worker (the one that claims the sweep on
the store, where the store can claim keys) marks ``lost`` the running jobs
whose worker's heartbeat expired (:meth:`~hermes.core.jobs.Jobs.sweep_lost`).
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
import time
from collections.abc import Callable

from hermes.core.app._jobs import JobRecord, Jobs
from hermes.core.model._errors import JobCancelled
from hermes.core.model._message import Message
from hermes.core.spi._door import translate_errors
from hermes.core.spi._driver import Driver, SupportsClaim, SupportsHeartbeats
from hermes.core.spi._registry import notify, plugin_manager

logger = logging.getLogger("hermes")

#: Longest one wait on the records lasts: a job started meanwhile is watched after it.
WATCH_ROUND_S = 1.0
#: How long a job runs before its record is watched.
WATCH_AFTER_S = 0.2
#: The claim that makes one worker the sweeper for an interval.
SWEEP_CLAIM = "sweep:lost"


class RunningJob:
    """The job a handler is running, as :func:`current_job` returns it to the handler."""

    __slots__ = ("_callbacks", "_lock", "cancelled", "id", "message")

    def __init__(self, message: Message) -> None:
        #: The job's id (its message's).
        self.id = message.id
        #: The message the handler runs.
        self.message = message
        #: Set when a cancel of this job arrived while it runs. A sync handler
        #: that can stop checks it (``is_set()``, or ``wait(s)`` between steps)
        #: and stops by raising (:meth:`raise_if_cancelled`).
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~hermes.core.jobs.JobCancelled` if a cancel arrived: the handler stops."""
        if self.cancelled.is_set():
            raise JobCancelled(f"job #{self.id} ({self.message.type}) was cancelled while it ran")

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the cancel arrives (now, if it has); from the watching thread."""
        with self._lock:
            if not self.cancelled.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def cancel(self) -> bool:
        """Tell the handler: set :attr:`cancelled`, run the callbacks. False if already told."""
        with self._lock:
            if self.cancelled.is_set():
                return False
            self.cancelled.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except RuntimeError as exc:  # the handler's event loop closed meanwhile
                logger.debug("Job #%s: its cancel found its handler gone - %s", self.id, exc)
        return True

    def __repr__(self) -> str:
        told = " cancelled" if self.cancelled.is_set() else ""
        return f"<RunningJob #{self.id} ({self.message.type}){told}>"


#: The running job, or only its message when the worker keeps no records (a
#: :class:`RunningJob` is then made when a handler asks: most never do).
_current: contextvars.ContextVar[RunningJob | Message | None] = contextvars.ContextVar(
    "hermes_running_job", default=None
)


def current_job() -> RunningJob | None:
    """The job the calling handler runs; None outside a handler.

    Without a records store nothing can cancel a job: its ``cancelled`` is
    never set, so handler code that checks it runs alike with records on or
    off. An ``async`` handler is cancelled by its task (``CancelledError`` at
    its next ``await``) and needs no flag; it sees the same object.
    """
    current = _current.get()
    if isinstance(current, Message):
        job = RunningJob(current)
        _current.set(job)  # the same object for the rest of this handler's run
        return job
    return current


def watched_job() -> RunningJob | None:
    """The running job when a records store watches it for cancels; else None."""
    current = _current.get()
    return current if isinstance(current, RunningJob) else None


def entering(job: RunningJob | Message) -> contextvars.Token[RunningJob | Message | None]:
    """Make ``job`` (or a job of this message) what :func:`current_job` returns."""
    return _current.set(job)


def leaving(token: contextvars.Token[RunningJob | Message | None]) -> None:
    _current.reset(token)


class RecordWatch:
    """One thread that watches the records of a worker's running jobs, and sweeps lost ones.

    Started by the first :meth:`add` (or :meth:`sweep_with`), stopped by
    :meth:`close`; it can start again afterwards (a Worker run again).
    """

    def __init__(self, jobs: Jobs, on_lost: Callable[[JobRecord], None] | None = None) -> None:
        self.jobs = jobs
        #: Called with each record the sweep marked lost (a workflow counts its step).
        self.on_lost = on_lost
        self._lock = threading.Condition()
        self._running: dict[str, RunningJob] = {}
        # job id -> when it is first looked at (monotonic), in the order added.
        self._due_at: dict[str, float] = {}
        # When the waiting thread wakes (monotonic; inf: never): a job due sooner wakes it.
        self._wakes_at = math.inf
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._registry: SupportsHeartbeats | None = None
        self._heartbeat_id = ""
        self._sweep_every_s = 0.0
        self._next_sweep = 0.0
        self._failing = False

    # Used by the Dispatcher ------------------------------------------------------

    def add(self, message: Message) -> RunningJob:
        """Watch ``message``'s record from now until :meth:`remove`."""
        job = RunningJob(message)
        with self._lock:
            self._running[job.id] = job
            due_at = self._due_at[job.id] = time.monotonic() + WATCH_AFTER_S
            self._started()
            if self._wakes_at > due_at:
                self._lock.notify_all()
        return job

    def remove(self, job: RunningJob) -> None:
        with self._lock:
            if self._running.get(job.id) is job:
                del self._running[job.id]
                del self._due_at[job.id]

    def sweep_with(self, registry: SupportsHeartbeats, heartbeat_id: str, every_s: float) -> None:
        """Sweep for lost jobs every ``every_s`` seconds, judging by ``registry``'s heartbeats.

        ``heartbeat_id`` is this worker's own heartbeat: a sweep that does not
        find it among the live ones (its registry lags, or this worker's
        beats fail) judges nobody.
        """
        with self._lock:
            self._registry = registry
            self._heartbeat_id = heartbeat_id
            self._sweep_every_s = every_s
            self._next_sweep = time.monotonic() + every_s
            self._started()
            self._lock.notify_all()

    def close(self) -> None:
        """Stop the thread (within one wait round) and forget the sweep."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping = True
            self._registry = None
            self._lock.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=WATCH_ROUND_S * 5)

    # The thread -----------------------------------------------------------------

    def _started(self) -> None:
        # Under self._lock.
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(
                target=self._run, name="hermes-record-watch", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        seen: dict[str, bytes | None] = {}
        while True:
            with self._lock:
                while True:
                    if self._stopping:
                        return
                    running, next_due = self._watched(time.monotonic())
                    if running or self._sweep_due():
                        break
                    waits = [t for t in (next_due, self._until_sweep()) if t is not None]
                    timeout = min(waits) if waits else None
                    self._wakes_at = math.inf if timeout is None else time.monotonic() + timeout
                    self._lock.wait(timeout)
                    self._wakes_at = -math.inf  # awake: nobody need wake it
            try:
                self._round(running, seen, next_due)
            except Exception as exc:
                # Said once per outage: the jobs run on, a cancel waits for the store.
                level = logging.DEBUG if self._failing else logging.WARNING
                logger.log(level, "Job records in %r cannot be watched - %s", self.jobs.driver, exc)
                self._failing = True
                with self._lock:
                    if not self._stopping:
                        self._lock.wait(WATCH_ROUND_S)
                continue
            if self._failing:
                self._failing = False
                logger.info("Job records in %r are watched again", self.jobs.driver)

    def _watched(self, now: float) -> tuple[dict[str, RunningJob], float | None]:
        """The running jobs due a look, and the seconds until the next one is (None: none)."""
        # Under self._lock. Added in order, so due in order: stop at the first not yet due.
        running: dict[str, RunningJob] = {}
        for job_id, due_at in self._due_at.items():
            if due_at > now:
                return running, due_at - now
            running[job_id] = self._running[job_id]
        return running, None

    def _round(
        self, running: dict[str, RunningJob], seen: dict[str, bytes | None], next_due: float | None
    ) -> None:
        for job_id in [job_id for job_id in seen if job_id not in running]:
            del seen[job_id]
        for job_id, job in running.items():
            if job_id not in seen:  # first look: a cancel may have come before the watch
                record, data = self.jobs._read(job_id)
                seen[job_id] = data
                self._check(job, record)
        if self._sweep_due():
            self._sweep()
        if not running:
            return
        waits = [t for t in (WATCH_ROUND_S, self._until_sweep() or None, next_due) if t is not None]
        for job_id, data in self.jobs.wait_any(seen, min(waits)).items():
            seen[job_id] = data
            self._check(running[job_id], self.jobs._decode(data, job_id))

    @staticmethod
    def _check(job: RunningJob, record: JobRecord | None) -> None:
        if record is not None and record.cancel_requested and job.cancel():
            logger.debug("Job #%s: a cancel arrived while it runs; its handler is told", job.id)

    def _sweep_due(self) -> bool:
        return self._registry is not None and time.monotonic() >= self._next_sweep

    def _until_sweep(self) -> float | None:
        if self._registry is None:
            return None
        return max(self._next_sweep - time.monotonic(), 0.0)

    def _sweep(self) -> None:
        registry = self._registry
        if registry is None:
            return
        self._next_sweep = time.monotonic() + self._sweep_every_s
        store = self.jobs.driver
        if isinstance(store, SupportsClaim):
            # Claimed a little short of the interval: the next one is free when it is due.
            with translate_errors(store, "claiming the sweep for lost jobs"):
                if not store.claim(SWEEP_CLAIM, max(self._sweep_every_s * 0.9, 0.1)):
                    return
        if isinstance(registry, Driver):
            with translate_errors(registry, "listing heartbeats"):
                beats = registry.heartbeats()
        else:
            beats = registry.heartbeats()
        live = {str(beat.get("id")) for beat in beats if isinstance(beat, dict)}
        if self._heartbeat_id not in live:
            logger.debug("Lost-job sweep skipped: this worker's own heartbeat is not listed")
            return
        for record in self.jobs.sweep_lost(repr(registry), live):
            attempt = record.attempts[-1]
            logger.warning(
                "Job #%s (%s) lost: its worker %s stopped beating while it ran",
                record.id,
                record.type,
                attempt.heartbeat,
            )
            hooks = plugin_manager().hook
            notify(hooks.hermes_job_finished, record=record, message=None)
            if self.on_lost is not None:
                try:
                    self.on_lost(record)
                except Exception as exc:
                    logger.error(
                        "Job #%s (%s) was marked lost, and what follows it could not be "
                        "decided - %s",
                        record.id,
                        record.type,
                        exc,
                    )

    def __repr__(self) -> str:
        return f"<RecordWatch of {len(self._running)} jobs on {self.jobs.driver!r}>"
