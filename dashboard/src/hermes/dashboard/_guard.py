"""Who may talk to the dashboard, checked before any page runs.

In the order of a request: the ``Host`` header must name this dashboard
(:class:`Hosts`; else 400), so a page of another site whose name was
rebound to 127.0.0.1 reads nothing; the credentials, when configured
(:class:`Auth`), each wrong try slowing down its client (:class:`Throttle`;
else 401); a POST must come from the dashboard's own pages (``Origin``,
``Sec-Fetch-Site``; else 403). Whatever is answered, an error included,
carries :data:`SECURITY_HEADERS`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

logger = logging.getLogger("hermes.dashboard")

#: Security headers of every response. No script may run, nothing may frame a page.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Nothing to other sites; same-origin, so that a browser names this origin in a
    # form's POST (under "no-referrer" it sends "Origin: null", which is refused).
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

#: The names of this machine's loopback interface, as a browser writes them in ``Host``.
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})

#: A ``Host`` header (or an origin's authority): a name or an address, then maybe a port.
#: Nothing else is let through: no user part, no path, no spaces.
_AUTHORITY = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(?::(\d{1,5}))?")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _name_of(host: str) -> str:
    """``host`` as it appears in a ``Host`` header: lower case, an IPv6 address in brackets."""
    host = host.strip().lower()
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    return f"[{address.compressed}]" if address.version == 6 else address.compressed


def split_authority(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header; None when it is not one."""
    found = _AUTHORITY.fullmatch(value.strip().lower())
    if found is None:
        return None
    port = int(found.group(2)) if found.group(2) else None
    return found.group(1), port


@dataclass(frozen=True)
class Hosts:
    """The ``Host`` header values the dashboard answers; any other gets 400.

    ``names`` are answered on ``port`` (any port when None), ``proxied`` on
    any port: the names a reverse proxy forwards (``--allowed-host``). The
    default answers the loopback names on any port: a name rebound to
    127.0.0.1 is never one of them.
    """

    names: frozenset[str] = LOOPBACK_NAMES
    port: int | None = None
    proxied: frozenset[str] = frozenset()

    @classmethod
    def bound(cls, host: str, port: int, allowed: Iterable[str] = ()) -> Hosts:
        """What a dashboard bound to ``host:port`` answers, plus the ``allowed`` names.

        A loopback address answers the loopback names too; a wildcard address
        (``0.0.0.0``, ``::``) the loopback names and itself, as it listens there
        too: any other name it is reached by must be ``allowed``.
        """
        names = {_name_of(host)}
        if is_loopback(host) or _is_wildcard(host):
            names |= LOOPBACK_NAMES
        return cls(frozenset(names), port, frozenset(_name_of(a) for a in allowed))

    def allows(self, header: str | None) -> bool:
        parsed = split_authority(header or "")
        if parsed is None:
            return False
        name, port = parsed
        if name in self.proxied:
            return True
        # A browser leaves the port out of Host when it is the scheme's own: 80 for http.
        return name in self.names and (self.port is None or (port or 80) == self.port)

    def describe(self) -> str:
        port = "" if self.port is None else f":{self.port}"
        shown = [f"{name}{port}" for name in sorted(self.names)] + sorted(self.proxied)
        return ", ".join(shown)


def cross_origin(request: Request, hosts: Hosts) -> str | None:
    """Why a POST does not come from the dashboard's own pages; None when it does.

    ``Sec-Fetch-Site`` (sent by every current browser) must not say another
    site; an ``Origin``, when sent, must be the ``Host`` asked for or a name a
    proxy forwards. A client that sends neither (curl) is let through to the
    CSRF check.
    """
    site = request.headers.get("sec-fetch-site")
    if site in ("cross-site", "same-site"):
        return f"Sec-Fetch-Site: {site}"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    scheme, sep, authority = origin.partition("://")
    parsed = split_authority(authority) if sep and scheme in ("http", "https") else None
    if parsed is None:
        return "Origin is not a web origin"
    name, port = parsed
    if name in hosts.proxied:
        return None
    default = 443 if scheme == "https" else 80
    asked = split_authority(request.headers.get("host", ""))
    if asked is not None and asked[0] == name and (asked[1] or default) == (port or default):
        return None
    return "Origin is another site"


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


