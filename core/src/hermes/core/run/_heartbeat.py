"""Heartbeats: what each running worker and scheduler says about itself, every few seconds.

A :class:`HeartbeatPublisher` renews one small record on a broker with
:class:`~hermes.core.driver.SupportsHeartbeats` from a daemon thread of its
own, so the job path never waits for it: the handler threads only add and
remove an entry in the Worker's in-flight table (a dict under a lock they
take anyway), and the publisher reads a copy of it once per period. The
record expires after :data:`MISSED_BEATS` periods, so a worker killed with
SIGKILL disappears from ``hermes workers`` by itself; one that stops
removes its record at once.

The record is a JSON object (every reader -- ``hermes workers``, the
dashboard, another language -- sees the same keys)::

    {"id": "web-1:4242:9f3a1c", "kind": "worker", "host": "web-1", "pid": 4242,
     "started": 1767225600.0, "last_seen": 1767225605.0, "interval_s": 5.0,
     "version": "6.0.0", "url": "redis://:***@redis:6379/0",
     "priorities": [], "concurrency": 4, "handled": 10, "failed": 1, "retried": 1,
     "in_flight": [{"type": "invoice.send", "id": "42", "since": 1767225604.2}]}

A scheduler's record has ``"kind": "scheduler"`` and ``"entries"`` (name ->
its next fire and the last tick this scheduler emitted) instead of the counts.

A worker can be asked to stop from elsewhere (the dashboard's Workers page,
``hermes workers --stop ID``): :func:`request_stop` leaves a request under
the worker's id on the registry, which the worker's publisher reads after
each beat; the worker then stops as on SIGTERM (the jobs in its handlers
finish, within the grace period). This needs a registry that also keeps
records (:class:`~hermes.core.driver.SupportsRecords`: Redis, PostgreSQL,
the filesystem); on another, :func:`request_stop` says so.

A worker can also be quieted (the dashboard's Workers page, ``hermes workers
--quiet ID``): :func:`request_quiet` leaves a request the same way, and the
worker, after its next beat, takes no more jobs from any of its priorities
-- as if each were paused for it alone -- while it finishes those it runs
and stays alive, listed with ``"quiet"``, until it is stopped. It is what
one does before a deploy stops it, so that nothing it would have started is
cut short.

A priority can be paused fleet-wide (the dashboard's Queues page, ``hermes
workers --pause PRIORITY``): :func:`pause` keeps the paused priorities in one
record on the registry (:data:`PAUSED_KEY`), which each worker's publisher
reads every :data:`PAUSE_POLL_S`; a worker then finishes what it runs and
reads only the priorities not paused (none: it waits), and its record lists
what it skips under ``"paused"``. :func:`resume` ends a pause the same way.

A child of a worker pool (``hermes worker --processes N``) also says which
pool it belongs to: ``"supervisor_pid"``, the pid of the supervisor that
forked it, and ``"slot"``, its place in the pool (1..N; a replacement takes
the same one). The supervisor publishes no record of its own (it never
connects to a broker), so without these a pool reads as N unrelated workers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from hermes.core.model._errors import HermesError, NotSupportedError
from hermes.core.spi import _entry_points
from hermes.core.spi._door import translate_errors
from hermes.core.spi._driver import (
    Driver,
    SupportsHeartbeats,
    SupportsRecords,
    SupportsStats,
)
from hermes.core.spi._process import owner_id
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core.run._scheduler import Scheduler
    from hermes.core.run._worker import Worker

logger = logging.getLogger("hermes")

#: Seconds between two beats of one worker, by default.
HEARTBEAT_INTERVAL_S = 5.0
#: The environment variable ``hermes worker`` and ``hermes scheduler`` read it from.
INTERVAL_ENV = "HERMES_HEARTBEAT_INTERVAL"
#: A record not renewed for this many periods counts as gone (one late beat is not a death).
MISSED_BEATS = 3

#: ``describe() -> dict``: the changing part of a record, read once per beat.
Describe = Callable[[], dict[str, Any]]
#: ``on_stop(reason)``: what a run does when a stop is requested for it.
OnStop = Callable[[str], None]
#: ``on_pause(paused)``: what a run does when the paused priorities change
#: (priority -> who paused it and when).
OnPause = Callable[[dict[int, dict[str, Any]]], None]
#: The record key the fleet's paused priorities are kept under.
PAUSED_KEY = "hermes-paused"
#: How often a worker reads the paused priorities: a pause holds within about this.
PAUSE_POLL_S = 1.0
#: How long a pause is kept: until resumed, in practice.
PAUSE_TTL_S = 366 * 86400.0
#: How long a stop request waits for its worker: one that has not read it by then is gone.
STOP_REQUEST_TTL_S = 600.0


def stop_key(worker_id: str) -> str:
    """The record key a stop request for ``worker_id`` is kept under."""
    return f"hermes-stop:{worker_id}"


def request_stop(registry: SupportsHeartbeats, worker_id: str, by: str) -> None:
    """Ask the run ``worker_id`` (a heartbeat record's id) to stop; ``by`` says who asked.

    It stops within one heartbeat period. Raises :class:`NotSupportedError` when
    ``registry`` keeps no records, where a request could not be left.
    """
    if not isinstance(registry, SupportsRecords):
        raise NotSupportedError(
            f"{registry!r} keeps heartbeats but no records: a worker on it cannot be asked "
            "to stop (use a redis://, postgresql:// or file:// registry, or signal it)"
        )
    _leave_request(registry, stop_key(worker_id), by, f"asking worker {worker_id} to stop")


def quiet_key(worker_id: str) -> str:
    """The record key a quiet request for ``worker_id`` is kept under."""
    return f"hermes-quiet:{worker_id}"


def request_quiet(registry: SupportsHeartbeats, worker_id: str, by: str) -> None:
    """Ask the worker ``worker_id`` to take no more jobs; ``by`` says who asked.

    Within one heartbeat period it stops taking from each of its priorities,
    lets the jobs it runs finish and stays alive (its record says ``"quiet"``)
    until it is stopped. Raises :class:`NotSupportedError` when ``registry``
    keeps no records.
    """
    _records(registry, "quieting a worker")
    _leave_request(registry, quiet_key(worker_id), by, f"asking worker {worker_id} to quiet")


def _leave_request(registry: SupportsHeartbeats, key: str, by: str, doing: str) -> None:
    assert isinstance(registry, SupportsRecords)
    body = json.dumps({"by": by, "at": time.time()}).encode()
    with _translating_on(registry, doing):
        stored = registry.record_get(key)
        registry.record_put(key, body, STOP_REQUEST_TTL_S, stored)


def _records(registry: SupportsHeartbeats, doing: str) -> SupportsRecords:
    if not isinstance(registry, SupportsRecords):
        raise NotSupportedError(
            f"{registry!r} keeps heartbeats but no records: {doing} needs a registry "
            "that keeps both (redis://, postgresql:// or file://)"
        )
    return registry


def _translating_on(registry: object, doing: str) -> contextlib.AbstractContextManager[None]:
    if isinstance(registry, Driver):
        return translate_errors(registry, doing)
    return contextlib.nullcontext()


def paused_priorities(registry: SupportsHeartbeats) -> dict[int, dict[str, Any]]:
    """The priorities paused on ``registry``: priority -> ``{"by": ..., "at": ...}``.

    A registry that keeps no records has none paused. A record another
    program wrote badly reads as nothing paused, logged.
    """
    if not isinstance(registry, SupportsRecords):
        return {}
    with _translating_on(registry, "reading the paused priorities"):
        body = registry.record_get(PAUSED_KEY)
    return _decode_paused(body)


def _decode_paused(body: bytes | None) -> dict[int, dict[str, Any]]:
    if body is None:
        return {}
    try:
        data = json.loads(body)
        return {int(priority): dict(info) for priority, info in data.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        logger.error("The paused priorities record %r is not readable - %s", PAUSED_KEY, exc)
        return {}


def pause(registry: SupportsHeartbeats, priority: int, by: str) -> bool:
    """Pause ``priority`` for every worker on ``registry``; False if it already was.

    Each worker finishes what it runs and stops taking from that priority
    within :data:`PAUSE_POLL_S` or so. Raises :class:`NotSupportedError` when
    the registry keeps no records.
    """
    return _change_paused(registry, priority, {"by": by, "at": time.time()})


def resume(registry: SupportsHeartbeats, priority: int, by: str) -> bool:
    """End the pause of ``priority``; False if it was not paused. ``by`` is for the log."""
    resumed = _change_paused(registry, priority, None)
    if resumed:
        logger.info("Priority %d resumed %s", priority, by)
    return resumed


def _change_paused(
    registry: SupportsHeartbeats, priority: int, info: dict[str, Any] | None
) -> bool:
    store = _records(registry, "pausing a priority" if info else "resuming a priority")
    for _ in range(100):  # compare-and-set, again while another writer wins
        with _translating_on(registry, "reading the paused priorities"):
            body = store.record_get(PAUSED_KEY)
        paused = _decode_paused(body)
        if (priority in paused) == (info is not None):
            return False
        if info is None:
            del paused[priority]
        else:
            paused[priority] = info
        new = json.dumps({str(p): i for p, i in sorted(paused.items())}).encode()
        with _translating_on(registry, "writing the paused priorities"):
            if store.record_put(PAUSED_KEY, new, PAUSE_TTL_S, body):
                return True
    raise HermesError("the paused priorities kept changing under 100 writes; nothing was written")


def hermes_version() -> str:
    return _entry_points.version("hermes-core") or "unknown"


class HeartbeatPublisher:
    """Beats a record for one run on ``registry`` every ``interval_s`` seconds, on a daemon thread.

    ``url`` is shown redacted (no password leaves the process). Use it as
    :meth:`running` around the run; ``Worker(heartbeat=...)`` does. A broker
    that fails a beat is logged once (WARNING, then DEBUG until it is back,
    then INFO): the run goes on, and the record expires if the outage lasts.
    A pool's child gives ``supervisor_pid`` and ``slot``; the record then
    carries them, and no other record does.
    """

    def __init__(
        self,
        registry: SupportsHeartbeats,
        *,
        url: str = "",
        kind: str = "worker",
        interval_s: float = HEARTBEAT_INTERVAL_S,
        worker_id: str | None = None,
        supervisor_pid: int | None = None,
        slot: int | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"a heartbeat interval must be > 0 seconds, got {interval_s!r}")
        self.registry = registry
        self.kind = kind
        self.interval_s = float(interval_s)
        #: How long a beat lasts: :data:`MISSED_BEATS` periods.
        self.ttl_s = self.interval_s * MISSED_BEATS
        #: This run's id, ``host:pid:random``.
        self.id = worker_id or owner_id()
        self._static: dict[str, Any] = {
            "id": self.id,
            "kind": kind,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.time(),
            "interval_s": self.interval_s,
            "version": hermes_version(),
            "url": redact_url(url) if url else repr(registry),
        }
        if supervisor_pid is not None:
            self._static["supervisor_pid"] = supervisor_pid
        if slot is not None:
            self._static["slot"] = slot
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        #: Who quieted this run (None: nobody), and the priorities it then skips.
        self._quiet: str | None = None
        self._quiet_priorities: list[int] = []

    def record(self, describe: Describe) -> dict[str, Any]:
        """The record as the next beat sends it."""
        return {**self._static, **describe(), "last_seen": time.time()}

    def beat(self, describe: Describe) -> bool:
        """Send one record now; False (logged) when the broker did not take it."""
        try:
            record = self.record(describe)
            with self._translating("publishing a heartbeat"):
                self.registry.beat(record, self.ttl_s)
        except Exception as exc:
            # Said once per outage: a heartbeat must not flood the log of a worker
            # that goes on handling messages from another broker or after a blip.
            level = logging.DEBUG if self._failing else logging.WARNING
            logger.log(level, "Heartbeat %s not published - %s", self.id, exc, exc_info=True)
            self._failing = True
            return False
        if self._failing:
            self._failing = False
            logger.info("Heartbeat %s published again", self.id)
        return True

    @contextlib.contextmanager
    def running(
        self,
        describe: Describe,
        on_stop: OnStop | None = None,
        on_pause: OnPause | None = None,
    ) -> Iterator[HeartbeatPublisher]:
        """Beat every period while the block runs; remove the record when it ends.

        The first beat is sent here, before the block starts: the run is listed
        before it takes its first job, and that beat (the first connection to
        the registry, for one) does not compete with the first jobs for the
        interpreter. ``on_stop``: called once, from the publisher's thread, when
        a stop is requested for this run (:func:`request_stop`); the record
        then says ``"stopping"`` with who asked. ``on_pause``: called from the
        publisher's thread with the paused priorities (:func:`pause`) once
        before the block starts (when any are paused) and whenever they change.
        """
        self._static["started"] = time.time()
        self._static.pop("quiet", None)
        self._quiet, self._quiet_priorities = None, []
        self._stop.clear()
        watching = on_pause is not None and isinstance(self.registry, SupportsRecords)
        paused = self._paused() if watching else {}
        if paused and on_pause is not None:
            on_pause(paused)
        self.beat(describe)
        self._thread = threading.Thread(
            target=self._run,
            args=(describe, on_stop, on_pause if watching else None, paused),
            name="hermes-heartbeat",
            daemon=True,
        )
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            # A beat in progress may finish after forget() and bring the record back
            # for one ttl: wait for it, but never longer than a broker call may take.
            self._thread.join(timeout=self.interval_s)
            self.forget()

    def forget(self) -> None:
        """Remove this run's record now (logged, not raised, when the broker is away)."""
        try:
            with self._translating("removing a heartbeat"):
                self.registry.forget(self.id)
        except Exception as exc:
            logger.warning(
                "Heartbeat %s not removed (it expires in %.0f s) - %s", self.id, self.ttl_s, exc
            )

    def _run(
        self,
        describe: Describe,
        on_stop: OnStop | None,
        on_pause: OnPause | None,
        paused: dict[int, dict[str, Any]] | None,
    ) -> None:
        asked = on_stop is not None and isinstance(self.registry, SupportsRecords)
        step_s = min(self.interval_s, PAUSE_POLL_S) if on_pause is not None else self.interval_s
        next_beat = time.monotonic() + self.interval_s
        while not self._stop.wait(min(step_s, max(next_beat - time.monotonic(), 0.0))):
            if on_pause is not None:
                now_paused = self._paused()
                if now_paused is not None and now_paused.keys() != (paused or {}).keys():
                    paused = now_paused
                    on_pause(now_paused)
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + self.interval_s
            if on_pause is not None and self._quiet is None:
                paused = self._quiet_if_asked(describe, on_pause, paused)
            if asked and on_stop is not None:
                by = self._stop_requested()
                if by is not None:
                    logger.info("Heartbeat %s: a stop was requested %s", self.id, by)
                    self._static["stopping"] = by
                    on_stop(f"stop requested {by}")
                    asked = False  # once: the run is stopping
            self.beat(describe)

    def _paused(self) -> dict[int, dict[str, Any]] | None:
        """The paused priorities, with this run's own when it is quiet; None when the
        registry cannot be read now (nothing changes)."""
        try:
            paused = paused_priorities(self.registry)
        except Exception as exc:  # the beat that follows says the registry is away
            logger.debug("Heartbeat %s: paused priorities not read - %s", self.id, exc)
            return None
        if self._quiet is not None:
            for priority in self._quiet_priorities:
                paused.setdefault(priority, {"by": f"for this worker, quieted {self._quiet}"})
        return paused

    def _quiet_if_asked(
        self,
        describe: Describe,
        on_pause: OnPause,
        paused: dict[int, dict[str, Any]] | None,
    ) -> dict[int, dict[str, Any]] | None:
        """Quiet this run when a request waits for it: each of its priorities paused for it
        alone, at once; the paused priorities the run now knows."""
        by = self._requested(quiet_key(self.id), "a quiet request")
        if by is None:
            return paused
        listed = describe().get("priorities")
        priorities = [p for p in listed or () if isinstance(p, int)]
        if not priorities and isinstance(self.registry, SupportsStats):
            try:
                with self._translating("listing the priorities"):
                    priorities = [row.priority for row in self.registry.queue_stats()]
            except Exception as exc:  # asked again at the next beat
                logger.debug("Heartbeat %s: priorities not listed - %s", self.id, exc)
                return paused
        if not priorities:
            logger.warning(
                "Heartbeat %s: asked to quiet %s, but it reads every priority and %r does not "
                "list them: it goes on taking jobs (stop it instead)",
                self.id,
                by,
                self.registry,
            )
            self._quiet = by  # said once: with no priorities to skip, nothing is paused
            return paused
        logger.info(
            "Heartbeat %s: quieted %s: taking no more jobs, finishing those it runs",
            self.id,
            by,
        )
        self._quiet, self._quiet_priorities = by, priorities
        self._static["quiet"] = by
        now_paused = self._paused()
        if now_paused is None:
            return paused  # the next read of the pauses applies it
        on_pause(now_paused)
        return now_paused

    def _stop_requested(self) -> str | None:
        """Who asked this run to stop, if anyone did; None also when the registry is away."""
        return self._requested(stop_key(self.id), "a stop request")

    def _requested(self, key: str, what: str) -> str | None:
        """Who left the request ``key`` for this run, if anyone did; None also when the
        registry is away."""
        assert isinstance(self.registry, SupportsRecords)
        try:
            with self._translating(f"reading {what}"):
                body = self.registry.record_get(key)
        except Exception as exc:  # the beat that follows says the registry is away
            logger.debug("Heartbeat %s: %s not read - %s", self.id, what, exc)
            return None
        if body is None:
            return None
        try:
            by = json.loads(body).get("by")
        except (ValueError, AttributeError):
            by = None
        return by if isinstance(by, str) and by else "by someone"

    def _translating(self, doing: str) -> contextlib.AbstractContextManager[None]:
        return _translating_on(self.registry, doing)

    def __repr__(self) -> str:
        return f"<HeartbeatPublisher {self.id} on {self.registry!r} every {self.interval_s:g} s>"


def worker_fields(worker: Worker) -> dict[str, Any]:
    """What changes in a worker's record: its queues, counts and the jobs in its handlers now."""
    dispatcher = worker.dispatcher
    if dispatcher is not None:
        stats = dispatcher.stats
        handled, failed, retried = stats.handled, stats.failed, stats.retried
    else:  # a bare callback: what was acknowledged is what it handled
        handled, failed, retried = worker.stats.processed, 0, 0
    return {
        "priorities": list(worker.priorities),
        "paused": sorted(worker.paused),
        "concurrency": worker.concurrency,
        "handled": handled,
        "failed": failed,
        "retried": retried,
        "rejected": worker.stats.rejected,
        "in_flight": [
            {"type": type_, "id": id_, "since": since} for type_, id_, since in worker.in_flight()
        ],
    }


def scheduler_fields(scheduler: Scheduler) -> dict[str, Any]:
    """What changes in a scheduler's record: each entry's next fire and last emitted tick."""
    now = time.time()
    entries: dict[str, Any] = {}
    for entry in scheduler.entries:
        upcoming = entry.next_fire_times(now, 1)
        entries[entry.name] = {
            "type": entry.type,
            "schedule": entry.describe(),
            "next_fire": upcoming[0] if upcoming else None,
            "last_fired": scheduler.last_fired.get(entry.name),
        }
    return {
        "entries": entries,
        "emitted": scheduler.counts["emitted"],
        "skipped": scheduler.counts["skipped"],
        "in_flight": [],
    }


def live_workers(registry: SupportsHeartbeats) -> list[dict[str, Any]]:
    """The live records on ``registry``, oldest start first (what ``hermes workers`` lists)."""
    translating = (
        translate_errors(registry, "listing heartbeats")
        if isinstance(registry, Driver)
        else contextlib.nullcontext()
    )
    with translating:
        records = registry.heartbeats()
    # A record another program wrote may hold anything: it is listed, never fatal.
    return sorted(
        (r for r in records if isinstance(r, dict)),
        key=lambda r: (_started(r), str(r.get("id"))),
    )


def _started(record: dict[str, Any]) -> float:
    """When ``record``'s process started, for ordering; 0 when it says nothing usable."""
    started = record.get("started")
    if isinstance(started, bool) or not isinstance(started, int | float):
        return 0.0
    return float(started)
