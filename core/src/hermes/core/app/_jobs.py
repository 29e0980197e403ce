"""Job records: what happened to each job, in a store the application names.

Every state a job goes through is decided here, and only here; a store
(a driver with :class:`~hermes.core.driver.SupportsRecords`) keeps bytes.
Records are off unless a store is named, so a deployment without one sends
and handles exactly what it did before. The states::

    waiting ──┐                   ┌── succeeded
    scheduled ┴─► running ──┬─────┼── given_up
       │    ▲               │     ├── cancelled (stopped by a cancel while it ran)
       │    │               │     └── lost (its worker's heartbeat ended)
       │    └── failed ◄────┘  (a retry copy is due at ``retry_at``)
       ├── cancelled  (before a worker started it)
       └── expired    (not started before ``expires_at``)

A record says what happened, never what was hoped: ``running`` means a
worker started it and has not said how it ended. When that worker is
SIGKILLed, an at-least-once broker delivers the message again and the record
gains another attempt; on an at-most-once broker (Redis by default) the
running workers sweep: an attempt whose worker's heartbeat has expired ends
``lost`` (:meth:`Jobs.sweep_lost`, run by :class:`~hermes.core.app._watch.RecordWatch`).

Every change is a compare-and-set on the record's bytes, retried on a
conflict, so a cancel and a worker's start never both win. A :class:`Jobs`
remembers the bytes it last wrote for a few thousand jobs not yet ended and
offers them as the expected bytes of its next change to the same job (a
worker's finish after its start), and a new record expects none: a change reads the store
first only when that guess fails. A record written at the emit is what the
message alone says (its id, type, priority, ``created``, expiry and the
records' ``ttl_s``), so a worker in another process guesses it too: a
worker's job costs two round trips to the store (a write at the start, a
write at the end) when its emitter and it keep records alike, three when the
guess fails (a read first).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from hermes.core.app._failed import MAX_EXCEPTION_MESSAGE_CHARS, ExceptionRecord, bounded_head
from hermes.core.model._errors import (
    ConfigurationError,
    HermesError,
    JobResultError,
    JobTimeoutError,
    UnknownJobError,
)
from hermes.core.model._message import Message
from hermes.core.spi._door import translate_errors
from hermes.core.spi._driver import (
    Driver,
    SupportsRecordPages,
    SupportsRecords,
    SupportsRecordWatch,
)
from hermes.core.spi._registry import connect

logger = logging.getLogger("hermes")

#: The header of a message that expires: the UNIX time after which it is not started.
EXPIRES_HEADER = "hermes-expires"
#: The header of a workflow step's message: the token of that send of it
#: (:mod:`hermes.core.workflows`, which a worker imports once a step ends).
WORKFLOW_HEADER = "hermes-workflow"
#: How long a record is kept after its last change, unless told otherwise.
DEFAULT_TTL_S = 24 * 3600.0
#: The largest result kept, serialized; a larger one is the job's error.
MAX_RESULT_BYTES = 512 * 1024
#: Attempts kept per record: the first ones and the latest ones.
MAX_ATTEMPTS_KEPT = 50
#: The most bytes of records one :meth:`Jobs.page` reads: a page of large results
#: lists fewer (one at least), whatever their sizes.
PAGE_BYTES = 8 * 1024 * 1024
#: A filtered :meth:`Jobs.page` reads at most this many times its limit of records
#: to fill itself (and at least :data:`MIN_SCANNED`), as an unfiltered page reads one.
FILTER_READS = 10
MIN_SCANNED = 1000
#: Compare-and-set rounds before a change gives up (another writer keeps winning).
_MAX_ROUNDS = 100
#: Jobs whose last written record a :class:`Jobs` remembers, to change it without a read.
_WRITTEN_KEPT = 4096
#: The largest record remembered (a failed attempt's traceback fits; results are final).
_WRITTEN_MAX_BYTES = 64 * 1024


class JobState(enum.StrEnum):
    """Where a job is. The last five are final: the record changes no more."""

    #: Emitted, waiting for a worker.
    WAITING = "waiting"
    #: Emitted with an ``execute_at`` in the future.
    SCHEDULED = "scheduled"
    #: A worker started it and has not said how it ended.
    RUNNING = "running"
    #: A handler failed; a retry copy is due at ``retry_at``.
    FAILED = "failed"
    #: Every handler succeeded; ``result`` holds what they returned.
    SUCCEEDED = "succeeded"
    #: It failed and is not retried (retries used up, not retryable, no handler,
    #: returned False, set aside).
    GIVEN_UP = "given_up"
    #: Cancelled before a worker started it (no handler ran), or while it ran
    #: and its handler stopped (an ``async`` handler's task was cancelled, a
    #: sync one raised after :attr:`RunningJob.cancelled` was set).
    CANCELLED = "cancelled"
    #: Not started before its expiry: no handler ran.
    EXPIRED = "expired"
    #: Its worker died while it ran, on a broker that does not deliver it again.
    LOST = "lost"

    @property
    def final(self) -> bool:
        """True when the record changes no more."""
        return self in _FINAL


_FINAL = frozenset(
    {JobState.SUCCEEDED, JobState.GIVEN_UP, JobState.CANCELLED, JobState.EXPIRED, JobState.LOST}
)
#: The states of a record written at the emit, whose ``forget_at`` the message says.
_AT_EMIT = frozenset({JobState.WAITING, JobState.SCHEDULED})


@dataclass(frozen=True, slots=True)
class JobError:
    """A failed attempt's exception: class (with its module), message and traceback."""

    #: ``module.QualName`` of the exception's class (``builtins.RuntimeError``).
    type: str
    #: ``str(exception)``, redacted like a log line, at most 2 KiB.
    message: str
    #: The formatted traceback from the handler in, redacted, at most 16 KiB (its end kept).
    traceback: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> JobError:
        """``exc`` as a record keeps it: redacted and bounded, as the failed store keeps it."""
        kept = ExceptionRecord.of(exc)
        return cls(kept.exception_class, kept.message, kept.traceback or None)

    @classmethod
    def reason(cls, text: str) -> JobError:
        """A failure without an exception (no handler, returned False, set aside)."""
        return cls("", bounded_head(text, MAX_EXCEPTION_MESSAGE_CHARS))

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.type else self.message


