"""The failed-message store: where a Dispatcher keeps the messages it gave up on.

Off unless asked for (``Dispatcher(driver, failed=connect(url))``, ``hermes
worker --failed-url URL``). The store is any Hermes URL: a failed message is
sent there as an ordinary Hermes message -- same id, type, payload, created,
retries and headers, due at once -- whose envelope also carries ``failed_reason`` and
``failed_at``. PHP Hermes ignores envelope keys it does not know, so the wire
format stays the same, and a worker started on the store's URL can handle
what is in it like any queue.

Reading the store back (``hermes failed list | retry | purge``) must not take
the messages out: that needs a broker that can list and delete what a queue
holds. A driver's plugin offers it as a :class:`QueueBrowser` (``file://``
and ``redis://`` do); other brokers can still be a store, read by a worker.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hermes.core.model._errors import DeliveryError, NotSupportedError, SerializeError
from hermes.core.model._message import Message
from hermes.core.model._serializer import MessageSerializer
from hermes.core.spi._driver import DEFAULT_PRIORITY, outgoing
from hermes.core.spi._registry import driver_for_url

if TYPE_CHECKING:
    from hermes.core.spi._driver import Driver

logger = logging.getLogger("hermes")

#: The ``failed_reason`` of a message in the store that carries none.
NO_REASON = "(no reason recorded)"


@dataclass(frozen=True, slots=True, init=False)
class FailedMessage(Message):
    """A message as the failed-message store holds it: the message, why and when it failed.

    ``retries`` is what the message had when it was given up on.
    """

    #: Why the Dispatcher gave up, e.g. ``"SendEmail: gave up after 25 retries"``.
    failed_reason: str
    #: UNIX timestamp of when it was given up on.
    failed_at: float

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

    @classmethod
    def of(cls, message: Message, reason: str, failed_at: float | None = None) -> FailedMessage:
        """``message`` as the store keeps it: due at once, with ``reason`` and ``failed_at``."""
        return cls(
            message.type,
            message.payload,
            id=message.id,
            created=message.created,
            retries=message.retries,
            headers=message.headers,
            failed_reason=reason,
            failed_at=failed_at,
        )

    def fresh(self) -> Message:
        """The message to run again: same id, type, payload, created and headers; retries reset.

        Due now. The headers stay so that a run from the store is still traced
        to the request that first sent the message.
        """
        return Message(
            self.type, self.payload, id=self.id, created=self.created, headers=self.headers
        )


class FailedMessageSerializer(MessageSerializer):
    """Hermes's envelope plus ``failed_reason`` and ``failed_at`` for a :class:`FailedMessage`.

    Reading, every message becomes a :class:`FailedMessage`; one without the
    two keys (sent to the store by something else) gets :data:`NO_REASON`
    and its ``created`` time.
    """

    def serialize(self, message: Message) -> str:
        text = super().serialize(message)
        if not isinstance(message, FailedMessage):
            return text
        envelope = json.loads(text)
        envelope["message"]["failed_reason"] = message.failed_reason
        envelope["message"]["failed_at"] = message.failed_at
        return json.dumps(envelope, ensure_ascii=True, separators=(",", ":"))

    def unserialize(self, data: str | bytes) -> FailedMessage:
        message = super().unserialize(data)
        # The envelope is valid JSON with a "message" object: the line above checked it.
        body = json.loads(data)["message"]
        reason = body.get("failed_reason")
        failed_at = body.get("failed_at")
        if not isinstance(failed_at, int | float) or isinstance(failed_at, bool):
            failed_at = message.created
        return FailedMessage.of(
            message, reason if isinstance(reason, str) else NO_REASON, failed_at
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

    def remove(self, entry: Hashable) -> bool:
        """Delete one waiting message; False when it was no longer there."""
        ...


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
        browser = plugin.browse(driver) if plugin.browse is not None else None
        return cls(driver, browser)

    def __repr__(self) -> str:
        return f"FailedStore({self.driver!r})"

    def close(self) -> None:
        self.driver.close()

    def __enter__(self) -> FailedStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def keep(self, message: Message, reason: str, failed_at: float | None = None) -> FailedMessage:
        """Send ``message`` to the store with ``reason``; returns what was stored."""
        failed = FailedMessage.of(message, reason, failed_at)
        item = outgoing(failed, self.serializer)
        with self.driver.translating(f"keeping message #{message.id}", DeliveryError):
            self.driver.put((item,), DEFAULT_PRIORITY)
        return failed

    def messages(self) -> list[FailedMessage]:
        """Every message in the store, oldest failure first.

        Bodies that are not Hermes messages are logged as a WARNING each and
        left alone (:meth:`purge` without ids removes them).
        """
        return [message for _, message in self._scan()]

    def retry(self, target: Driver, ids: Collection[str] | None = None) -> list[FailedMessage]:
        """Send the messages with ``ids`` (all when None) to ``target``, then delete them here.

        Each is sent as :meth:`FailedMessage.fresh` -- retries reset, due at
        once -- on the default priority, before it is deleted from the store:
        a crash in between leaves it in both places rather than in neither.
        Returns the messages sent.
        """
        sent: list[FailedMessage] = []
        for entry, message in self._scan():
            if ids is not None and message.id not in ids:
                continue
            target.send(message.fresh())
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

    def purge(self, ids: Collection[str] | None = None) -> int:
        """Delete the messages with ``ids`` -- all, unreadable bodies included, when None.

        Returns how many were deleted.
        """
        browser = self._browser()
        if ids is None:
            return sum(browser.remove(entry) for entry, _ in list(browser.entries()))
        return sum(browser.remove(entry) for entry, message in self._scan() if message.id in ids)

    def _browser(self) -> QueueBrowser:
        if self.browser is None:
            raise NotSupportedError(
                f"{self.driver!r} cannot list or delete the messages it holds without "
                "taking them: use a file:// or redis:// URL for a store `hermes failed` "
                "can read, or read this one with a worker (`hermes worker --url` on it)"
            )
        return self.browser

    def _scan(self) -> list[tuple[Hashable, FailedMessage]]:
        serializer = self.serializer
        found: list[tuple[Hashable, FailedMessage]] = []
        for entry, body in self._browser().entries():
            try:
                message = serializer.unserialize(body)
            except SerializeError as exc:
                logger.warning("%r holds a body that is not a Hermes message - %s", self, exc)
                continue
            if not isinstance(message, FailedMessage):
                message = FailedMessage.of(message, NO_REASON, message.created)
            found.append((entry, message))
        found.sort(key=lambda pair: pair[1].failed_at)
        return found
