"""The failed-message store: where a Dispatcher keeps the messages it gave up on.

Off unless asked for (``Dispatcher(driver, failed=connect(url))``, ``hermes
worker --failed-url URL``). The store is any Hermes URL: a failed message is
sent there as an ordinary Hermes message -- same id, type, payload, created,
retries and headers, due at once -- whose envelope also carries ``failed_reason``,
``failed_at`` and, when handlers raised, ``failed_exceptions``: each exception's class,
message and traceback (:class:`ExceptionRecord`), redacted like a log line and
bounded in size. PHP Hermes ignores envelope keys it does not know, so the wire
format stays the same, and a worker started on the store's URL can handle
what is in it like any queue.

Reading the store back (``hermes failed list | retry | purge``) must not take
the messages out: that needs a broker that can list and delete what a queue
holds. A driver's plugin offers it as a :class:`QueueBrowser` (``file://``,
``redis://`` and ``postgresql://`` do); other brokers can still be a store, read by
a worker.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from traceback import format_exception
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from hermes.core.model._errors import DeliveryError, NotSupportedError, SerializeError
from hermes.core.model._message import Message
from hermes.core.model._serializer import MessageSerializer
from hermes.core.spi._browse import BrowsePage
from hermes.core.spi._door import Door, translate_errors
from hermes.core.spi._driver import DEFAULT_PRIORITY
from hermes.core.spi._outgoing import outgoing
from hermes.core.spi._registry import DriverPlugin, driver_for_url
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core.spi._driver import Driver

logger = logging.getLogger("hermes")

#: The ``failed_reason`` of a message in the store that carries none.
NO_REASON = "(no reason recorded)"
#: Longest traceback kept with a failed message, in characters: its innermost part stays.
MAX_TRACEBACK_CHARS = 16 * 1024
#: Longest exception message kept with a failed message, in characters: its start stays.
MAX_EXCEPTION_MESSAGE_CHARS = 2 * 1024
# Texts are cut to this many times their bound before redaction, so that a
# handler's megabyte-long message costs no megabyte-long regex scans; the
# final cut then drops the piece a secret may have been split at.
_SLACK = 4
# Room kept within a bound for the line that says how much was cut.
_MARKER_CHARS = 80


@dataclass(frozen=True, slots=True)
class ExceptionRecord:
    """The exception a handler raised on a message it was then given up on.

    Made by :meth:`of`: every text is passed through :func:`redact_url` (as
    log lines are) and bounded, so that a failed-message store holds no
    password a handler's error happened to quote, and no megabyte of it.
    """

    #: The exception's class with its module: ``"builtins.RuntimeError"``,
    #: ``"myapp.billing.CardDeclined"``.
    exception_class: str
    #: ``str(exception)``, at most :data:`MAX_EXCEPTION_MESSAGE_CHARS` (a cut says so).
    message: str
    #: The formatted traceback (chained exceptions included), from the
    #: handler's frame in (the Dispatcher's frames above it are left out), at
    #: most :data:`MAX_TRACEBACK_CHARS`: the outermost frames go first, and a
    #: line at the top says how much was cut.
    traceback: str = ""
    #: The handler that raised it, as log lines name it (``"SendEmail"``); "" when unknown.
    handler: str = ""

    @classmethod
    def of(cls, exc: BaseException, handler: str = "") -> ExceptionRecord:
        """``exc`` as the store keeps it: class, message and traceback, redacted and bounded."""
        kind = type(exc)
        try:
            text = str(exc)
        except Exception as str_exc:  # the handler's own __str__ is user code
            text = f"<str() of the exception raised {type(str_exc).__name__}>"
        lines = format_exception(kind, exc, _from_the_handler(exc.__traceback__))
        return cls(
            exception_class=f"{kind.__module__}.{kind.__qualname__}",
            message=bounded_head(text, MAX_EXCEPTION_MESSAGE_CHARS),
            traceback=_bounded_tail(lines, MAX_TRACEBACK_CHARS),
            handler=handler,
        )

    def summary(self) -> str:
        """``"builtins.RuntimeError: card declined"`` on one line."""
        message = " ".join(self.message.split())
        return f"{self.exception_class}: {message}" if message else self.exception_class

    def as_json(self) -> dict[str, str]:
        """The JSON object :class:`FailedMessageSerializer` writes for it."""
        return {
            "class": self.exception_class,
            "message": self.message,
            "traceback": self.traceback,
            "handler": self.handler,
        }

    @classmethod
    def from_json(cls, value: object) -> ExceptionRecord | None:
        """What :meth:`as_json` wrote; None for anything without a class name."""
        if not isinstance(value, dict) or not isinstance(value.get("class"), str):
            return None

        def text(key: str) -> str:
            item = value.get(key)
            return item if isinstance(item, str) else ""

        return cls(value["class"], text("message"), text("traceback"), text("handler"))


def _from_the_handler(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its outermost frames in Hermes's own code (the dispatch down to the handler).

    Every handler's traceback starts with the same Dispatcher frames; the
    reader wants the handler's. Kept whole when no other frame is left (an
    exception Hermes raised itself, such as a time limit).
    """
    inner = tb
    while inner is not None and inner.tb_frame.f_globals.get("__name__", "").startswith(
        "hermes.core."
    ):
        inner = inner.tb_next
    return inner if inner is not None else tb