@dataclass(frozen=True, slots=True)
class Attempt:
    """One worker's run of the job."""

    #: ``host:pid`` of the worker process.
    worker: str
    #: When it started (UNIX time).
    started_at: float
    #: When it ended; None while it runs (or when its worker died).
    finished_at: float | None = None
    #: How it ended: an :class:`~hermes.core.Outcome` value, ``cancelled``,
    #: ``expired``; None while it runs.
    outcome: str | None = None
    #: The exception of a failed attempt.
    error: JobError | None = None
    #: The heartbeat id of the worker (``host:pid:random``), when its death can
    #: be told from it: it publishes heartbeats and its broker does not deliver
    #: its message again. None: this attempt is never judged lost.
    heartbeat: str | None = None
    #: Where that heartbeat is kept (the registry's ``repr``, no password):
    #: only a sweep that reads the same registry judges the attempt.
    registry: str | None = None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What the store knows of one job."""

    id: str
    type: str
    #: The priority it was emitted with (None: not known, e.g. emitted without records).
    priority: int | None
    state: JobState
    #: When it was emitted (the message's ``created``).
    emitted_at: float
    #: When a worker first started it.
    started_at: float | None = None
    #: When its last attempt ended.
    finished_at: float | None = None
    attempts: tuple[Attempt, ...] = ()
    #: The last failure's error (kept after a later success, as history).
    error: JobError | None = None
    #: What the handlers returned (:class:`~hermes.core.Result`), when ``has_result``.
    result: Any = None
    has_result: bool = False
    #: FAILED: when the retry copy is due.
    retry_at: float | None = None
    #: Not started by then: EXPIRED.
    expires_at: float | None = None
    #: A cancel came while it ran; the handler was told. On a ``succeeded``
    #: record: the cancel came too late, the handler had finished its work.
    cancel_requested: bool = False
    #: When the store forgets the record (UNIX time).
    forget_at: float | None = None
    #: Seconds the store keeps the record after each change.
    ttl_s: float = DEFAULT_TTL_S
    #: A workflow step: the token of the copy of its message that first started
    #: (each send of a step carries a fresh one), so a second copy never runs.
    token: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as JSON values (what ``hermes job --json`` prints)."""
        data: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "priority": self.priority,
            "state": self.state.value,
            "emitted_at": self.emitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "attempts": [_attempt_json(a) for a in self.attempts],
            "error": _error_json(self.error),
            "retry_at": self.retry_at,
            "expires_at": self.expires_at,
            "cancel_requested": self.cancel_requested,
            "forget_at": self.forget_at,
            "ttl_s": self.ttl_s,
        }
        if self.has_result:
            data["result"] = self.result
        if self.token is not None:
            data["token"] = self.token
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        return cls(
            id=str(data["id"]),
            type=str(data["type"]),
            priority=data.get("priority"),
            state=JobState(data["state"]),
            emitted_at=float(data["emitted_at"]),
            started_at=data.get("started_at"),
            finished_at=data.get("finished_at"),
            attempts=tuple(_attempt_from(a) for a in data.get("attempts") or ()),
            error=_error_from(data.get("error")),
            result=data.get("result"),
            has_result="result" in data,
            retry_at=data.get("retry_at"),
            expires_at=data.get("expires_at"),
            cancel_requested=bool(data.get("cancel_requested")),
            forget_at=data.get("forget_at"),
            ttl_s=float(data.get("ttl_s") or DEFAULT_TTL_S),
            token=data.get("token"),
        )


