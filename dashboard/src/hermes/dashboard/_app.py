"""The web application: one Starlette route per page or action, Jinja2 templates, no JavaScript.

Safe by default, in this order of the request: the ``Host`` header must name
this dashboard, then authentication (when configured), then a POST must come
from the dashboard's own pages (all three in :mod:`hermes.dashboard._guard`);
a POST's body is read up to :data:`MAX_BODY_BYTES`, and it is refused with
403 unless it carries this process's CSRF token (and always with
``--read-only``); pages are rendered with autoescape on, so a payload of
``<script>`` is text; the Content-Security-Policy allows no script at all
and no framing, so even a value that slipped through could not run. Pages
show URLs redacted, payloads as a bounded preview, and a record's value
they cannot read (a time in milliseconds, say) marked invalid.
"""

from __future__ import annotations

import datetime as dt
import functools
import hmac
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from hermes.core import HermesError
from hermes.core._cli._workers import duration
from hermes.core.jobs import JobState, UnknownJobError
from hermes.core.workflows import parent_of, root_of
from hermes.dashboard import _api as api
from hermes.dashboard._chart import activity_chart, chart
from hermes.dashboard._guard import SECURITY_HEADERS, Auth, Guard, Hosts, Throttle
from hermes.dashboard._state import (
    BROWSE_LIMIT,
    FAILED_LIMIT,
    JOBS_LIMIT,
    Dashboard,
    ListFilter,
    payload_text,
    worker_groups,
)

__all__ = ["MAX_BODY_BYTES", "PREVIEW_BYTES", "SECURITY_HEADERS", "Auth", "Hosts", "create_app"]

#: The largest POST body read; a larger one is refused with 413 before it is read whole.
#: "Retry all on this page" sends the most: FAILED_LIMIT ids, some 25 KB.
MAX_BODY_BYTES = 64 * 1024
#: How much of a payload (or a body, or a reason) a listing shows.
PREVIEW_BYTES = 2048
#: How much of a failed message's traceback the Failed page shows: its innermost end.
TRACEBACK_PREVIEW_BYTES = 4096
#: How much of a type, a queue name or a URL a list shows before "…" (the whole on hover).
CLIP_CHARS = 80
#: The latest time taken for one: a larger number is not seconds since the epoch
#: (milliseconds, most likely) and is shown as invalid.
_LATEST_TIME = dt.datetime(3000, 1, 1, tzinfo=dt.UTC).timestamp()

#: The job states, as an unknown one's error lists them.
_STATES = ", ".join(state.value for state in JobState)
#: What a redirect after an action says, by code: the text never comes from the URL.
DONE = {
    "deleted": "Deleted {n} waiting message(s).",
    "gone": "That message was no longer waiting: a worker took it, or it was deleted.",
    "purged": "Purged {n} message(s) from {queue}.",
    "retried": "Sent {n} failed message(s) back to the queue.",
    "dropped": "Deleted {n} failed message(s).",
    "cancelled": "Cancel sent. The state below says what it did.",
    "stopping": "Stop requested: the worker stops within a heartbeat, after the jobs it runs.",
    "quieting": "Quiet requested: within a heartbeat the worker takes no more jobs; it finishes "
    "those it runs and stays alive until it is stopped.",
    "paused": "Paused priority {queue}: each worker finishes what it runs and takes no more "
    "of it, within a few seconds, until it is resumed.",
    "resumed": "Resumed priority {queue}: the workers take it again.",
}