@dataclass
class _Client:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    failures: int = 0
    #: When this client's next try may be checked (the clock's time).
    next_try_at: float = 0.0
    last_seen: float = 0.0


class Throttle:
    """Each wrong try makes its client's next try wait, twice as long each time, up to a bound.

    A client's tries are checked one at a time, each after the wait its last
    failure set: tries sent at once queue up instead of multiplying the rate.
    Only the client that failed waits, and it waits on the event loop, not
    on a thread. The right credentials end the slowdown; so does
    ``forget_after_s`` without a wrong try. A client is its address: behind
    a reverse proxy every client is the proxy, and they slow down together.
    """

    def __init__(
        self,
        *,
        first_delay_s: float = 0.25,
        max_delay_s: float = 5.0,
        forget_after_s: float = 900.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.forget_after_s = forget_after_s
        self.max_clients = max_clients
        self._clock = clock
        self._sleep = sleep
        self._clients: dict[str, _Client] = {}

    def __len__(self) -> int:
        return len(self._clients)

    async def attempt(self, client: str, check: Callable[[], bool]) -> bool:
        """``check()``, once ``client``'s wait is over; a False slows ``client`` down further."""
        state = self._clients.get(client)
        if state is None:
            self._forget_some()
            state = self._clients[client] = _Client()
        async with state.lock:
            now = self._clock()
            if state.failures and now - state.last_seen > self.forget_after_s:
                state.failures = 0
            wait = state.next_try_at - now
            if state.failures and wait > 0:
                await self._sleep(wait)
            ok = check()
            now = self._clock()
            state.last_seen = now
            if ok:
                state.failures = 0
                state.next_try_at = 0.0
            else:
                state.failures += 1
                delay = self.first_delay_s * 2 ** min(state.failures - 1, 30)
                state.next_try_at = now + min(delay, self.max_delay_s)
            return ok

    def _forget_some(self) -> None:
        """Keep at most ``max_clients``: the idle ones go first, then the oldest seen."""
        if len(self._clients) < self.max_clients:
            return
        now = self._clock()
        idle = [
            name
            for name, c in self._clients.items()
            if not c.lock.locked() and (not c.failures or now - c.last_seen > self.forget_after_s)
        ]
        for name in idle:
            del self._clients[name]
        if len(self._clients) >= self.max_clients:
            by_age = sorted(self._clients, key=lambda n: self._clients[n].last_seen)
            for name in by_age[: len(by_age) - self.max_clients // 2]:
                del self._clients[name]


class Guard(BaseHTTPMiddleware):
    """The checks of this module, in order, and the security headers on every answer."""

    def __init__(self, app: Any, hosts: Hosts, auth: Auth | None, throttle: Throttle) -> None:
        super().__init__(app)
        self.hosts = hosts
        self.auth = auth
        self.throttle = throttle

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await self._answer(request, call_next)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def _answer(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if not self.hosts.allows(request.headers.get("host")):
            return PlainTextResponse("Unknown Host\n", status_code=400)
        if self.auth is not None and not await self._authenticated(request):
            return PlainTextResponse(
                "Authentication required\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="Hermes dashboard", charset="UTF-8"'},
            )
        if request.method not in ("GET", "HEAD"):
            why = cross_origin(request, self.hosts)
            if why is not None:
                return PlainTextResponse(f"Cross-site request refused ({why})\n", status_code=403)
        try:
            return await call_next(request)
        except Exception:
            logger.exception("Dashboard: %s %s failed", request.method, request.url.path)
            return PlainTextResponse(
                "Internal error: the dashboard's log says what\n", status_code=500
            )

    async def _authenticated(self, request: Request) -> bool:
        auth = self.auth
        assert auth is not None
        header = request.headers.get("authorization")
        if not header:
            return False  # a first visit: the browser asks for credentials on the 401
        client = request.client.host if request.client is not None else "?"
        return await self.throttle.attempt(client, lambda: auth.allows(header))