def _attempt_json(attempt: Attempt) -> dict[str, Any]:
    data = {
        "worker": attempt.worker,
        "started_at": attempt.started_at,
        "finished_at": attempt.finished_at,
        "outcome": attempt.outcome,
        "error": _error_json(attempt.error),
    }
    if attempt.heartbeat is not None:
        data["heartbeat"] = attempt.heartbeat
        data["registry"] = attempt.registry
    return data


def _attempt_from(data: dict[str, Any]) -> Attempt:
    return Attempt(
        str(data["worker"]),
        float(data["started_at"]),
        data.get("finished_at"),
        data.get("outcome"),
        _error_from(data.get("error")),
        data.get("heartbeat"),
        data.get("registry"),
    )


def _error_json(error: JobError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"type": error.type, "message": error.message, "traceback": error.traceback}


def _error_from(data: dict[str, Any] | None) -> JobError | None:
    if not data:
        return None
    return JobError(
        str(data.get("type") or ""), str(data.get("message") or ""), data.get("traceback")
    )


@dataclass(frozen=True, slots=True)
class Start:
    """What :meth:`Jobs.start` decided for a message a worker took."""

    #: Run the handlers (False: cancelled or expired; acknowledge without running).
    run: bool
    #: ``cancelled`` or ``expired`` when not run; for a workflow step also
    #: ``ended`` (its record is final: a copy delivered again after it ended)
    #: and ``duplicate`` (another copy of the step started first).
    skipped: str | None = None
    #: The record after the decision.
    record: JobRecord | None = None