def _instant(value: Any) -> float | None:
    """``value`` as seconds since the epoch; None when it cannot be one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or not 0 <= value < _LATEST_TIME:
        return None
    return float(value)


def _invalid(value: Any) -> Markup:
    shown = str(value)
    shown = shown if len(shown) <= 40 else shown[:40] + "…"
    return Markup(
        '<span class="invalid" title="not a time in seconds since the epoch">{} (invalid)</span>'
    ).format(shown)


def _when(value: Any) -> str:
    """A time in UTC, with the zone named: every page and every viewer read the same.

    In a ``<time>`` element whose date and time the stylesheet keeps whole: a narrow
    column breaks it between the two, never inside the date.
    """
    if value is None:
        return "unknown"
    at = _instant(value)
    if at is None:
        return _invalid(value)
    moment = dt.datetime.fromtimestamp(at, dt.UTC)
    return Markup('<time datetime="{}"><span>{}</span> <span>{}</span></time>').format(
        moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
        moment.strftime("%Y-%m-%d"),
        moment.strftime("%H:%M:%S UTC"),
    )


def _local(value: Any, zone: dt.tzinfo) -> str:
    """A time in an entry's own timezone, "02:30 Europe/Bratislava" (the date when it
    differs from the UTC one); "" when ``value`` is not a time."""
    at = _instant(value)
    if at is None:
        return ""
    local = dt.datetime.fromtimestamp(at, zone)
    same_day = local.date() == dt.datetime.fromtimestamp(at, dt.UTC).date()
    shown = local.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S")
    return f"{shown} {zone}"


def _clip(value: Any, chars: int = CLIP_CHARS) -> str:
    """``value`` cut to its first ``chars`` characters in a list, the whole on hover.

    A type, a queue or a URL of hundreds of characters would otherwise make
    a table row as tall as the screen; the job page shows it whole.
    """
    text = str(value)
    if len(text) <= chars:
        return text
    return Markup('<span class="clipped" title="{}">{}…</span>').format(text, text[:chars])


def _ago(value: Any) -> str:
    if value is None:
        return "unknown"
    at = _instant(value)
    if at is None:
        return _invalid(value)
    return duration(time.time() - at)


def _preview(value: Any) -> str:
    """The first :data:`PREVIEW_BYTES` of ``value`` as text, and how much more there is."""
    text = str(value)
    data = text.encode("utf-8", "replace")
    if len(data) <= PREVIEW_BYTES:
        return text
    head = data[:PREVIEW_BYTES].decode("utf-8", "ignore")
    return f"{head}\n… {len(data) - len(head.encode()):,} bytes more"


def _traceback_tail(value: Any, whole: str = "hermes failed show ID") -> str:
    """The last :data:`TRACEBACK_PREVIEW_BYTES` of a traceback, and how much comes before
    (``whole``: the command that prints it all)."""
    text = str(value)
    data = text.encode("utf-8", "replace")
    if len(data) <= TRACEBACK_PREVIEW_BYTES:
        return text
    tail = data[-TRACEBACK_PREVIEW_BYTES:].decode("utf-8", "ignore")
    newline = tail.find("\n", 0, 400)  # start at a whole line
    tail = tail[newline + 1 :]
    before = len(data) - len(tail.encode())
    return f"… {before:,} bytes of outer frames before (`{whole}` prints them)\n{tail}"


def _payload(payload: Any) -> str:
    return _preview(payload_text(payload))


def _took(started: Any, finished: Any) -> str:
    """How long an attempt ran: ``finished - started``, or "" when either is unknown."""
    start, end = _instant(started), _instant(finished)
    if start is None or end is None or end < start:
        return ""
    seconds = end - start
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else duration(seconds)


def _job_path(job_id: str) -> str:
    return "/jobs/" + quote(job_id, safe="")


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("hermes.dashboard", "templates"),
        # On for every template, whatever its name: everything shown comes from a broker.
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        query=lambda after, extra=None: urlencode({**(extra or {}), "after": after}),
        when=_when,
        clip=_clip,
        local=_local,
        ago=_ago,
        count=_count,
        duration=duration,
        payload=_payload,
        preview=_preview,
        traceback_tail=_traceback_tail,
        jobs=api.in_flight,
        took=_took,
        job_path=_job_path,
    )
    return env


def create_app(
    dashboard: Dashboard, *, hosts: Hosts | None = None, auth: Auth | None = None
) -> Starlette:
    """The ASGI application serving ``dashboard``'s pages.

    ``hosts``: the ``Host`` header values it answers (default: the loopback
    names on any port; see :meth:`Hosts.bound`). ``auth``: the credentials
    every request must carry, when given.
    """
    env = _environment()
    csrf_token = secrets.token_urlsafe(32)
    style = resources.files("hermes.dashboard").joinpath("static/style.css").read_bytes()

    def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        done = request.query_params.get("done")
        notice = None
        if done in DONE:
            notice = DONE[done].format(
                n=request.query_params.get("n", "0"), queue=request.query_params.get("queue", "")
            )
        context.setdefault("filters", {})  # what a page's links keep (the Failed page's filter)
        html = env.get_template(name).render(
            d=dashboard,
            csrf=csrf_token,
            page=name.removesuffix(".html"),
            notice=notice,
            now=time.time(),
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def page(
        name: str, build: Callable[[Request], dict[str, Any]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                context = await run_in_threadpool(build, request)
            except HermesError as exc:
                return render(request, "error.html", status=503, error=str(exc))
            return render(request, name, status=context.pop("status", 200), **context)

        return endpoint

    def action(
        do: Callable[[dict[str, list[str]]], str],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if dashboard.read_only:
                return PlainTextResponse("This dashboard is read-only\n", status_code=403)
            body = await _bounded_body(request)
            if body is None:
                return PlainTextResponse("Request body too large\n", status_code=413)
            form = parse_qs(body.decode("utf-8", "replace"))
            sent = (form.get("csrf") or [""])[0]
            if not hmac.compare_digest(sent.encode(), csrf_token.encode()):
                return PlainTextResponse("Missing or wrong CSRF token\n", status_code=403)
            try:
                where = await run_in_threadpool(do, form)
            except KeyError:
                return PlainTextResponse(
                    "Not a queue or a job store of this dashboard\n", status_code=404
                )
            except HermesError as exc:
                return render(request, "error.html", status=503, error=str(exc))
            # Post/redirect/get: a reload does not repeat the action.
            return RedirectResponse(where, status_code=303)

        return endpoint

    # Pages ------------------------------------------------------------------

    def overview(request: Request) -> dict[str, Any]:
        figures = api.overview(dashboard)  # the same figures as /api/overview
        return {
            "rows": dashboard.queue_stats(),
            "paused": dashboard.paused(),
            "workers": figures["workers"],
            "schedulers": figures["schedulers"],
            "running": figures["running"],
            "kept": figures["failed_kept"],
            "chart": chart(list(dashboard.history)),
            "activity": activity_chart(list(dashboard.history)),
            "rate": figures["failure_rate"],
            "handled": figures["handled"],
            "failed": figures["failed"],
        }

    def queues(request: Request) -> dict[str, Any]:
        after = request.query_params.get("after") or None
        shown = _list_filter(request.query_params)
        listed = dashboard.waiting(after, filter=shown)
        return {
            "filters": shown.query(),
            "shown": shown,
            "rows": dashboard.queue_stats(),
            "paused": dashboard.paused(),
            "limits": dashboard.limits(),
            "waiting": None if listed is None else listed[0],
            "after": after,
            "next": None if listed is None else listed[1],
            "limit": BROWSE_LIMIT,
        }

    def purge_form(request: Request) -> dict[str, Any]:
        priority = _priority(request.query_params.get("priority"))
        rows = [r for r in dashboard.queue_stats() or [] if r.priority == priority]
        return {"row": rows[0] if rows else None}

    def _page_url(path: str, after: str | None, shown: ListFilter | None = None) -> str:
        query = {**(shown.query() if shown else {}), **({"after": after} if after else {})}
        return path + ("?" + urlencode(query) if query else "")

    def confirm_failed(request: Request, *, delete: bool) -> dict[str, Any]:
        """The failed messages a Delete or a Retry all would act on, named before it does:
        ``id`` (repeated) for those, or ``all=1`` for every one on the page from ``after``."""
        after = request.query_params.get("after") or None
        wanted = set(request.query_params.getlist("id"))
        every = request.query_params.get("all") == "1"
        shown = _list_filter(request.query_params)
        listed = dashboard.failed_messages(after, shown)
        chosen = [m for m in (listed or ([], None))[0] if every or m.id in wanted]
        n = len(chosen)
        what = f"{n} failed message{'s' if n != 1 else ''}"
        return {
            "title": f"Delete {what}?" if delete else f"Retry {what}?",
            "question": (
                f"This deletes the {what} below from the failed store "
                f"{dashboard.shown_failed_url}. It cannot be undone."
                if delete
                else f"This sends the {what} below back to {dashboard.shown_url}, each to the "
                "priority it failed on, with its retries reset, and removes them from the store."
            ),
            "items": [
                {
                    "type": m.type,
                    "id": m.id,
                    "where": "?" if m.retry_priority is None else m.retry_priority,
                }
                for m in chosen
            ],
            "where_label": "priority",
            "gone": "None of those failed messages is on that page any more: retried, deleted, "
            "or the page moved on.",
            "action": "/failed/delete" if delete else "/failed/retry",
            "after": after,
            "fields": [*shown.query().items(), *(("id", m.id) for m in chosen)],
            "button": f"Delete {what}" if delete else f"Retry {what}",
            "button_class": "danger" if delete else "",
            "back": _page_url("/failed", after, shown),
        }

    def confirm_waiting(request: Request) -> dict[str, Any]:
        """The waiting message a Delete on the Queues page would remove, named before it does."""
        after = request.query_params.get("after") or None
        key = request.query_params.get("key") or ""
        shown = _list_filter(request.query_params)
        listed = dashboard.waiting(after, filter=shown)
        chosen = [w for w in (listed or ([], None))[0] if w.key == key]
        return {
            "title": "Delete a waiting message?",
            "question": f"This deletes the message below from {dashboard.shown_url} before any "
            "worker takes it. It cannot be undone.",
            "items": [
                {
                    "type": "not a Hermes message" if w.message is None else w.message.type,
                    "id": "" if w.message is None else w.message.id,
                    "where": "scheduled" if w.scheduled else "ready",
                }
                for w in chosen
            ],
            "where_label": "state",
            "gone": "That message is no longer waiting on that page: a worker took it, or it "
            "was deleted.",
            "action": "/queues/delete",
            "after": after,
            "fields": [*shown.query().items(), *(("key", w.key) for w in chosen)],
            "button": "Delete this message",
            "button_class": "danger",
            "back": _page_url("/queues", after, shown),
        }

    def confirm_worker(request: Request, *, quiet: bool) -> dict[str, Any]:
        """The worker a Stop (or a Quiet) on the Workers page would act on, named before."""
        worker_id = request.query_params.get("id") or ""
        found = [
            r
            for r in dashboard.workers() or []
            if r.get("id") == worker_id and r.get("kind") == "worker"
        ]
        pooled = any(r.get("supervisor_pid") is not None for r in found)
        if quiet:
            title = "Quiet a worker?"
            question = (
                "This asks the worker below to take no more jobs: within a heartbeat it stops "
                "taking from each of its priorities, lets the ones it runs finish (however "
                "long they take) and stays alive, quiet, until it is stopped. Other workers "
                "take what it leaves. There is no undoing it short of a restart."
            )
        else:
            title = "Restart a pool's worker?" if pooled else "Stop a worker?"
            question = (
                "This asks the worker below to stop: it takes no more jobs, lets the ones it "
                "runs finish (within its grace period) and exits. "
                + (
                    "Its pool's supervisor then starts another in its place."
                    if pooled
                    else "Nothing starts it again here: whatever runs it (systemd, Kubernetes) "
                    "decides."
                )
            )
        return {
            "title": title,
            "question": question,
            "items": [
                {
                    "type": f"{r.get('host', '?')} pid {r.get('pid', '?')}",
                    "id": r.get("id", "?"),
                    "where": f"{len(api.in_flight(r.get('in_flight')))} job(s) running",
                }
                for r in found
            ],
            "where_label": "now",
            "gone": "That worker is not live any more.",
            "action": "/workers/quiet" if quiet else "/workers/stop",
            "after": None,
            "fields": [("id", worker_id)] if found else [],
            "button": "Quiet it" if quiet else ("Restart it" if pooled else "Stop it"),
            "button_class": "danger",
            "back": "/workers",
        }

    def failed(request: Request) -> dict[str, Any]:
        after = request.query_params.get("after") or None
        shown = _list_filter(request.query_params)
        listed = dashboard.failed_messages(after, shown)
        return {
            "messages": None if listed is None else listed[0],
            "after": after,
            "next": None if listed is None else listed[1],
            "limit": FAILED_LIMIT,
            "filters": shown.query(),
            "shown": shown,
        }

    def job_list(request: Request) -> dict[str, Any]:
        state_name = request.query_params.get("state") or ""
        state = JobState(state_name) if state_name in JobState._value2member_map_ else None
        type_ = (request.query_params.get("type") or "").strip() or None
        priority = _priority(request.query_params.get("priority"))
        after = request.query_params.get("after") or None
        oldest = request.query_params.get("order") == "oldest"
        filters = {
            **({"state": state.value} if state else {}),
            **({"type": type_} if type_ else {}),
            **({"priority": str(priority)} if priority is not None else {}),
        }
        refused = None
        try:
            listed = dashboard.job_list(state, type_, priority, after, oldest_first=oldest)
        except ValueError as exc:  # an ``after`` this store did not write
            listed, refused = ([], None), str(exc)
        return {
            "records": None if listed is None else listed[0],
            "after": after,
            "next": None if listed is None else listed[1],
            "oldest": oldest,
            "filters": {**filters, **({"order": "oldest"} if oldest else {})},
            "unordered": filters,
            "refused": refused,
            "status": 400 if refused else 200,
            "states": list(JobState),
            "state": state,
            "type": type_ or "",
            "priority": "" if priority is None else priority,
            "limit": JOBS_LIMIT,
        }

    listing = page("jobs.html", job_list)

    async def jobs(request: Request) -> Response:
        wanted = (request.query_params.get("id") or "").strip()
        if wanted:  # the search box: straight to the job's page
            return RedirectResponse(_job_path(wanted), status_code=303)
        return await listing(request)

    def job(request: Request) -> dict[str, Any]:
        job_id = request.path_params["job_id"]
        tree = dashboard.workflow(job_id)
        record = dashboard.job(job_id) if tree is None else None
        known = record is not None or tree is not None or dashboard.jobs is None
        parent = parent_of(job_id) if record is not None else None
        return {
            "job_id": job_id,
            "record": record,
            "tree": tree,
            "workflow": root_of(job_id) if parent is not None else None,
            "status": 200 if known else 404,
        }

    def workers(request: Request) -> dict[str, Any]:
        records = dashboard.workers()
        groups = None if records is None else worker_groups(records)
        return {"workers": records, "groups": groups}

    def periodic(request: Request) -> dict[str, Any]:
        records = dashboard.workers()
        schedule = dashboard.schedule
        now = time.time()
        entries = []
        fired = dashboard.last_fires(records)
        for entry in schedule or ():
            upcoming = entry.next_fire_times(now, 1)
            entries.append(
                {
                    "entry": entry,
                    "next": upcoming[0] if upcoming else None,
                    "last": fired.get(entry.name),
                }
            )
        schedulers = [r for r in records or [] if r.get("kind") == "scheduler"]
        return {"entries": entries, "schedule": schedule, "schedulers": schedulers}

    # Actions ------------------------------------------------------------------

    def delete_waiting(form: dict[str, list[str]]) -> str:
        key = (form.get("key") or [""])[0]
        shown = _list_filter({k: v[0] for k, v in form.items() if v})
        done = dashboard.delete_waiting(key, _after(form), shown)
        said = {"done": "deleted", "n": 1} if done else {"done": "gone"}
        return "/queues?" + urlencode({**shown.query(), **said})

    def purge(form: dict[str, list[str]]) -> str:
        priority = _priority((form.get("priority") or [""])[0])
        if priority is None or not dashboard.can_purge():
            raise KeyError(priority)
        rows = {r.priority: r.name for r in dashboard.queue_stats() or []}
        removed = dashboard.purge(priority)
        return "/queues?" + urlencode(
            {"done": "purged", "n": removed, "queue": rows.get(priority, priority)}
        )

    def retry(form: dict[str, list[str]]) -> str:
        shown = _list_filter({k: v[0] for k, v in form.items() if v})
        n = dashboard.retry(form.get("id") or [], _after(form), shown)
        return "/failed?" + urlencode({**shown.query(), "done": "retried", "n": n})

    def delete_failed(form: dict[str, list[str]]) -> str:
        shown = _list_filter({k: v[0] for k, v in form.items() if v})
        n = dashboard.delete_failed(form.get("id") or [], _after(form), shown)
        return "/failed?" + urlencode({**shown.query(), "done": "dropped", "n": n})

    def stop_worker(form: dict[str, list[str]]) -> str:
        if not dashboard.can_stop_workers():
            raise KeyError("workers")
        dashboard.stop_worker((form.get("id") or [""])[0])
        return "/workers?" + urlencode({"done": "stopping"})

    def quiet_worker(form: dict[str, list[str]]) -> str:
        if not dashboard.can_stop_workers():
            raise KeyError("workers")
        dashboard.quiet_worker((form.get("id") or [""])[0])
        return "/workers?" + urlencode({"done": "quieting"})

    def pause_queue(form: dict[str, list[str]]) -> str:
        priority = _priority((form.get("priority") or [""])[0])
        known = {r.priority for r in dashboard.queue_stats() or []}
        if priority is None or priority not in known or not dashboard.can_pause():
            raise KeyError(priority)
        paused = (form.get("pause") or [""])[0] == "1"
        dashboard.pause(priority, paused)
        done = "paused" if paused else "resumed"
        return "/queues?" + urlencode({"done": done, "queue": priority})

    def cancel(form: dict[str, list[str]]) -> str:
        job_id = (form.get("id") or [""])[0]
        try:
            dashboard.cancel(job_id)
        except UnknownJobError:
            return _job_path(job_id)  # its page says there is no record
        return _job_path(job_id) + "?" + urlencode({"done": "cancelled"})

    # The JSON API ------------------------------------------------------------

    def answer(
        build: Callable[[Request], dict[str, Any] | None],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                data = await run_in_threadpool(build, request)
            except HermesError as exc:
                return JSONResponse({"error": str(exc)}, status_code=503)
            except ValueError as exc:  # a query parameter this API does not know
                return JSONResponse({"error": str(exc)}, status_code=400)
            if data is None:
                return JSONResponse({"error": "not found"}, status_code=404)
            return JSONResponse(data)

        return endpoint

    def api_jobs(request: Request) -> dict[str, Any]:
        state_name = request.query_params.get("state") or ""
        state = JobState(state_name) if state_name in JobState._value2member_map_ else None
        if state_name and state is None:
            raise ValueError(f"no job state {state_name!r}: one of {_STATES}")
        type_ = (request.query_params.get("type") or "").strip() or None
        order = request.query_params.get("order") or "newest"
        if order not in ("newest", "oldest"):
            raise ValueError(f"no order {order!r}: newest or oldest")
        return api.jobs(
            dashboard,
            state,
            type_,
            _priority(request.query_params.get("priority")),
            after_of(request),
            oldest_first=order == "oldest",
        )

    def api_job(request: Request) -> dict[str, Any] | None:
        record = dashboard.job(request.path_params["job_id"])
        return None if record is None else api.job(record)

    def after_of(request: Request) -> str | None:
        return request.query_params.get("after") or None

    async def stylesheet(request: Request) -> Response:
        return Response(style, media_type="text/css")

    routes = [
        Route("/", page("overview.html", overview)),
        Route("/queues", page("queues.html", queues)),
        Route("/queues/purge", page("purge.html", purge_form), methods=["GET"]),
        Route("/queues/purge", action(purge), methods=["POST"]),
        Route("/queues/delete", page("confirm.html", confirm_waiting), methods=["GET"]),
        Route("/queues/delete", action(delete_waiting), methods=["POST"]),
        Route("/queues/pause", action(pause_queue), methods=["POST"]),
        Route("/failed", page("failed.html", failed)),
        Route(
            "/failed/retry",
            page("confirm.html", functools.partial(confirm_failed, delete=False)),
            methods=["GET"],
        ),
        Route("/failed/retry", action(retry), methods=["POST"]),
        Route(
            "/failed/delete",
            page("confirm.html", functools.partial(confirm_failed, delete=True)),
            methods=["GET"],
        ),
        Route("/failed/delete", action(delete_failed), methods=["POST"]),
        Route("/jobs", jobs),
        Route("/jobs/cancel", action(cancel), methods=["POST"]),
        Route("/jobs/{job_id:path}", page("job.html", job)),
        Route("/workers", page("workers.html", workers)),
        Route(
            "/workers/stop",
            page("confirm.html", functools.partial(confirm_worker, quiet=False)),
            methods=["GET"],
        ),
        Route("/workers/stop", action(stop_worker), methods=["POST"]),
        Route(
            "/workers/quiet",
            page("confirm.html", functools.partial(confirm_worker, quiet=True)),
            methods=["GET"],
        ),
        Route("/workers/quiet", action(quiet_worker), methods=["POST"]),
        Route("/periodic", page("periodic.html", periodic)),
        Route("/api/overview", answer(lambda request: api.overview(dashboard))),
        Route(
            "/api/queues",
            answer(
                lambda request: api.queues(
                    dashboard, after_of(request), _list_filter(request.query_params)
                )
            ),
        ),
        Route(
            "/api/failed",
            answer(
                lambda request: api.failed(
                    dashboard, after_of(request), _list_filter(request.query_params)
                )
            ),
        ),
        Route("/api/jobs", answer(api_jobs)),
        Route("/api/jobs/{job_id:path}", answer(api_job)),
        Route("/api/workers", answer(lambda request: api.workers(dashboard))),
        Route("/api/periodic", answer(lambda request: api.periodic(dashboard))),
        Route("/static/style.css", stylesheet),
    ]
    guard = Middleware(Guard, hosts=hosts or Hosts(), auth=auth, throttle=Throttle())
    return Starlette(routes=routes, middleware=[guard])


async def _bounded_body(request: Request) -> bytes | None:
    """The body, read as it arrives; None as soon as it is longer than :data:`MAX_BODY_BYTES`."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return None
    return bytes(body)


def _priority(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _list_filter(params: Mapping[str, str]) -> ListFilter:
    """A Queues or Failed page's filter from its query (or a form): a type, a priority,
    a job's id, or none."""
    type_ = (params.get("type") or "").strip() or None
    job = (params.get("job") or "").strip() or None
    return ListFilter(type_, _priority(params.get("priority")), job)


def _after(form: dict[str, list[str]]) -> str | None:
    """The page a form was on (its ``after``): an action looks for its message there only."""
    return (form.get("after") or [""])[0] or None
