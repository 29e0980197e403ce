"""Hermes's pages in Django's admin: the job records and the failed store of the task backend.

Read from the ``default`` task backend (a :class:`~hermes.django.HermesBackend`):
its ``OPTIONS["results_url"]`` for **Jobs** (a page at a time, newest or
oldest first, filtered by state and task; a page per job with its attempts
and each error's traceback), its
``OPTIONS["failed_url"]`` for **Failed jobs** (a page per message with its
arguments and tracebacks, and a Retry that sends it back to
``OPTIONS["url"]`` and removes it from the store). Django's permissions
guard them: ``hermes_django.view_job``, ``hermes_django.view_failedjob``,
and ``hermes_django.change_failedjob`` to retry. Nothing here writes to
Django's database.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from hermes.core import FailedMessage, FailedStore, connect, redact_url
from hermes.core.jobs import JobRecord, JobState
from hermes.django._backend import STATUS_OF, HermesBackend, set_up_priorities
from hermes.django._compat import DEFAULT_TASK_QUEUE_NAME, task_backends
from hermes.django.models import FailedJob, Job

#: Records listed on the Jobs page (newest first).
JOBS_SHOWN = 200
#: Failed messages listed on a page of Failed jobs, and the most bytes of bodies read for one.
FAILED_SHOWN = 200
FAILED_PAGE_BYTES = 8 * 1024 * 1024
#: The most characters of a result or of arguments a detail page shows.
PREVIEW_CHARS = 4000


def _backend() -> HermesBackend:
    backend = task_backends["default"]
    if not isinstance(backend, HermesBackend):
        raise Http404(
            f'TASKS["default"] is {type(backend).__qualname__}, not hermes.django.HermesBackend'
        )
    return backend


def _when(timestamp: float | None) -> str:
    """A UNIX time as the pages show it, in UTC; "" for none."""
    if timestamp is None:
        return ""
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _preview(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=repr)
    if len(text) > PREVIEW_CHARS:
        return f"{text[:PREVIEW_CHARS]}\n… ({len(text) - PREVIEW_CHARS} more characters)"
    return text


class _StorePage(admin.ModelAdmin):  # type: ignore[type-arg]
    """A model admin whose list and detail pages read a Hermes store, not the database."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _context(self, request: HttpRequest, title: str, **values: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            **values,
        }

    def _require(self, allowed: Callable[[HttpRequest], bool], request: HttpRequest) -> None:
        if not allowed(request):
            raise PermissionDenied


