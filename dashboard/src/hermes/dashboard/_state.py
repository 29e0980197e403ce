"""What the dashboard reads: the broker, its browser, the failed store, heartbeats, the schedule.

Everything here is synchronous broker I/O; Starlette runs each page's
function on its thread pool, so a slow broker holds one request, not the
server. Nothing here renders HTML.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from hermes.core import FailedMessage, FailedStore, HermesError, Message, SerializeError, redact_url
from hermes.core.driver import (
    Driver,
    QueueBrowser,
    QueueStats,
    SupportsHeartbeats,
    SupportsPurge,
    SupportsRecords,
    SupportsStats,
)
from hermes.core.heartbeat import (
    live_workers,
    pause,
    paused_priorities,
    request_quiet,
    request_stop,
    resume,
)
from hermes.core.jobs import JobRecord, Jobs, JobState
from hermes.core.limits import Limiter, LimitUsage, SupportsLimits
from hermes.core.schedule import Schedule
from hermes.core.spi._door import translate_errors
from hermes.core.workflows import ROOT_PREFIX, Workflows

logger = logging.getLogger("hermes.dashboard")

#: Waiting messages listed on the Queues page at most (the broker may hold millions).
BROWSE_LIMIT = 200
#: Failed messages listed a page (and retried by "retry all on this page") at most.
FAILED_LIMIT = 500
#: The most message bodies one page of Queues or Failed reads, whatever their sizes: a
#: page of large payloads lists fewer (at least one), and a link goes on to the next.
PAGE_BYTES = 8 * 1024 * 1024
#: Store pages a filtered Failed page reads at most to fill itself.
FILTER_PAGES = 10
#: Job records listed on the Jobs page at most.
JOBS_LIMIT = 200
#: How much history the overview's chart keeps.
HISTORY_S = 3600.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at the queues and the workers, for the charts."""

    at: float
    #: priority -> ready + scheduled (None: the broker cannot say).
    waiting: dict[int, int | None]
    #: Each live worker's id -> its counts: when it started, handled, failed, retried.
    counts: dict[str, WorkerCounts] = field(default_factory=dict)

    @property
    def handled(self) -> int:
        return sum(c.handled for c in self.counts.values())

    @property
    def failed(self) -> int:
        return sum(c.failed for c in self.counts.values())


@dataclass(frozen=True, slots=True)
class WorkerCounts:
    """What one worker's heartbeat counted when a sample was taken."""

    started: float
    handled: int = 0
    failed: int = 0
    retried: int = 0


@dataclass(frozen=True, slots=True)
class Minute:
    """The jobs the live workers ended in one minute, from the samples' differences."""

    #: The minute's start (seconds since the epoch, a multiple of 60).
    at: float
    handled: int = 0
    failed: int = 0
    retried: int = 0


def per_minute(history: Iterable[Sample]) -> list[Minute]:
    """Handled, failed and retried per minute, oldest first, from one sample to the next.

    Each worker counts from what it had at the sample before: a worker that
    started since then counts from 0, one that stopped or restarted (a pool's
    replacement has another id) takes nothing away, and one first seen that
    had started earlier is not counted until its next sample.
    """
    minutes: dict[float, list[int]] = {}
    before: Sample | None = None
    for sample in history:
        if before is not None:
            bucket = minutes.setdefault(sample.at - sample.at % 60, [0, 0, 0])
            for worker, now in sample.counts.items():
                was = before.counts.get(worker)
                if was is None:
                    if now.started < before.at:
                        continue
                    was = WorkerCounts(now.started)
                bucket[0] += max(0, now.handled - was.handled)
                bucket[1] += max(0, now.failed - was.failed)
                bucket[2] += max(0, now.retried - was.retried)
        before = sample
    return [Minute(at, *counts) for at, counts in sorted(minutes.items())]