def bounded_head(text: str, limit: int) -> str:
    """``text`` redacted, its first ``limit`` characters kept and the cut counted."""
    window = text[: limit * _SLACK]
    kept = redact_url(window)
    if len(kept) <= limit and len(window) == len(text):
        return kept
    # Past the window the length is the unredacted one: close enough for a count.
    full = len(kept) + len(text) - len(window)
    kept = kept[: limit - _MARKER_CHARS]
    return f"{kept} [... {full - len(kept):,} characters cut]"


def _bounded_tail(lines: Iterable[str], limit: int) -> str:
    """The traceback ``lines`` redacted; its last ``limit`` characters kept, the cut counted."""
    text = "".join(lines)
    window = text[-limit * _SLACK :]
    kept = redact_url(window)
    if len(kept) <= limit and len(window) == len(text):
        return kept
    full = len(kept) + len(text) - len(window)
    kept = kept[-(limit - _MARKER_CHARS) :]
    # Start at a frame, else at a whole line, when one starts near the cut.
    start = kept.find("\n  File ", 0, 1000)
    if start == -1:
        start = kept.find("\n", 0, 400)
    if start != -1:
        kept = kept[start + 1 :]
    return f"[... {full - len(kept):,} characters of the outermost frames cut]\n{kept}"


@dataclass(frozen=True, slots=True, init=False)
class FailedMessage(Message):
    """A message as the failed-message store holds it: the message, why and when it failed.

    ``retries`` is what the message had when it was given up on.
    """

    #: Why the Dispatcher gave up, e.g. ``"SendEmail: gave up after 25 retries"``.
    failed_reason: str
    #: UNIX timestamp of when it was given up on.
    failed_at: float
    #: What each handler that raised and was given up on raised, in the order
    #: the handlers ran; empty when no exception put the message here (a
    #: handler returned False, no handler, too many deliveries: the reason
    #: says which) and for messages kept before exceptions were recorded.
    exceptions: tuple[ExceptionRecord, ...]
    #: The priority it was taken from, where a retry sends it; None when not
    #: known (kept before priorities were recorded): the default priority.
    priority: int | None

    def __init__(
        self,
        type: str,
        payload: Any = None,
        *,
        id: str | None = None,
        created: float | None = None,
        execute_at: float | None = None,
        retries: int = 0,
        headers: Mapping[str, str] | None = None,
        failed_reason: str = NO_REASON,
        failed_at: float | None = None,
        exceptions: Iterable[ExceptionRecord] = (),
        priority: int | None = None,
    ) -> None:
        # Message.__init__ by name: a slots dataclass breaks zero-argument super().
        Message.__init__(
            self,
            type,
            payload,
            id=id,
            created=created,
            execute_at=execute_at,
            retries=retries,
            headers=headers,
        )
        object.__setattr__(self, "failed_reason", str(failed_reason))
        object.__setattr__(
            self, "failed_at", time.time() if failed_at is None else float(failed_at)
        )
        object.__setattr__(self, "exceptions", tuple(exceptions))
        object.__setattr__(self, "priority", priority)

    @property
    def exception(self) -> ExceptionRecord | None:
        """The first of :attr:`exceptions`, None without any."""
        return self.exceptions[0] if self.exceptions else None

    @classmethod
    def of(
        cls,
        message: Message,
        reason: str,
        failed_at: float | None = None,
        exceptions: Iterable[ExceptionRecord] = (),
        priority: int | None = None,
    ) -> FailedMessage:
        """``message`` as the store keeps it: due at once, with why, when, what was raised
        and the priority it was taken from."""
        return cls(
            message.type,
            message.payload,
            id=message.id,
            created=message.created,
            retries=message.retries,
            headers=message.headers,
            failed_reason=reason,
            failed_at=failed_at,
            exceptions=exceptions,
            priority=priority,
        )

    @property
    def retry_priority(self) -> int:
        """Where a retry sends it: the priority it failed on, else the default one."""
        return DEFAULT_PRIORITY if self.priority is None else self.priority

    def fresh(self) -> Message:
        """The message to run again: same id, type, payload, created and headers; retries reset.

        Due now. The headers stay so that a run from the store is still traced
        to the request that first sent the message.
        """
        return Message(
            self.type, self.payload, id=self.id, created=self.created, headers=self.headers
        )