@admin.register(Job)
class JobAdmin(_StorePage):
    """The task backend's job records: a list and a page per job."""

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        self._require(self.has_view_permission, request)
        backend = _backend()
        state = request.GET.get("state") or None
        if state is not None and state not in {s.value for s in JobState}:
            state = None
        task = request.GET.get("task", "").strip() or None
        after = request.GET.get("after") or None
        oldest = request.GET.get("order") == "oldest"
        error = None
        records: list[JobRecord] = []
        following: str | None = None
        if backend.results_url is None:
            error = 'TASKS["default"] keeps no job records: give OPTIONS["results_url"]'
        else:
            try:
                records, following = backend.jobs().page(
                    after, oldest_first=oldest, state=state, type=task, limit=JOBS_SHOWN
                )
            except ValueError:  # an ``after`` this store did not write
                error = "That page is not one of this store's: start again from the first."
        kept = {k: v for k, v in (("state", state), ("task", task)) if v}
        ordered = {**kept, **({"order": "oldest"} if oldest else {})}
        rows = [
            {
                "record": record,
                "status": STATUS_OF[record.state].label,
                "emitted": _when(record.emitted_at),
                "finished": _when(record.finished_at),
                "worker": record.attempts[-1].worker if record.attempts else "",
            }
            for record in records
        ]
        context = self._context(
            request,
            "Jobs",
            rows=rows,
            states=[s.value for s in JobState],
            state=state or "",
            task=task or "",
            error=error,
            shown=JOBS_SHOWN,
            oldest=oldest,
            first=urlencode(ordered),
            newest_first=urlencode(kept),
            oldest_first=urlencode({**kept, "order": "oldest"}),
            after=after,
            next=None if following is None else urlencode({**ordered, "after": following}),
            store=redact_url(backend.results_url or ""),
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/hermes_django/job/change_list.html", context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        self._require(self.has_view_permission, request)
        backend = _backend()
        if backend.results_url is None:
            raise Http404('TASKS["default"] keeps no job records')
        record = backend.jobs().get(object_id)
        if record is None:
            raise Http404(f"no job record {object_id!r} (never sent, or forgotten after its ttl)")
        attempts = [
            {
                "attempt": attempt,
                "started": _when(attempt.started_at),
                "finished": _when(attempt.finished_at),
                "seconds": (
                    None
                    if attempt.finished_at is None
                    else round(attempt.finished_at - attempt.started_at, 3)
                ),
            }
            for attempt in record.attempts
        ]
        context = self._context(
            request,
            f"Job {record.id}",
            record=record,
            status=STATUS_OF[record.state].label,
            emitted=_when(record.emitted_at),
            started=_when(record.started_at),
            finished=_when(record.finished_at),
            attempts=attempts,
            result=_preview(record.result) if record.has_result else None,
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/hermes_django/job/change_form.html", context)


@admin.register(FailedJob)
class FailedJobAdmin(_StorePage):
    """The failed store: a list, a page per message, and Retry."""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        self._require(self.has_view_permission, request)
        after = request.GET.get("after") or None
        error = None
        shown: list[FailedMessage] = []
        following = None
        store = self._store()
        if store is None:
            error = 'TASKS["default"] keeps no failed tasks: give OPTIONS["failed_url"]'
        else:
            with store:
                shown, following = store.page(after, FAILED_SHOWN, FAILED_PAGE_BYTES)
        rows = [{"message": message, "failed": _when(message.failed_at)} for message in shown]
        context = self._context(
            request,
            "Failed jobs",
            rows=rows,
            after=after or "",
            following=following,
            error=error,
            store=redact_url(_backend().failed_url or ""),
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/hermes_django/failedjob/change_list.html", context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        self._require(self.has_view_permission, request)
        after = request.POST.get("after") or request.GET.get("after") or None
        store = self._store()
        if store is None:
            raise Http404('TASKS["default"] keeps no failed tasks')
        with store:
            if request.method == "POST" and "retry" in request.POST:
                self._require(self.has_change_permission, request)
                return self._retry(request, store, object_id, after)
            shown, _ = store.page(after, FAILED_SHOWN, FAILED_PAGE_BYTES)
        message = next((m for m in shown if m.id == object_id), None)
        if message is None:
            raise Http404(f"no failed job {object_id!r} on this page of the store")
        context = self._context(
            request,
            f"Failed job {message.id}",
            message=message,
            failed=_when(message.failed_at),
            created=_when(message.created),
            payload=_preview(message.payload),
            headers=sorted(message.headers.items()),
            after=after or "",
            can_retry=self.has_change_permission(request),
            retry_to=redact_url(_backend().url_of(DEFAULT_TASK_QUEUE_NAME)),
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/hermes_django/failedjob/change_form.html", context)

    def _retry(
        self, request: HttpRequest, store: FailedStore, message_id: str, after: str | None
    ) -> HttpResponse:
        backend = _backend()
        target = connect(backend.url_of(DEFAULT_TASK_QUEUE_NAME))
        try:
            # Sent back to the priority it failed on: the queues the backend sends to.
            set_up_priorities(target, backend.priorities)
            sent = store.retry(target, [message_id], page=(after, FAILED_SHOWN, FAILED_PAGE_BYTES))
        finally:
            target.close()
        if sent:
            self.message_user(
                request,
                f"Failed job {message_id} ({sent[0].type}) was sent again and removed "
                "from the failed store.",
                messages.SUCCESS,
            )
        else:
            self.message_user(
                request,
                f"Failed job {message_id} was not found: someone else retried or removed it.",
                messages.WARNING,
            )
        return HttpResponseRedirect(reverse("admin:hermes_django_failedjob_changelist"))

    def _store(self) -> FailedStore | None:
        url = _backend().failed_url
        return FailedStore.connect(url) if url is not None else None
