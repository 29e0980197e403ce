"""Core's one door to a driver: messages serialized and size-checked once, errors translated once.

A driver implements :meth:`~hermes.core.driver.Driver.put`, its consumer and
what optional features it offers (``SupportsStats``, ``SupportsClaim``, a
queue browser...), and raises its client library's own exceptions from all of
them. It declares which of those mean what (``refused_errors``,
``unavailable_errors``, ``client_errors``, ``classify_error``); core turns
them into Hermes errors, with a line saying what was being done, at the one
place it calls in: a :class:`Door` for sends and optional features, the
Worker around a consumer's calls, and the :class:`~hermes.core.drivertools.LeaseKeeper`
and :class:`~hermes.core.drivertools.Handover` around what they run for a driver.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from functools import wraps
from types import GeneratorType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

from hermes.core.model._errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    DeliveryError,
    DriverError,
    HermesError,
    error_text,
)
from hermes.core.model._message import Message
from hermes.core.spi._outgoing import Outgoing, outgoing

if TYPE_CHECKING:
    from hermes.core.spi._driver import Driver

T = TypeVar("T")

#: ``put(items, priority)``: what :meth:`Door.send` hands the serialized messages to.
Put = Callable[[Sequence[Outgoing], int], None]

#: What each feature method does, for the line of an error raised inside it.
#: A method not listed here is described by its name.
_DOING: dict[str, str] = {
    "queue_stats": "counting its queues",
    "purge": "deleting what waits",
    "teardown": "deleting its queues",
    "find_priority_queues": "listing its queues",
    "claim": "claiming {0!r}",
    "beat": "publishing a heartbeat",
    "forget": "removing a heartbeat",
    "heartbeats": "listing heartbeats",
    "entries": "listing what waits",
    "page": "listing a page of what waits",
    "remove": "deleting a waiting message",
}


class Door:
    """The one object core calls a driver through, outside a worker's consumer.

    :meth:`send` serializes, checks each body against the driver's
    ``max_message_bytes`` and translates the broker's errors, once for every
    way a message leaves (an emit, a retry, a workflow step, a driver's own
    transactional send). ``door.feature(SupportsStats)`` is the driver seen
    as that protocol with each call translated, or None where the driver does
    not implement it. :meth:`wrap` translates an object a driver handed out (a queue
    browser), :meth:`call` one call core makes on a driver's own method.
    """

    __slots__ = ("driver",)

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    # Sending ------------------------------------------------------------------

    def send(self, messages: Sequence[Message], priority: int, put: Put | None = None) -> None:
        """Serialize ``messages``, check their sizes, then one ``put`` (the driver's by default).

        A :class:`SerializeError`, or a body over ``capabilities.max_message_bytes``
        (a :class:`DeliveryError` naming its size and the limit), refuses the
        whole batch before any I/O. The broker's errors arrive translated,
        a failure of the client as :class:`DeliveryError`.
        """
        items = self.serialized(messages)
        if not items:
            return
        try:
            (put or self.driver.put)(items, priority)
        except Exception as exc:
            # The description is built only when something failed.
            doing = (
                f"sending message #{items[0].message_id}"
                if len(items) == 1
                else f"sending {len(items)} messages"
            )
            reraise(self.driver, exc, doing, DeliveryError)

    def serialized(self, messages: Sequence[Message]) -> list[Outgoing]:
        """``messages`` serialized, each checked against the driver's ``max_message_bytes``.

        Raises :class:`SerializeError`, or :class:`DeliveryError` naming the
        size and the limit, before anything reaches the broker.
        """
        items = [outgoing(message) for message in messages]
        limit = self.driver.capabilities.max_message_bytes
        for item in items:
            # Once here rather than in every driver: a body the driver does not
            # promise to carry is refused before any I/O, never cut or dropped by
            # the broker later.
            if len(item.body) > limit:
                raise DeliveryError(
                    f"{self.driver!r}: message #{item.message_id} is {len(item.body)} bytes "
                    f"serialized, over this driver's max_message_bytes of {limit}; nothing was sent"
                )
        return items

    def send_raw(self, body: bytes, priority: int) -> None:
        """Put ``body`` on the broker as it is (the kit's poison, a copy of PHP's bytes).

        Not held to ``max_message_bytes``: the bytes go to ``put`` unchecked.
        """
        with translate_errors(self.driver, "sending a raw body", DeliveryError):
            self.driver.put((Outgoing(bytes(body)),), priority)

    # Optional features --------------------------------------------------------

    def feature(self, kind: Callable[..., T]) -> T | None:
        """The driver as ``kind`` (a runtime-checkable protocol), or None when it is not one."""
        # Typed as a callable: a type checker refuses a protocol where a concrete type is due.
        if not isinstance(self.driver, cast(type, kind)):
            return None
        return cast(T, _Translated(self.driver, self.driver))

    def wrap(self, target: T) -> T:
        """``target`` (the driver or an object it made) with every method call translated."""
        return cast(T, _Translated(self.driver, target))

    def call(self, doing: str, method: Callable[..., T], *args: Any) -> T:
        """``method(*args)``, a driver's own method, with its errors translated."""
        with translate_errors(self.driver, doing, DriverError):
            return method(*args)

    def __repr__(self) -> str:
        return f"Door({self.driver!r})"


class _Translated:
    """Proxies ``target``: its methods raise Hermes errors, with what they were doing."""

    __slots__ = ("_driver", "_methods", "_target")

    def __init__(self, driver: Driver, target: object) -> None:
        self._driver = driver
        self._target = target
        self._methods: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._target, name)
        if not callable(found) or name.startswith("__"):
            return found
        method = self._methods.get(name)
        if method is None:
            method = self._methods[name] = _translating(self._driver, name, found)
        return method

    def __repr__(self) -> str:
        return repr(self._target)