def worker_name() -> str:
    """``host:pid``: the worker an attempt names."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Jobs:
    """The job records of one store: every state change goes through here.

    ``store`` is a driver with :class:`~hermes.core.driver.SupportsRecords`
    (memory, filesystem, Redis, PostgreSQL), or a URL of one. ``ttl_s`` is how
    long a record is kept after its last change (24 h by default).
    """

    def __init__(self, store: Driver | str, *, ttl_s: float = DEFAULT_TTL_S) -> None:
        driver = connect(store) if isinstance(store, str) else store
        if not isinstance(driver, SupportsRecords):
            raise ConfigurationError(
                f"{driver!r} cannot keep job records; name a store that can: "
                "memory://, file://, redis:// or postgresql://"
            )
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 seconds, got {ttl_s!r}")
        #: The store's driver.
        self.driver: Driver = driver
        self._store: SupportsRecords = driver
        #: Seconds a record is kept after its last change.
        self.ttl_s = ttl_s
        self._owned = isinstance(store, str)
        # job id -> (bytes, record) this object last wrote, oldest first.
        self._written: dict[str, tuple[bytes | None, JobRecord | None]] = {}
        self._written_lock = threading.Lock()

    # Reading -----------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord | None:
        """The record of ``job_id``; None when the store has none."""
        record, _ = self._read(job_id)
        return record

    def job(self, job: Message | str) -> JobHandle:
        """A handle on ``job`` (the message, or its id): its state, result and cancel."""
        return JobHandle(self, job.id if isinstance(job, Message) else str(job))

    def scan(
        self,
        *,
        state: JobState | str | None = None,
        type: str | None = None,
        priority: int | None = None,
        limit: int = 100,
    ) -> list[JobRecord]:
        """Up to ``limit`` records, newest first where the store can tell, filtered
        (the first :meth:`page`)."""
        return self.page(state=state, type=type, priority=priority, limit=limit)[0]

    def page(
        self,
        after: str | None = None,
        *,
        oldest_first: bool = False,
        state: JobState | str | None = None,
        type: str | None = None,
        priority: int | None = None,
        limit: int = 100,
        max_bytes: int = PAGE_BYTES,
    ) -> tuple[list[JobRecord], str | None]:
        """Up to ``limit`` records past ``after`` (the ``next`` of the page before; None:
        the start), newest first (``oldest_first``: oldest first), and the ``next`` of
        this page (None on the last).

        Records are in the order they were created, and paging is stable: a record
        that lived all along is listed once, whatever is written between pages. A
        filter (``state``, ``type``, ``priority``) reads store pages until ``limit``
        records match, :data:`FILTER_READS` times ``limit`` records were read (at
        least :data:`MIN_SCANNED`), or the bytes read reach ``max_bytes``: a filter
        that matches few records gives a short (even empty) page with a ``next`` to
        go on from, never a read of the whole store.
        A store without :class:`~hermes.core.driver.SupportsRecordPages` gives one
        page of its newest records and no ``next``.
        """
        wanted = JobState(state) if state is not None else None

        def matches(record: JobRecord) -> bool:
            return (
                (wanted is None or record.state is wanted)
                and (type is None or record.type == type)
                and (priority is None or record.priority == priority)
            )

        limit = max(1, limit)
        filtered = wanted is not None or type is not None or priority is not None
        budget = max(FILTER_READS * limit, MIN_SCANNED)
        found: list[JobRecord] = []
        store = self._store
        if not isinstance(store, SupportsRecordPages):
            with translate_errors(self.driver, "listing job records"):
                raw = store.record_scan(budget if filtered else limit)
            records = (self._decode(data, "?") for data in raw)
            found = [r for r in records if r is not None and matches(r)][:limit]
            return found, None
        scanned = read = 0
        while True:
            # Never more than the records still wanted: the page's ``next`` is then
            # the store's, and no record past it was read and dropped.
            with translate_errors(self.driver, "listing job records"):
                listed = store.record_page(
                    after, limit - len(found), max_bytes - read, oldest_first=oldest_first
                )
            after = listed.next
            for key, data in listed.entries:
                scanned += 1
                read += len(data)
                record = self._decode(data.encode() if isinstance(data, str) else data, str(key))
                if record is not None and matches(record):
                    found.append(record)
            if (
                after is None
                or len(found) >= limit
                or read >= max_bytes
                or not filtered
                or scanned >= budget
            ):
                return found, after

    def _read(self, job_id: str) -> tuple[JobRecord | None, bytes | None]:
        with translate_errors(self.driver, f"reading the record of job #{job_id}"):
            data = self._store.record_get(_key(job_id))
        return self._decode(data, job_id), data

    def _decode(self, data: bytes | None, job_id: str) -> JobRecord | None:
        if data is None:
            return None
        try:
            return JobRecord.from_json(json.loads(data))
        except (ValueError, KeyError, TypeError) as exc:
            logger.error(
                "The record of job #%s in %r is not readable - %s", job_id, self.driver, exc
            )
            return None

    def _wait(self, job_id: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        with translate_errors(self.driver, f"waiting on the record of job #{job_id}"):
            return self._store.record_wait(_key(job_id), seen, timeout_s)

    def wait_any(
        self, seen: Mapping[str, bytes | None], timeout_s: float
    ) -> dict[str, bytes | None]:
        """The records among ``seen`` (job id -> bytes last read) that changed, by job id.

        Blocks until one changes or ``timeout_s`` passes (then: an empty dict,
        or what changed meanwhile). A store with
        :class:`~hermes.core.driver.SupportsRecordWatch` wakes at once for any
        of them; another is waited on for the first record (its own
        notification or polling) and the others are read when it returns.
        """
        if not seen:
            return {}
        keys = {_key(job_id): job_id for job_id in seen}
        with translate_errors(self.driver, "waiting on job records"):
            if isinstance(self._store, SupportsRecordWatch):
                changed = self._store.record_wait_any(
                    {key: seen[job_id] for key, job_id in keys.items()}, timeout_s
                )
                return {keys[key]: data for key, data in changed.items() if key in keys}
            first, *others = seen
            found: dict[str, bytes | None] = {}
            data = self._store.record_wait(_key(first), seen[first], timeout_s)
            if data != seen[first]:
                found[first] = data
            for job_id in others:
                data = self._store.record_get(_key(job_id))
                if data != seen[job_id]:
                    found[job_id] = data
            return found

    # Changing ----------------------------------------------------------------

    def _change(
        self,
        job_id: str,
        change: Callable[[JobRecord | None], JobRecord | None],
        *,
        new: bool = False,
        likely: JobRecord | None = None,
    ) -> JobRecord | None:
        """Apply ``change`` to the stored record by compare-and-set, again on a conflict.

        ``change`` gets the record (None: none stored) and returns the new one,
        or None to write nothing. Returns what is stored afterwards. The first
        round expects, without reading, what this object last wrote for
        ``job_id``, or else: with ``new``, no record; with ``likely``, that
        record as :meth:`emitted` writes it. A wrong guess costs the read it
        saved, never a wrong write.
        """
        with self._written_lock:
            guess = self._written.pop(job_id, None)
        if guess is None and new:
            guess = (None, None)
        elif guess is None and likely is not None:
            guess = (_encoded(likely), likely)
        for _ in range(_MAX_ROUNDS):
            guessed = guess is not None
            if guess is not None:
                data, record = guess
                guess = None
            else:
                record, data = self._read(job_id)
            wanted = change(record)
            if wanted is None:
                if guessed:
                    continue  # nothing to write on a guess: decide on what is stored
                return record
            if wanted.state not in _AT_EMIT or wanted.forget_at is None:
                wanted = replace(wanted, forget_at=time.time() + wanted.ttl_s)
            body = _encoded(wanted)
            with translate_errors(self.driver, f"writing the record of job #{job_id}"):
                written = self._store.record_put(_key(job_id), body, wanted.ttl_s, data)
            if written:
                self._remember(job_id, body, wanted)
                return wanted
        raise HermesError(
            f"the record of job #{job_id} kept changing under {_MAX_ROUNDS} writes; "
            "nothing was written"
        )

    def _remember(self, job_id: str, body: bytes, record: JobRecord) -> None:
        # A final record is rarely changed again, and a result may be large: neither is kept.
        if record.state.final or len(body) > _WRITTEN_MAX_BYTES:
            return
        with self._written_lock:
            self._written[job_id] = (body, record)
            if len(self._written) > _WRITTEN_KEPT:
                del self._written[next(iter(self._written))]

    def emitted(
        self, message: Message, priority: int, *, expires_at: float | None = None
    ) -> JobRecord | None:
        """A new record for ``message``, just sent: waiting or scheduled.

        Written only when the store has none: a worker that took the message
        first has already written ``running``, and that stands.
        """
        new = self._at_emit(message, priority, expires_at)

        def change(record: JobRecord | None) -> JobRecord | None:
            return new if record is None else None

        return self._change(message.id, change, new=True)

    def _at_emit(self, message: Message, priority: int, expires_at: float | None) -> JobRecord:
        """The record :meth:`emitted` writes: what the message says, and nothing of the clock.

        A worker that takes the message computes the same bytes and expects
        them, so its start writes without reading first.
        """
        execute_at = message.execute_at
        return JobRecord(
            id=message.id,
            type=message.type,
            priority=priority,
            state=(
                JobState.SCHEDULED
                if execute_at is not None and execute_at > message.created
                else JobState.WAITING
            ),
            emitted_at=message.created,
            expires_at=expires_at,
            forget_at=message.created + self.ttl_s,
            ttl_s=self.ttl_s,
        )

    def start(
        self,
        message: Message,
        priority: int,
        expires_at: float | None = None,
        *,
        heartbeat: str | None = None,
        registry: str | None = None,
        token: str | None = None,
    ) -> Start:
        """A worker took ``message``: run it, or skip it (cancelled, expired).

        A message that comes back after a cancel reached it while it ran (its
        worker died; the broker delivered it again) is not run: cancelled.
        ``heartbeat`` and ``registry`` go into the new attempt (see :class:`Attempt`).
        ``token``: a workflow step's copy (see :attr:`JobRecord.token`); it runs
        only while the step has not ended and no other copy started it.
        """
        now = time.time()
        decided: list[Start] = []

        def change(record: JobRecord | None) -> JobRecord | None:
            decided.clear()
            if record is None:
                record = JobRecord(
                    id=message.id,
                    type=message.type,
                    priority=priority,
                    state=JobState.WAITING,
                    emitted_at=message.created,
                    expires_at=expires_at,
                    ttl_s=self.ttl_s,
                )
            if token is not None and record.state.final:
                decided.append(Start(False, "ended", record))
                return None
            if token is not None and record.token not in (None, token):
                decided.append(Start(False, "duplicate", record))
                return None
            if record.state is JobState.CANCELLED:
                decided.append(Start(False, "cancelled", record))
                return None
            if record.cancel_requested:
                decided.append(Start(False, "cancelled"))
                return replace(record, state=JobState.CANCELLED, finished_at=now, retry_at=None)
            deadline = record.expires_at if record.expires_at is not None else expires_at
            if deadline is not None and now > deadline:
                decided.append(Start(False, "expired"))
                return replace(record, state=JobState.EXPIRED, finished_at=now)
            attempt = Attempt(worker_name(), now, heartbeat=heartbeat, registry=registry)
            attempts = _kept((*record.attempts, attempt))
            decided.append(Start(True))
            return replace(
                record,
                token=token if token is not None else record.token,
                state=JobState.RUNNING,
                started_at=record.started_at if record.started_at is not None else now,
                attempts=attempts,
                retry_at=None,
            )

        stored = self._change(
            message.id, change, likely=self._at_emit(message, priority, expires_at)
        )
        start = decided[0]
        return replace(start, record=stored)

    def finish(
        self,
        message: Message,
        outcome: str,
        *,
        state: JobState,
        error: JobError | None = None,
        result: Any = None,
        has_result: bool = False,
        retry_at: float | None = None,
    ) -> JobRecord | None:
        """The worker's last word on ``message``'s attempt: how it ended."""
        if has_result:
            result, error, state, outcome = _checked_result(result, error, state, outcome)
            has_result = error is None or state is JobState.SUCCEEDED
        now = time.time()

        def change(record: JobRecord | None) -> JobRecord | None:
            if record is None:
                record = JobRecord(
                    id=message.id,
                    type=message.type,
                    priority=None,
                    state=JobState.RUNNING,
                    emitted_at=message.created,
                    attempts=(Attempt(worker_name(), now),),
                    ttl_s=self.ttl_s,
                )
            attempts = list(record.attempts)
            if attempts and attempts[-1].finished_at is None:
                attempts[-1] = replace(attempts[-1], finished_at=now, outcome=outcome, error=error)
            return replace(
                record,
                state=state,
                finished_at=now,
                attempts=tuple(attempts),
                error=error if error is not None else record.error,
                result=result if has_result else record.result,
                has_result=has_result or record.has_result,
                retry_at=retry_at,
            )

        return self._change(message.id, change)

    def cancel(self, job_id: str) -> JobRecord:
        """Cancel ``job_id``: waiting or scheduled, no handler will start it.

        Failed and waiting for its retry: no retry starts. Running: the
        cancel is noted in the record (``cancel_requested``); the worker
        running it watches its record, cancels an ``async`` handler's task and
        sets :attr:`RunningJob.cancelled` for a sync one. A handler that stops
        ends the job ``cancelled``; one that finishes anyway ends it
        ``succeeded``, with ``cancel_requested`` kept (the cancel came too
        late). Already ended: nothing changes. Returns the record;
        :class:`UnknownJobError` without one.
        """
        now = time.time()

        def change(record: JobRecord | None) -> JobRecord | None:
            if record is None:
                raise UnknownJobError(f"no record of job #{job_id} in {self.driver!r}", None)
            if record.state in (JobState.WAITING, JobState.SCHEDULED, JobState.FAILED):
                return replace(record, state=JobState.CANCELLED, finished_at=now, retry_at=None)
            if record.state is JobState.RUNNING and not record.cancel_requested:
                return replace(record, cancel_requested=True)
            return None

        stored = self._change(job_id, change)
        assert stored is not None  # change raised when there was none
        return stored

    def lost(self, job_id: str, live_workers: Iterable[str]) -> JobRecord | None:
        """Mark ``job_id`` lost if it is running on a worker not among ``live_workers``.

        ``live_workers`` are the workers whose heartbeat is alive: ``host:pid``
        or heartbeat ids (``host:pid:random``); an attempt whose worker or
        heartbeat is among them is alive. For at-most-once brokers, where a
        dead worker's job never comes back.
        """
        alive = set(live_workers)
        return self._mark_lost(
            job_id, lambda attempt: attempt.worker in alive or attempt.heartbeat in alive
        )

    def sweep_lost(
        self, registry: str, live_heartbeats: Iterable[str], *, limit: int = 1000
    ) -> list[JobRecord]:
        """Mark lost every running job whose worker's heartbeat in ``registry`` has expired.

        Only attempts that name a heartbeat kept in ``registry`` (the
        registry's ``repr``) are judged: a worker without heartbeats, or whose
        heartbeats are kept elsewhere, is never taken for dead. Looks at up to
        ``limit`` running records; returns those it marked lost.
        """
        alive = set(live_heartbeats)

        def judged_alive(attempt: Attempt) -> bool:
            return (
                attempt.heartbeat is None
                or attempt.registry != registry
                or attempt.heartbeat in alive
            )

        marked = []
        for record in self.scan(state=JobState.RUNNING, limit=limit):
            if not record.attempts or judged_alive(record.attempts[-1]):
                continue
            stored = self._mark_lost(record.id, judged_alive)
            if stored is not None and stored.state is JobState.LOST:
                marked.append(stored)
        return marked

    def _mark_lost(self, job_id: str, alive: Callable[[Attempt], bool]) -> JobRecord | None:
        now = time.time()

        def change(record: JobRecord | None) -> JobRecord | None:
            if record is None or record.state is not JobState.RUNNING or not record.attempts:
                return None
            if alive(record.attempts[-1]):
                return None
            attempts = list(record.attempts)
            attempts[-1] = replace(attempts[-1], outcome="lost")
            return replace(record, state=JobState.LOST, attempts=tuple(attempts), finished_at=now)

        return self._change(job_id, change)

    def close(self) -> None:
        """Close the store's driver, when this object connected it from a URL."""
        if self._owned:
            self.driver.close()

    def __repr__(self) -> str:
        return f"<Jobs in {self.driver!r}>"


def _key(job_id: str) -> str:
    return f"job:{job_id}"


def _kept(attempts: tuple[Attempt, ...]) -> tuple[Attempt, ...]:
    # A job redelivered forever (a poison pill) must not grow its record forever.
    if len(attempts) <= MAX_ATTEMPTS_KEPT:
        return attempts
    half = MAX_ATTEMPTS_KEPT // 2
    return attempts[:half] + attempts[-half:]


def _checked_result(
    result: Any, error: JobError | None, state: JobState, outcome: str
) -> tuple[Any, JobError | None, JobState, str]:
    """``result`` if it is JSON within the limit; else the job's error, and no result."""
    try:
        encoded = json.dumps(result, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        why = f"the handler's result is not JSON: {exc}"
        return None, JobError("hermes.core.SerializeError", why), JobState.GIVEN_UP, "bad_result"
    if len(encoded) > MAX_RESULT_BYTES:
        why = (
            f"the handler's result is {len(encoded)} bytes as JSON, over the "
            f"{MAX_RESULT_BYTES} bytes a record keeps; return less, or store it yourself"
        )
        return None, JobError("hermes.core.SerializeError", why), JobState.GIVEN_UP, "bad_result"
    return result, error, state, outcome


class JobHandle:
    """One job, as the code that emitted it sees it: state, result, cancel."""

    def __init__(self, jobs: Jobs, job_id: str) -> None:
        self.jobs = jobs
        #: The job's id (the message's).
        self.id = job_id

    def record(self) -> JobRecord | None:
        """The record now; None when the store has none."""
        return self.jobs.get(self.id)

    @property
    def state(self) -> JobState | None:
        """The state now; None when the store has no record."""
        record = self.record()
        return record.state if record is not None else None

    def cancel(self) -> JobRecord:
        """See :meth:`Jobs.cancel`."""
        return self.jobs.cancel(self.id)

    def result(self, timeout: float | None = None) -> Any:
        """What the job's handlers returned, once it succeeded; waits up to ``timeout`` s.

        Raises :class:`JobResultError` when it ended otherwise (given up,
        cancelled, expired, lost: the record's ``error`` says why),
        :class:`UnknownJobError` when the store has no record, and
        :class:`JobTimeoutError` when ``timeout`` passed first. Waiting does not
        poll: the store wakes it (pub/sub, LISTEN/NOTIFY, a condition).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        record, data = self.jobs._read(self.id)
        while True:
            if record is None:
                raise UnknownJobError(
                    f"no record of job #{self.id} in {self.jobs.driver!r}: emitted without "
                    "records, or forgotten after its ttl",
                    None,
                )
            if record.state.final:
                return _result_of(record)
            left = 60.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise JobTimeoutError(
                    f"job #{self.id} is still {record.state.value} after {timeout:g} s"
                )
            data = self.jobs._wait(self.id, data, min(left, 60.0))
            record = self.jobs._decode(data, self.id)

    async def result_async(self, timeout: float | None = None) -> Any:
        """:meth:`result` for async code: the wait runs in a thread, the loop keeps serving."""
        # Here, not at the top: asyncio (and ssl through it) is a worker's start-up
        # cost, and a caller of this method has it loaded already.
        import asyncio

        return await asyncio.to_thread(self.result, timeout)

    def __repr__(self) -> str:
        return f"<JobHandle #{self.id} in {self.jobs.driver!r}>"


def _result_of(record: JobRecord) -> Any:
    if record.state is JobState.SUCCEEDED:
        return record.result
    why = f": {record.error}" if record.error is not None else ""
    raise JobResultError(f"job #{record.id} ({record.type}) {record.state.value}{why}", record)


def _encoded(record: JobRecord) -> bytes:
    """``record`` as the store keeps it (the same record: the same bytes)."""
    return json.dumps(record.to_json(), separators=(",", ":")).encode()