@dataclass(frozen=True, slots=True)
class Waiting:
    """A message as the Queues page lists it."""

    key: str
    message: Message | None
    body: str
    scheduled: bool
    #: The priority it waits in (a scheduled one: where it goes when due); None: not said.
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class WorkerGroup:
    """The live records of one worker pool (its children, by slot), or of one process alone."""

    host: str
    #: The pid of the pool's supervisor; None for a process that runs without one.
    supervisor_pid: int | None
    records: list[dict[str, Any]] = field(default_factory=list)


def worker_groups(records: Iterable[dict[str, Any]]) -> list[WorkerGroup]:
    """``records`` with each pool's children together, groups in the order ``records`` has them.

    A pool is its supervisor's pid on one host: the supervisor publishes no
    record, its children name it in theirs. Pids repeat across hosts, so the
    host is part of what makes two children one pool's.
    """
    groups: list[WorkerGroup] = []
    pools: dict[tuple[str, int], WorkerGroup] = {}
    for record in records:
        host = str(record.get("host", "?"))
        supervisor = record.get("supervisor_pid")
        if not isinstance(supervisor, int):
            groups.append(WorkerGroup(host, None, [record]))
            continue
        pool = pools.get((host, supervisor))
        if pool is None:
            pool = pools[host, supervisor] = WorkerGroup(host, supervisor)
            groups.append(pool)
        pool.records.append(record)
    for pool in pools.values():
        pool.records.sort(key=_slot)
    return groups


def _slot(record: dict[str, Any]) -> int:
    slot = record.get("slot")
    return slot if isinstance(slot, int) else 0