class FailedMessageSerializer(MessageSerializer):
    """Hermes's envelope plus ``failed_reason``, ``failed_at`` and ``failed_exceptions``.

    ``failed_exceptions``, a list of :meth:`ExceptionRecord.as_json` objects, is
    written only when there are exceptions. Reading, every message becomes a
    :class:`FailedMessage`; one without the keys (kept before exceptions were
    recorded, or sent to the store by something else) gets none, and
    without ``failed_reason`` :data:`NO_REASON` and its ``created`` time.
    """

    def serialize(self, message: Message) -> str:
        text = super().serialize(message)
        if not isinstance(message, FailedMessage):
            return text
        envelope = json.loads(text)
        envelope["message"]["failed_reason"] = message.failed_reason
        envelope["message"]["failed_at"] = message.failed_at
        if message.exceptions:
            envelope["message"]["failed_exceptions"] = [e.as_json() for e in message.exceptions]
        if message.priority is not None:
            envelope["message"]["failed_priority"] = message.priority
        return json.dumps(envelope, ensure_ascii=True, separators=(",", ":"))

    def unserialize(self, data: str | bytes) -> FailedMessage:
        message = super().unserialize(data)
        # The envelope is valid JSON with a "message" object: the line above checked it.
        body = json.loads(data)["message"]
        reason = body.get("failed_reason")
        failed_at = body.get("failed_at")
        if not isinstance(failed_at, int | float) or isinstance(failed_at, bool):
            failed_at = message.created
        listed = body.get("failed_exceptions")
        read = (ExceptionRecord.from_json(item) for item in listed or ())
        exceptions = [record for record in read if record] if isinstance(listed, list) else []
        priority = body.get("failed_priority")
        if not isinstance(priority, int) or isinstance(priority, bool):
            priority = None
        return FailedMessage.of(
            message,
            reason if isinstance(reason, str) else NO_REASON,
            failed_at,
            exceptions,
            priority,
        )


class QueueBrowser(Protocol):
    """Looks at the messages waiting on a driver's queues without taking them.

    A driver's plugin offers one through ``DriverPlugin.browse`` when its
    broker can list and delete queued messages cheaply. Messages a worker has
    taken (and not released) are not listed.
    """

    def entries(self) -> Iterator[tuple[Hashable, bytes | str]]:
        """``(entry, body)`` for every waiting message; ``entry`` is what :meth:`remove` takes."""
        ...

    def page(self, after: str | None, limit: int, max_bytes: int) -> BrowsePage:
        """Up to ``limit`` entries from where ``after`` (a page's ``next``; None: the start)
        left off, fewer once their bodies reach ``max_bytes``; reads little more of the
        queue than the page shows (a broker that lists in batches may end a page at the
        end of one, a few entries past). Following ``next`` from None lists every message
        that waited all along, once or more (a set that changes meanwhile may repeat one)."""
        ...

    def remove(self, entry: Hashable) -> bool:
        """Delete one waiting message; False when it was no longer there."""
        ...


def queue_browser(plugin: DriverPlugin, driver: Driver) -> QueueBrowser | None:
    """The browser ``plugin`` offers for ``driver``, its calls translated; None when it has none."""
    if plugin.browse is None:
        return None
    return Door(driver).wrap(plugin.browse(driver))