def _translating(driver: Driver, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    pattern = _DOING.get(name)

    @wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            result = method(*args, **kwargs)
        except Exception as exc:
            reraise(driver, exc, _describe(pattern, name, args))
        if isinstance(result, GeneratorType):  # a listing that reads as it is iterated
            return _iterate(driver, result, pattern, name, args)
        return result

    return call


def _iterate(
    driver: Driver, found: Iterator[Any], pattern: str | None, name: str, args: tuple[Any, ...]
) -> Iterator[Any]:
    try:
        yield from found
    except Exception as exc:
        reraise(driver, exc, _describe(pattern, name, args))


def _describe(pattern: str | None, name: str, args: tuple[Any, ...]) -> str:
    if pattern is None:
        return f"calling {name}()"
    try:
        return pattern.format(*args)
    except IndexError:  # called without the argument the description names
        return pattern.split(" {", 1)[0]


# Translation ------------------------------------------------------------------


@contextlib.contextmanager
def translate_errors(
    driver: Driver, doing: str, failed: type[DriverError] = DriverError
) -> Iterator[None]:
    """A block in which the client exceptions of ``driver`` become Hermes errors."""
    try:
        yield
    except Exception as exc:
        reraise(driver, exc, doing, failed)


def reraise(
    driver: Driver, exc: Exception, doing: str, failed: type[DriverError] = DriverError
) -> NoReturn:
    """Raise the Hermes error the client's ``exc`` means, from it; ``exc`` itself when not the
    client's (a Hermes error, a bug). Called in the ``except`` block that caught ``exc``."""
    error = translated(driver, exc, doing, failed)
    if error is None or error is exc:
        raise exc
    raise error from exc


def translated(
    driver: Driver, exc: BaseException, doing: str, failed: type[DriverError] = DriverError
) -> DriverError | None:
    """The Hermes error for the client's ``exc`` (not yet raised); None when not the client's.

    Refused and unavailable keep their meaning; any other declared client
    error becomes ``failed``. Hermes's own driver errors come back as they are.
    For a hot path (a settle per message) that catches the exception itself
    instead of entering a context manager on every call.
    """
    if isinstance(exc, HermesError):
        return exc if isinstance(exc, DriverError) else None
    kind = driver.classify_error(exc)
    if kind is None:
        return None
    if kind is DriverError:
        kind = failed
    text = f"{driver!r}: {_verb(kind)} while {doing}: {error_text(exc)}"
    if kind is BrokerRefusedError:
        text += "; check the URL's credentials, database or vhost, TLS certificates and permissions"
    return kind(text)


def _verb(kind: type[DriverError]) -> str:
    if issubclass(kind, BrokerRefusedError):
        return "refused"
    if issubclass(kind, BrokerUnavailableError):
        return "unavailable"
    return "failed"
