"""The dashboard's read-only JSON API: what its pages show, as data.

``GET /api/overview``, ``/api/queues``, ``/api/failed``, ``/api/jobs``,
``/api/jobs/{id}``, ``/api/workers`` and ``/api/periodic``, behind the same
host checks and authentication as the pages. Lists page as the pages do
(``after``: the ``next`` of the page before), and a payload, a reason or
an exception's message is a preview of at most ``PREVIEW_BYTES`` with its
full size, so an answer is bounded whatever the messages hold. Every time
is seconds since the epoch (UTC); a count the broker cannot give is null.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from hermes.core import FailedMessage, Message
from hermes.core.jobs import JobRecord, JobState
from hermes.dashboard._state import (
    JOBS_LIMIT,
    Dashboard,
    ListFilter,
    Waiting,
    payload_text,
    per_minute,
)

#: How much of a payload, a body, a reason or a message an answer carries.
PREVIEW_BYTES = 2048


def preview(text: str, *, tail: bool = False) -> dict[str, Any]:
    """The first (``tail``: the last) :data:`PREVIEW_BYTES` of ``text``, its whole size in
    bytes, and whether the preview was cut from it."""
    data = text.encode("utf-8", "replace")
    part = data[-PREVIEW_BYTES:] if tail else data[:PREVIEW_BYTES]
    return {
        "preview": part.decode("utf-8", "ignore"),
        "bytes": len(data),
        "cut": len(data) > PREVIEW_BYTES,
    }


def in_flight(value: Any) -> list[dict[str, Any]]:
    """A heartbeat's jobs in flight: the entries that are records, whatever else it holds."""
    return [job for job in value if isinstance(job, dict)] if isinstance(value, list) else []


def overview(dashboard: Dashboard) -> dict[str, Any]:
    """The Overview page's figures."""
    records = dashboard.workers()
    workers = None if records is None else [r for r in records if r.get("kind") != "scheduler"]
    rate, handled, failed = dashboard.failure_rate()
    return {
        "queues": _queues(dashboard),
        "workers": None if workers is None else len(workers),
        "schedulers": None if records is None else len(records) - len(workers or []),
        "running": None
        if workers is None
        else sum(len(in_flight(r.get("in_flight"))) for r in workers),
        "failure_rate": rate,
        "handled": handled,
        "failed": failed,
        "failed_kept": dashboard.failed_count(),
        "per_minute": [dataclasses.asdict(m) for m in per_minute(list(dashboard.history))],
    }


def queues(
    dashboard: Dashboard, after: str | None, shown: ListFilter | None = None
) -> dict[str, Any]:
    """Each queue's counts, each limit's use (null: no limits store), and a page of what
    waits, of a type or a priority when ``shown`` says so (null: the broker cannot list it)."""
    listed = dashboard.waiting(after, filter=shown)
    limits = dashboard.limits()
    return {
        "queues": _queues(dashboard),
        "limits": None
        if limits is None
        else [{**dataclasses.asdict(u), "waiting": u.waiting} for u in limits],
        "waiting": None if listed is None else [_waiting(w) for w in listed[0]],
        "next": None if listed is None else listed[1],
    }


def failed(dashboard: Dashboard, after: str | None, shown: ListFilter) -> dict[str, Any]:
    """A page of the failed-message store, of a type or a priority when ``shown`` says so
    (null: no store, or one that cannot list)."""
    listed = dashboard.failed_messages(after, shown)
    return {
        "messages": None if listed is None else [_failed(m) for m in listed[0]],
        "next": None if listed is None else listed[1],
    }


def jobs(
    dashboard: Dashboard,
    state: JobState | None,
    type: str | None,
    priority: int | None,
    after: str | None = None,
    oldest_first: bool = False,
) -> dict[str, Any]:
    """A page of up to ``JOBS_LIMIT`` job records past ``after``, newest first
    (``oldest_first``: oldest first), in the order they were created, and the ``next``
    page's ``after`` (null on the last); ``jobs`` null: no records store."""
    listed = dashboard.job_list(state, type, priority, after, oldest_first=oldest_first)
    return {
        "jobs": None if listed is None else [_job_summary(r) for r in listed[0]],
        "next": None if listed is None else listed[1],
        "order": "oldest" if oldest_first else "newest",
        "limit": JOBS_LIMIT,
    }


def job(record: JobRecord) -> dict[str, Any]:
    """A job's whole record, as the store keeps it."""
    return record.to_json()


def workers(dashboard: Dashboard) -> dict[str, Any]:
    """The live workers' and schedulers' heartbeats (null: no heartbeat store)."""
    return {"workers": dashboard.workers()}


def periodic(dashboard: Dashboard) -> dict[str, Any]:
    """Each periodic entry with its next fire and the last one a live scheduler reports."""
    schedule = dashboard.schedule
    if schedule is None:
        return {"entries": None}
    now = time.time()
    fired = dashboard.last_fires(dashboard.workers())
    entries = []
    for entry in schedule:
        upcoming = entry.next_fire_times(now, 1)
        entries.append(
            {
                "name": entry.name,
                "schedule": entry.describe(),
                "type": entry.type,
                "priority": entry.priority,
                "catch_up": entry.catch_up.value,
                "next_fire": upcoming[0] if upcoming else None,
                "last_fire": fired.get(entry.name),
            }
        )
    return {"entries": entries}


def _queues(dashboard: Dashboard) -> list[dict[str, Any]] | None:
    """Each queue's counts, and ``paused``: who paused it and when (null: not paused)."""
    rows = dashboard.queue_stats()
    if rows is None:
        return None
    paused = dashboard.paused()
    return [{**dataclasses.asdict(row), "paused": paused.get(row.priority)} for row in rows]


def _message(message: Message) -> dict[str, Any]:
    return {
        "id": message.id,
        "type": message.type,
        "created": message.created,
        "execute_at": message.execute_at,
        "retries": message.retries,
        "headers": dict(message.headers),
        "payload": preview(payload_text(message.payload)),
    }


def _waiting(waiting: Waiting) -> dict[str, Any]:
    return {
        "key": waiting.key,
        "priority": waiting.priority,
        "scheduled": waiting.scheduled,
        "message": None if waiting.message is None else _message(waiting.message),
        "body": preview(waiting.body) if waiting.message is None else None,
    }


def _failed(message: FailedMessage) -> dict[str, Any]:
    return {
        **_message(message),
        "priority": message.priority,
        "failed_at": message.failed_at,
        "reason": preview(message.failed_reason),
        "exceptions": [
            {
                "class": e.exception_class,
                "message": preview(e.message),
                "handler": e.handler,
                "traceback": preview(e.traceback, tail=True),  # the innermost frames
            }
            for e in message.exceptions
        ],
    }


def _job_summary(record: JobRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "type": record.type,
        "state": record.state.value,
        "priority": record.priority,
        "emitted_at": record.emitted_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "attempts": len(record.attempts),
    }