class FailedStore:
    """The messages a Dispatcher gave up on, kept on ``driver``'s broker.

    :meth:`keep` works on every driver. :meth:`messages`, :meth:`retry` and
    :meth:`purge` need ``browser``, a :class:`QueueBrowser` on the same queue
    (:meth:`connect` finds the one the URL's driver offers), and raise
    :class:`NotSupportedError` without one.
    """

    def __init__(self, driver: Driver, browser: QueueBrowser | None = None) -> None:
        #: The store's driver; the store serializes with :attr:`serializer` itself.
        self.driver = driver
        self.browser = browser
        self.serializer = FailedMessageSerializer()

    @classmethod
    def connect(cls, url: str) -> FailedStore:
        """The store at ``url``, with the browser its driver's plugin offers (if any)."""
        plugin, parsed = driver_for_url(url)
        driver = plugin.factory(parsed)
        return cls(driver, queue_browser(plugin, driver))

    def __repr__(self) -> str:
        return f"FailedStore({self.driver!r})"

    def close(self) -> None:
        self.driver.close()

    def __enter__(self) -> FailedStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def keep(
        self,
        message: Message,
        reason: str,
        failed_at: float | None = None,
        exceptions: Iterable[ExceptionRecord] = (),
        priority: int | None = None,
    ) -> FailedMessage:
        """Send ``message`` to the store with ``reason``; returns what was stored.

        ``exceptions`` are what its handlers raised (:meth:`ExceptionRecord.of`);
        none when no exception put the message here. ``priority``: the one it was
        taken from, where :meth:`retry` sends it back.
        """
        failed = FailedMessage.of(message, reason, failed_at, exceptions, priority)
        item = outgoing(failed, self.serializer)
        with translate_errors(self.driver, f"keeping message #{message.id}", DeliveryError):
            self.driver.put((item,), DEFAULT_PRIORITY)
        return failed

    def messages(self) -> list[FailedMessage]:
        """Every message in the store, oldest failure first.

        Bodies that are not Hermes messages are logged as a WARNING each and
        left alone (:meth:`purge` without ids removes them).
        """
        return [message for _, message in self._scan()]

    def page(
        self, after: str | None, limit: int, max_bytes: int
    ) -> tuple[list[FailedMessage], str | None]:
        """One page of the store, in its browser's order (not by failure time): the
        messages, and the ``after`` of the next page (None: the last). Reads only the
        page's share of the store (:meth:`QueueBrowser.page`)."""
        listed = self._browser().page(after, limit, max_bytes)
        return [m for _, m in self._decoded(listed.entries)], listed.next

    def retry(
        self,
        target: Driver,
        ids: Collection[str] | None = None,
        *,
        page: tuple[str | None, int, int] | None = None,
    ) -> list[FailedMessage]:
        """Send the messages with ``ids`` (all when None) to ``target``, then delete them here.

        Each is sent as :meth:`FailedMessage.fresh` -- retries reset, due at
        once -- on the priority it failed on (the default one when not known;
        ``target`` must have that priority's queue), before it is deleted from the store:
        a crash in between leaves it in both places rather than in neither.
        ``page`` (``after, limit, max_bytes`` of :meth:`page`): look for them on
        that page only, not the whole store. Returns the messages sent.
        """
        sent: list[FailedMessage] = []
        for entry, message in self._found(page):
            if ids is not None and message.id not in ids:
                continue
            target.send(message.fresh(), message.retry_priority)
            sent.append(message)
            if not self._browser().remove(entry):
                logger.warning(
                    "Failed message #%s (%s) was sent to %r, but someone else took it "
                    "from %r meanwhile: it may run twice",
                    message.id,
                    message.type,
                    target,
                    self.driver,
                )
        return sent

    def purge(
        self,
        ids: Collection[str] | None = None,
        *,
        page: tuple[str | None, int, int] | None = None,
    ) -> int:
        """Delete the messages with ``ids`` -- all, unreadable bodies included, when None.

        ``page``: look for ``ids`` on that page only (see :meth:`retry`).
        Returns how many were deleted.
        """
        browser = self._browser()
        if ids is None:
            return sum(browser.remove(entry) for entry, _ in list(browser.entries()))
        found = self._found(page)
        return sum(browser.remove(entry) for entry, message in found if message.id in ids)

    def _found(
        self, page: tuple[str | None, int, int] | None
    ) -> list[tuple[Hashable, FailedMessage]]:
        """The whole store, oldest failure first; or one page of it."""
        if page is None:
            return self._scan()
        return self._decoded(self._browser().page(*page).entries)

    def _browser(self) -> QueueBrowser:
        if self.browser is None:
            raise NotSupportedError(
                f"{self.driver!r} cannot list or delete the messages it holds without "
                "taking them: use a file://, redis:// or postgresql:// URL for a store "
                "`hermes failed` can read, or read this one with a worker (`hermes worker "
                "--url` on it)"
            )
        return self.browser

    def _scan(self) -> list[tuple[Hashable, FailedMessage]]:
        found = self._decoded(self._browser().entries())
        found.sort(key=lambda pair: pair[1].failed_at)
        return found

    def _decoded(
        self, entries: Iterable[tuple[Hashable, bytes | str]]
    ) -> list[tuple[Hashable, FailedMessage]]:
        serializer = self.serializer
        found: list[tuple[Hashable, FailedMessage]] = []
        for entry, body in entries:
            try:
                message = serializer.unserialize(body)
            except SerializeError as exc:
                logger.warning("%r holds a body that is not a Hermes message - %s", self, exc)
                continue
            if not isinstance(message, FailedMessage):
                message = FailedMessage.of(message, NO_REASON, message.created)
            found.append((entry, message))
        return found