def _count_of(value: Any) -> int:
    """A heartbeat's count; 0 for a value that is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value) if math.isfinite(value) else 0


def entry_key(entry: Hashable) -> str:
    """A form-safe name for a browser entry (a Redis member, a file name), the same each listing."""
    return hashlib.sha256(repr(entry).encode()).hexdigest()[:24]


def payload_text(payload: Any) -> str:
    try:
        return json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(payload)


@dataclass(frozen=True)
class ListFilter:
    """What the Queues or the Failed page shows of what it lists: a type, a priority, one
    job's message (its id: a job's page links there), or any of them together."""

    type: str | None = None
    priority: int | None = None
    job: str | None = None

    def __bool__(self) -> bool:
        return self.type is not None or self.priority is not None or self.job is not None

    def matches(self, message: FailedMessage) -> bool:
        return self.allows(message.type, message.retry_priority, message.id)

    def allows(self, type: str | None, priority: int | None, id: str | None = None) -> bool:
        """Whether a message ``id`` of ``type`` waiting in ``priority`` (None: not known) is
        shown."""
        if self.job is not None and id != self.job:
            return False
        if self.type is not None and type != self.type:
            return False
        return self.priority is None or priority == self.priority

    def query(self) -> dict[str, str]:
        """As URL parameters (only those set)."""
        given = {"job": self.job, "type": self.type, "priority": self.priority}
        return {key: str(value) for key, value in given.items() if value is not None}

    def said(self) -> str:
        """What a page that lists nothing looked for: "of that type and priority"."""
        given = {"id": self.job, "type": self.type, "priority": self.priority}
        named = [name for name, value in given.items() if value is not None]
        return "of that " + " and ".join(named) if named else ""


@dataclass
class Dashboard:
    """The connections one ``hermes dashboard`` works on, and the history it samples."""

    driver: Driver
    url: str
    browser: QueueBrowser | None = None
    failed: FailedStore | None = None
    failed_url: str | None = None
    registry: SupportsHeartbeats | None = None
    schedule: Schedule | None = None
    #: The job records store the workers write (their ``--results-url``).
    jobs: Jobs | None = None
    results_url: str | None = None
    #: The store the workers keep their limits in (their ``--limits-url``).
    limits_store: Driver | None = None
    read_only: bool = False
    sample_interval_s: float = 10.0
    history: deque[Sample] = field(default_factory=deque)
    _stop: threading.Event = field(default_factory=threading.Event)

    # What the pages show -----------------------------------------------------

    @property
    def shown_url(self) -> str:
        return redact_url(self.url)

    @property
    def shown_failed_url(self) -> str | None:
        return redact_url(self.failed_url) if self.failed_url else None

    @property
    def shown_results_url(self) -> str | None:
        return redact_url(self.results_url) if self.results_url else None

    def queue_stats(self) -> list[QueueStats] | None:
        """One row per queue this dashboard was started with; None when the broker cannot count.

        Where the broker cannot count what is in flight (Redis at most once pops a
        message and holds nothing), the count comes from the live workers' heartbeats
        on this dashboard's URL: each job in a worker's handlers now counts on the one
        queue it reads of this dashboard's. A worker that reads several of them with a
        job in flight leaves their counts unknown, as a heartbeat does not say which.
        """
        if not isinstance(self.driver, SupportsStats):
            return None
        with translate_errors(self.driver, "counting its queues"):
            rows = self.driver.queue_stats()
        if self.registry is None or all(row.in_flight is not None for row in rows):
            return rows
        counted = self._in_flight_by_priority([row.priority for row in rows])
        return [
            replace(row, in_flight=counted.get(row.priority)) if row.in_flight is None else row
            for row in rows
        ]

    def _in_flight_by_priority(self, shown: list[int]) -> dict[int, int | None]:
        """Priority -> jobs in the handlers of the live workers on this URL (None: unknown)."""
        counts: dict[int, int | None] = dict.fromkeys(shown, 0)
        for record in self.workers() or []:
            if record.get("kind", "worker") != "worker" or record.get("url") != self.shown_url:
                continue
            jobs = record.get("in_flight")
            running = sum(isinstance(job, dict) for job in jobs) if isinstance(jobs, list) else 0
            read = record.get("priorities")
            read = [p for p in read if p in counts] if isinstance(read, list) and read else shown
            if not running:
                continue
            if len(read) == 1 and counts[read[0]] is not None:
                counts[read[0]] = (counts[read[0]] or 0) + running
            else:
                counts.update(dict.fromkeys(read))
        return counts

    def limits(self) -> list[LimitUsage] | None:
        """Each limit key the store keeps; None when there is no store that keeps limits."""
        store = self.limits_store
        if store is None or not isinstance(store, SupportsLimits):
            return None
        with translate_errors(store, "reading its limits"):
            return Limiter(store).usage()

    def priorities(self) -> list[int]:
        """The priorities this dashboard may act on: the queues it was started with."""
        rows = self.queue_stats()
        if rows is None:
            return []
        return [row.priority for row in rows]

    def can_purge(self) -> bool:
        return not self.read_only and isinstance(self.driver, SupportsPurge)

    def waiting(
        self,
        after: str | None = None,
        limit: int = BROWSE_LIMIT,
        filter: ListFilter | None = None,
    ) -> tuple[list[Waiting], str | None] | None:
        """A page of waiting messages from ``after`` (a page's next; None: the first), and
        the next page's ``after`` (None: the last); None without a browser.

        With a ``filter``, the messages it allows on the browser pages read from ``after``
        until they fill a page, :data:`FILTER_PAGES` pages were read, or their bodies
        reached :data:`PAGE_BYTES` together (what one unfiltered page reads).
        """
        if self.browser is None:
            return None
        shown: list[Waiting] = []
        following: str | None = None
        for listed, page_next in self._waiting_pages(after, limit, filter):
            shown += [waiting for _, waiting in listed]
            following = page_next
        return shown, following

    def _waiting_pages(
        self, after: str | None, limit: int, filter: ListFilter | None
    ) -> Iterator[tuple[list[tuple[Hashable, Waiting]], str | None]]:
        """``([(entry, as listed)], its next)`` for each browser page a Queues page reads:
        one without a filter, more with one."""
        assert self.browser is not None
        now = time.time()
        shown = read = 0
        for _ in range(FILTER_PAGES if filter else 1):
            # No more than the page has room for, and one budget of bodies for all the
            # pages read: a filtered page lists no more, and reads no more, than another.
            page = self.browser.page(after, limit - shown, PAGE_BYTES - read)
            listed = []
            for entry, body in page.entries:
                read += len(body)
                waiting = self._waiting(entry, body, page.priorities.get(entry), now)
                message = waiting.message
                kind, id = (None, None) if message is None else (message.type, message.id)
                if filter is None or filter.allows(kind, waiting.priority, id):
                    listed.append((entry, waiting))
            shown += len(listed)
            yield listed, page.next
            if page.next is None or shown >= limit or read >= PAGE_BYTES:
                return
            after = page.next

    def _waiting(
        self, entry: Hashable, body: bytes | str, priority: int | None, now: float
    ) -> Waiting:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            message: Message | None = self._decode(body)
        except SerializeError:
            message = None
        due = message.execute_at if message is not None else None
        scheduled = bool(due and due > now)
        return Waiting(entry_key(entry), message, text, scheduled, priority)

    def delete_waiting(
        self, key: str, after: str | None = None, filter: ListFilter | None = None
    ) -> bool:
        """Delete the waiting message listed as ``key`` on the page from ``after`` (as
        ``filter`` chose it); False when it is no longer there."""
        if self.browser is None:
            return False
        for listed, _ in self._waiting_pages(after, BROWSE_LIMIT, filter):
            for entry, waiting in listed:
                if waiting.key == key:
                    return self.browser.remove(entry)
        return False

    def purge(self, priority: int) -> int:
        if priority not in self.priorities():
            raise KeyError(priority)
        assert isinstance(self.driver, SupportsPurge)
        with translate_errors(self.driver, f"purging priority {priority}"):
            return self.driver.purge(priority)

    def failed_messages(
        self, after: str | None = None, filter: ListFilter | None = None
    ) -> tuple[list[FailedMessage], str | None] | None:
        """A page of the failed store (its order; by failure time within the page), and the
        next page's ``after``; None without a store that can list.

        With a ``filter``, the messages it matches on the store pages read from ``after``
        until they fill a page, :data:`FILTER_PAGES` pages were read, or their payloads
        reached :data:`PAGE_BYTES` together (about what one unfiltered page reads).
        """
        if self.failed is None or self.failed.browser is None:
            return None
        messages: list[FailedMessage] = []
        following: str | None = None
        for _, listed, page_next in self._failed_pages(after, filter):
            messages += listed
            following = page_next
        messages.sort(key=lambda message: message.failed_at)
        return messages, following

    def _failed_pages(
        self, after: str | None, filter: ListFilter | None
    ) -> Iterator[tuple[tuple[str | None, int, int], list[FailedMessage], str | None]]:
        """``((after, limit, max_bytes) of a store page, the messages shown from it, its
        next)`` for each store page a Failed page reads: one without a filter, more with
        one, within (about) one page's bytes together."""
        assert self.failed is not None
        shown = read = 0
        for _ in range(FILTER_PAGES if filter else 1):
            page = (after, FAILED_LIMIT, PAGE_BYTES - read)
            listed, following = self.failed.page(*page)
            # About what the store read: the payloads dominate a large message's body.
            read += sum(len(payload_text(m.payload)) for m in listed)
            matched = [m for m in listed if filter is None or filter.matches(m)]
            shown += len(matched)
            yield page, matched, following
            if following is None or shown >= FAILED_LIMIT or read >= PAGE_BYTES:
                return
            after = following

    def retry(
        self, ids: Iterable[str], after: str | None = None, filter: ListFilter | None = None
    ) -> int:
        """Retry the failed messages ``ids`` listed on the page from ``after`` (as ``filter``
        chose it), each to the priority it failed on: a :class:`HermesError` names one this
        dashboard does not know (it acts only on the queues it was started with)."""
        assert self.failed is not None
        known, wanted = set(self.priorities()), set(ids)
        pages = list(self._failed_pages(after, filter))
        for _, listed, _ in pages:
            for message in listed:
                if message.id in wanted and known and message.retry_priority not in known:
                    raise HermesError(
                        f"failed message #{message.id} ran on priority "
                        f"{message.retry_priority}, which this dashboard does not show: start "
                        f"it with --priority {message.retry_priority} to send it back there; "
                        "nothing was retried"
                    )
        sent = 0
        for page, listed, _ in pages:
            here = wanted & {m.id for m in listed}
            if here:
                sent += len(self.failed.retry(self.driver, here, page=page))
        return sent

    def delete_failed(
        self, ids: Iterable[str], after: str | None = None, filter: ListFilter | None = None
    ) -> int:
        assert self.failed is not None
        wanted = set(ids)
        deleted = 0
        for page, listed, _ in list(self._failed_pages(after, filter)):
            here = wanted & {m.id for m in listed}
            if here:
                deleted += self.failed.purge(here, page=page)
        return deleted

    def job(self, job_id: str) -> JobRecord | None:
        """The record of ``job_id``; None when the store has none (or there is no store)."""
        if self.jobs is None:
            return None
        return self.jobs.get(job_id)

    def workflow(self, node_id: str) -> dict[str, Any] | None:
        """The tree of the workflow node ``node_id`` (a chain or a group); None if it is none."""
        if self.jobs is None or not node_id.startswith(ROOT_PREFIX):
            return None
        flows = Workflows(self.jobs.driver, self.jobs)
        return flows.tree(node_id) if flows.is_node(node_id) else None

    def job_list(
        self,
        state: JobState | None,
        type: str | None,
        priority: int | None = None,
        after: str | None = None,
        *,
        oldest_first: bool = False,
        limit: int = JOBS_LIMIT,
    ) -> tuple[list[JobRecord], str | None] | None:
        """A page of up to ``limit`` records past ``after`` (None: the first), newest
        first unless ``oldest_first``, of ``state``, ``type`` and ``priority`` when given,
        within :data:`PAGE_BYTES`; and the ``after`` of the next page (None on the last).
        None without a records store. A filter reads at most ten times ``limit``
        records a page (see :meth:`Jobs.page`)."""
        if self.jobs is None:
            return None
        return self.jobs.page(
            after,
            oldest_first=oldest_first,
            state=state,
            type=type,
            priority=priority,
            limit=limit,
            max_bytes=PAGE_BYTES,
        )

    def cancel(self, job_id: str) -> JobRecord:
        """Cancel ``job_id`` (:meth:`Jobs.cancel`): :class:`UnknownJobError` without a record."""
        if self.jobs is None:
            raise KeyError(job_id)
        return self.jobs.cancel(job_id)

    def can_stop_workers(self) -> bool:
        """Whether a worker can be asked to stop here: a registry that keeps records."""
        return not self.read_only and isinstance(self.registry, SupportsRecords)

    def stop_worker(self, worker_id: str) -> dict[str, Any]:
        """Ask the live worker ``worker_id`` to stop; its record. KeyError: none is live."""
        assert self.registry is not None
        record = self._live_worker(worker_id)
        request_stop(self.registry, worker_id, "from the dashboard")
        return record

    def quiet_worker(self, worker_id: str) -> dict[str, Any]:
        """Ask the live worker ``worker_id`` to take no more jobs (it stays alive, quiet,
        until stopped); its record. KeyError: none is live."""
        assert self.registry is not None
        record = self._live_worker(worker_id)
        request_quiet(self.registry, worker_id, "from the dashboard")
        return record

    def _live_worker(self, worker_id: str) -> dict[str, Any]:
        for record in self.workers() or []:
            if record.get("id") == worker_id and record.get("kind") == "worker":
                return record
        raise KeyError(worker_id)

    def can_pause(self) -> bool:
        """Whether a priority can be paused here: a registry that keeps records."""
        return not self.read_only and isinstance(self.registry, SupportsRecords)

    def paused(self) -> dict[int, dict[str, Any]]:
        """The priorities paused on the registry: priority -> who paused it and when."""
        if self.registry is None:
            return {}
        return paused_priorities(self.registry)

    def pause(self, priority: int, paused: bool) -> bool:
        """Pause ``priority`` fleet-wide (or resume it); False when it already was (was not)."""
        assert self.registry is not None
        if paused:
            return pause(self.registry, priority, "from the dashboard")
        return resume(self.registry, priority, "from the dashboard")

    def workers(self) -> list[dict[str, Any]] | None:
        if self.registry is None:
            return None
        return live_workers(self.registry)

    def last_fires(self, workers: list[dict[str, Any]] | None) -> dict[str, float]:
        """Entry name -> the newest tick any live scheduler says it emitted."""
        fired: dict[str, float] = {}
        for record in workers or []:
            entries = record.get("entries")
            for name, entry in entries.items() if isinstance(entries, dict) else ():
                at = entry.get("last_fired") if isinstance(entry, dict) else None
                if isinstance(at, int | float) and at > fired.get(name, 0):
                    fired[name] = float(at)
        return fired

    # The chart's history ----------------------------------------------------

    def sample(self) -> None:
        """Add one :class:`Sample` to the history; broker errors are logged, not raised."""
        try:
            rows = self.queue_stats() or []
            workers = self.workers() or []
        except HermesError as exc:
            logger.warning("Dashboard: could not sample the queues - %s", exc)
            return
        waiting: dict[int, int | None] = {}
        for row in rows:
            parts = (row.ready, row.scheduled)
            unknown = all(p is None for p in parts)
            waiting[row.priority] = None if unknown else sum(p or 0 for p in parts)
        counts = {
            str(r.get("id")): WorkerCounts(
                float(_count_of(r.get("started"))),
                _count_of(r.get("handled")),
                _count_of(r.get("failed")),
                _count_of(r.get("retried")),
            )
            for r in workers
            if r.get("kind") != "scheduler"
        }
        self.history.append(Sample(time.time(), waiting, counts))
        while self.history and self.history[0].at < time.time() - HISTORY_S:
            self.history.popleft()

    def start_sampling(self) -> None:
        thread = threading.Thread(
            target=self._sample_loop, name="hermes-dashboard-sampler", daemon=True
        )
        thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _sample_loop(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:
                # A bug or a record nobody foresaw: the chart misses one sample, not the rest.
                logger.exception("Dashboard: sampling the queues failed")
            if self._stop.wait(self.sample_interval_s):
                return

    def failed_count(self) -> int | None:
        """How many messages the failed store holds, where its broker can count them cheaply."""
        if self.failed is None or not isinstance(self.failed.driver, SupportsStats):
            return None
        with translate_errors(self.failed.driver, "counting the failed-message store"):
            rows = self.failed.driver.queue_stats()
        counts = [row.ready for row in rows]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    def failure_rate(self) -> tuple[float | None, int, int]:
        """Failures per handled-or-failed over the history: the per-minute counts' sums."""
        minutes = per_minute(list(self.history))
        handled = sum(m.handled for m in minutes)
        failed = sum(m.failed for m in minutes)
        total = handled + failed
        return (failed / total if total else None), handled, failed

    def _decode(self, body: bytes | str) -> Message:
        from hermes.core.drivertools import MessageSerializer

        return MessageSerializer().unserialize(body)

    def close(self) -> None:
        self.stop()
        self.driver.close()
        if self.failed is not None:
            self.failed.close()
        if self.jobs is not None:
            self.jobs.close()
        registry = self.registry
        if isinstance(registry, Driver) and registry is not self.driver:
            registry.close()
        if self.limits_store is not None and self.limits_store is not self.driver:
            self.limits_store.close()
