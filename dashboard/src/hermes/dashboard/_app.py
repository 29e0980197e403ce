"""The web application: one Starlette route per page or action, Jinja2 templates, no JavaScript.

Safe by default, in this order of the request: authentication (when
configured) before anything else; every POST is refused with 403 unless it
carries this process's CSRF token (and always with ``--read-only``); pages
are rendered with autoescape on, so a payload of ``<script>`` is text; the
Content-Security-Policy allows no script at all and no framing, so even a
value that slipped through could not run. Pages show URLs redacted.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from hermes.core import HermesError
from hermes.core._cli._workers import duration, in_flight_text
from hermes.dashboard._chart import chart
from hermes.dashboard._state import (
    BROWSE_LIMIT,
    FAILED_LIMIT,
    Dashboard,
    payload_text,
    worker_groups,
)

#: Security headers of every response. No script may run, nothing may frame a page.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

#: What a redirect after an action says, by code: the text never comes from the URL.
DONE = {
    "deleted": "Deleted {n} waiting message(s).",
    "gone": "That message was no longer waiting: a worker took it, or it was deleted.",
    "purged": "Purged {n} message(s) from {queue}.",
    "retried": "Sent {n} failed message(s) back to the queue.",
    "dropped": "Deleted {n} failed message(s).",
}


@dataclass(frozen=True)
class Auth:
    """HTTP Basic credentials, or a token (as a Bearer token or as the Basic password)."""

    user: str | None = None
    password: str | None = None
    token: str | None = None

    def allows(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.token is not None:
            return hmac.compare_digest(value.strip().encode(), self.token.encode())
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if self.token is not None and hmac.compare_digest(password.encode(), self.token.encode()):
            return True
        if self.user is None or self.password is None:
            return False
        # Both compared, always: the time taken does not say which one was wrong.
        user_ok = hmac.compare_digest(user.encode(), self.user.encode())
        password_ok = hmac.compare_digest(password.encode(), self.password.encode())
        return user_ok and password_ok


class _Guard(BaseHTTPMiddleware):
    """Authentication first, then the security headers on whatever is answered."""

    def __init__(self, app: Any, auth: Auth | None) -> None:
        super().__init__(app)
        self.auth = auth

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if self.auth is not None and not self.auth.allows(request.headers.get("authorization")):
            response: Response = PlainTextResponse(
                "Authentication required\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="Hermes dashboard", charset="UTF-8"'},
            )
        else:
            response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "unknown"
    return dt.datetime.fromtimestamp(float(timestamp)).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _ago(timestamp: float | None) -> str:
    if timestamp is None:
        return "unknown"
    return duration(time.time() - float(timestamp))


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
    env.filters.update(when=_when, ago=_ago, count=_count, duration=duration, payload=payload_text)
    env.globals["in_flight_text"] = in_flight_text
    return env


def create_app(dashboard: Dashboard, *, auth: Auth | None = None) -> Starlette:
    """The ASGI application serving ``dashboard``'s pages."""
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
            return render(request, name, **context)

        return endpoint

    def action(
        do: Callable[[dict[str, list[str]]], str],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if dashboard.read_only:
                return PlainTextResponse("This dashboard is read-only\n", status_code=403)
            form = parse_qs((await request.body()).decode("utf-8", "replace"))
            sent = (form.get("csrf") or [""])[0]
            if not hmac.compare_digest(sent.encode(), csrf_token.encode()):
                return PlainTextResponse("Missing or wrong CSRF token\n", status_code=403)
            try:
                where = await run_in_threadpool(do, form)
            except KeyError:
                return PlainTextResponse("Not a queue of this dashboard\n", status_code=404)
            except HermesError as exc:
                return render(request, "error.html", status=503, error=str(exc))
            # Post/redirect/get: a reload does not repeat the action.
            return RedirectResponse(where, status_code=303)

        return endpoint

    # Pages ------------------------------------------------------------------

    def overview(request: Request) -> dict[str, Any]:
        rows = dashboard.queue_stats()
        workers = dashboard.workers()
        rate, handled, failed = dashboard.failure_rate()
        return {
            "rows": rows,
            "workers": workers,
            "chart": chart(list(dashboard.history)),
            "rate": rate,
            "handled": handled,
            "failed": failed,
        }

    def queues(request: Request) -> dict[str, Any]:
        listed = dashboard.waiting()
        return {
            "rows": dashboard.queue_stats(),
            "waiting": None if listed is None else listed[0],
            "more": listed is not None and listed[1],
            "limit": BROWSE_LIMIT,
        }

    def purge_form(request: Request) -> dict[str, Any]:
        priority = _priority(request.query_params.get("priority"))
        rows = [r for r in dashboard.queue_stats() or [] if r.priority == priority]
        return {"row": rows[0] if rows else None}

    def failed(request: Request) -> dict[str, Any]:
        return {"messages": dashboard.failed_messages(), "limit": FAILED_LIMIT}

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
        done = dashboard.delete_waiting(key)
        return "/queues?" + urlencode({"done": "deleted", "n": 1} if done else {"done": "gone"})

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
        n = dashboard.retry(form.get("id") or [])
        return "/failed?" + urlencode({"done": "retried", "n": n})

    def delete_failed(form: dict[str, list[str]]) -> str:
        n = dashboard.delete_failed(form.get("id") or [])
        return "/failed?" + urlencode({"done": "dropped", "n": n})

    async def stylesheet(request: Request) -> Response:
        return Response(style, media_type="text/css")

    routes = [
        Route("/", page("overview.html", overview)),
        Route("/queues", page("queues.html", queues)),
        Route("/queues/purge", page("purge.html", purge_form), methods=["GET"]),
        Route("/queues/purge", action(purge), methods=["POST"]),
        Route("/queues/delete", action(delete_waiting), methods=["POST"]),
        Route("/failed", page("failed.html", failed)),
        Route("/failed/retry", action(retry), methods=["POST"]),
        Route("/failed/delete", action(delete_failed), methods=["POST"]),
        Route("/workers", page("workers.html", workers)),
        Route("/periodic", page("periodic.html", periodic)),
        Route("/static/style.css", stylesheet),
    ]
    return Starlette(routes=routes, middleware=[Middleware(_Guard, auth=auth)])


def _priority(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
