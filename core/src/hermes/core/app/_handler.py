"""Handlers: the protocol, plain functions as handlers, and a registry filled at import time."""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from hermes.core.app._limits import Limit
from hermes.core.model._errors import ConfigurationError, HandlerResultError
from hermes.core.model._message import Message

if TYPE_CHECKING:
    from hermes.core.app._dispatcher import Dispatcher
    from hermes.core.app._schedule import Schedule, on_schedule


@runtime_checkable
class Handler(Protocol):
    """Anything with ``handle(message) -> bool``.

    Raise to fail (a :class:`RetryableHandler` is then retried); returning
    False marks the message failed without a retry.
    """

    def handle(self, message: Message) -> bool: ...


class RetryableHandler(ABC):
    """A handler whose failures are retried by publishing a copy of the message.

    When :meth:`handle` raises, the Dispatcher publishes a copy with
    ``retries + 1`` if ``message.retries < max_retry()`` **and then**
    ``can_retry(message, exception)`` is true. Once ``max_retry()`` is reached,
    ``can_retry`` is not called. Returning False from ``handle`` never retries.
    Mix in :class:`RetryMixin` for the defaults::

        class SendMail(RetryMixin, RetryableHandler):
            def handle(self, message: Message) -> bool: ...
    """

    @abstractmethod
    def handle(self, message: Message) -> bool: ...

    @abstractmethod
    def can_retry(self, message: Message, exception: Exception) -> bool:
        """False skips the retry, e.g. for errors that can never succeed later."""

    @abstractmethod
    def max_retry(self) -> int:
        """How many retries a message may have; 0 disables retrying."""


class RetryMixin:
    """Defaults for :class:`RetryableHandler`: always retry, up to 25 times."""

    def can_retry(self, message: Message, exception: Exception) -> bool:
        return True

    def max_retry(self) -> int:
        return 25


#: A handler's own backoff: the retry number (1 for the first retry) -> seconds to wait.
Backoff = Callable[[int], float]


#: A function run as a handler: it takes the message and returns None or True
#: for success, False for a failure that is not retried; it raises to fail.
HandlerFunction = Callable[[Message], "bool | None"]
#: ``can_retry(message, exception) -> bool`` of a retried function.
CanRetry = Callable[[Message, Exception], bool]

F = TypeVar("F", bound=HandlerFunction)

#: How often a retried function is retried by default: as often as :class:`RetryMixin` allows.
DEFAULT_MAX_RETRY = RetryMixin().max_retry()


class EchoHandler(RetryMixin, RetryableHandler):
    """Prints each message it receives; handy to see a queue work."""

    def handle(self, message: Message) -> bool:
        payload = json.dumps(message.payload, ensure_ascii=False, sort_keys=True)
        print(f"Received message: #{message.id} (type {message.type})", flush=True)
        print(f"Payload: {payload}", flush=True)
        return True


@dataclass(frozen=True, slots=True)
class Result:
    """What a handler returns to keep a value in its job's record: ``return Result(total)``.

    A success, whatever ``value`` is: ``Result(0)``, ``Result([])`` and
    ``Result(False)`` are results, never mistaken for the ``False`` that
    fails a handler. ``value`` is JSON like a payload; with job records on
    (``records=`` / ``--results-url``) it is kept, and
    ``JobHandle.result()`` returns it. A plain None or True stays a success
    whose result is None.
    """

    value: Any


class FunctionHandler:
    """A function run as a handler; what ``register_handler`` makes of a function.

    ``handle(message)`` calls ``function(message)``. None or True is a success,
    False a failure, an exception a failure that is never retried (see
    :class:`RetryableFunctionHandler` for one that is). Any other result
    raises :class:`HandlerResultError` (a coroutine from a plain function that
    wraps an ``async def``, a value returned for a caller Hermes does not
    have), so the mistake shows in the worker's log instead of passing as a
    success. An ``async def`` function's coroutine is handed to the
    Dispatcher, which awaits it on the worker's event loop.

    Its time limit (:attr:`time_limit_s`) is ``time_limit_s`` when given, else
    the function's own ``time_limit_s`` attribute, read at each call.
    """

    def __init__(self, function: HandlerFunction, *, time_limit_s: float | None = None) -> None:
        check_handler_function(function)
        #: The function this handler calls.
        self.function = function
        #: ``module.qualname`` of the function, for logs.
        self.name = function_name(function)
        if time_limit_s is not None:
            _check_time_limit(time_limit_s, self.name)
        self._time_limit_s = time_limit_s
        #: ``async def``: :meth:`handle` returns a coroutine the Dispatcher awaits.
        self.is_async = inspect.iscoroutinefunction(function)

    @property
    def time_limit_s(self) -> float | None:
        """Longest a call may run before it is interrupted; None: the Dispatcher's limit.

        ``time_limit_s=`` given at registration, else the function's own
        ``time_limit_s`` attribute (set on it before or after registering).
        """
        if self._time_limit_s is not None:
            return self._time_limit_s
        limit: float | None = getattr(self.function, "time_limit_s", None)
        return limit

    def handle(self, message: Message) -> Any:
        result = self.function(message)
        if self.is_async:
            return self._checked_later(result)
        return self._checked(result)

    async def _checked_later(self, coroutine: Any) -> bool | Result:
        return self._checked(await coroutine)

    def _checked(self, result: object) -> bool | Result:
        if result is None or result is True or result is False:
            return result is not False
        if isinstance(result, Result):
            return result
        if inspect.iscoroutine(result):
            result.close()  # never awaited: closing it spares a second, vaguer warning
        raise HandlerResultError(
            f"handler function {self.name} returned {type(result).__name__} {_short(result)}; "
            "a handler function returns None or True for success, False for failure, "
            "or Result(value) for a success with a value"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class RetryableFunctionHandler(FunctionHandler, RetryableHandler):
    """A function run as a handler whose failures are retried like a :class:`RetryableHandler`.

    When the function raises, a copy of the message is published if
    ``message.retries < max_retry`` **and then** ``can_retry(message, exception)``
    is true (always, when ``can_retry`` is None). ``max_retry=0`` disables
    retrying; returning False never retries. A :class:`HandlerResultError`
    (a result that is not None, True or False) is never retried.
    """

    def __init__(
        self,
        function: HandlerFunction,
        *,
        max_retry: int = DEFAULT_MAX_RETRY,
        can_retry: CanRetry | None = None,
        backoff: Backoff | float | None = None,
        time_limit_s: float | None = None,
    ) -> None:
        super().__init__(function, time_limit_s=time_limit_s)
        if backoff is not None:
            #: Seconds before retry number N (1 for the first); the Dispatcher calls it.
            self.backoff = _backoff(backoff, self.name)
        if isinstance(max_retry, bool) or not isinstance(max_retry, int) or max_retry < 0:
            raise ConfigurationError(
                f"max_retry of handler function {self.name} must be a whole number >= 0 "
                f"(0 disables retrying), got {max_retry!r}"
            )
        if can_retry is not None:
            _check_signature(
                can_retry,
                2,
                f"can_retry of handler function {self.name}",
                "take (message, exception)",
            )
        self._max_retry = max_retry
        self._can_retry = can_retry

    def max_retry(self) -> int:
        return self._max_retry

    def can_retry(self, message: Message, exception: Exception) -> bool:
        if isinstance(exception, HandlerResultError):
            return False
        return True if self._can_retry is None else bool(self._can_retry(message, exception))


def _check_time_limit(time_limit_s: object, name: str) -> None:
    if (
        isinstance(time_limit_s, bool)
        or not isinstance(time_limit_s, int | float)
        or not time_limit_s > 0
    ):
        raise ConfigurationError(
            f"time_limit_s of handler function {name} must be a number of seconds > 0, "
            f"got {time_limit_s!r}"
        )


def _backoff(backoff: Backoff | float, name: str) -> Backoff:
    """``backoff=`` as a function of the retry number: a number of seconds is the same for all."""
    if isinstance(backoff, int | float) and not isinstance(backoff, bool) and backoff >= 0:
        seconds = float(backoff)
        return lambda retry: seconds
    if not callable(backoff):
        raise ConfigurationError(
            f"backoff of handler function {name} must be a number of seconds >= 0 or a "
            f"function of the retry number returning seconds, got {backoff!r}"
        )
    _check_signature(backoff, 1, f"backoff of handler function {name}", "take the retry number")
    return backoff


def function_handler(
    function: HandlerFunction,
    *,
    max_retry: int | None = None,
    can_retry: CanRetry | None = None,
    backoff: Backoff | float | None = None,
    time_limit_s: float | None = None,
) -> FunctionHandler:
    """``function`` as a handler: retried when ``max_retry``, ``can_retry`` or ``backoff`` is given.

    ``max_retry`` defaults to 25 (as :class:`RetryMixin`) when only
    ``can_retry`` or ``backoff`` is given; without any the function is never
    retried. ``backoff`` -- seconds, or a function of the retry number (1 for
    the first retry) returning seconds -- replaces the Dispatcher's formula.
    ``time_limit_s`` replaces the Dispatcher's time limit for this function.
    """
    if inspect.isclass(function) or callable(getattr(function, "handle", None)):
        what = "is a class" if inspect.isclass(function) else "has a handle() method"
        raise ConfigurationError(
            f"{function!r} {what}: the decorator takes a function; register a handler "
            "object with register_handler(type, handler)"
        )
    if max_retry is None and can_retry is None and backoff is None:
        return FunctionHandler(function, time_limit_s=time_limit_s)
    return RetryableFunctionHandler(
        function,
        max_retry=DEFAULT_MAX_RETRY if max_retry is None else max_retry,
        can_retry=can_retry,
        backoff=backoff,
        time_limit_s=time_limit_s,
    )


def as_handler(handler: object, message_type: str) -> Handler:
    """``handler`` ready to register for ``message_type``: a handler object, or a wrapped function.

    Raises :class:`ConfigurationError` naming the mistake (a class instead of an
    instance, an async generator, a function that cannot take the message).
    """
    if inspect.isclass(handler):
        name = handler.__qualname__
        raise ConfigurationError(
            f"handler {name} for type {message_type!r} is a class: register an instance, {name}()"
        )
    if callable(getattr(handler, "handle", None)):
        return handler  # type: ignore[return-value]
    if callable(handler):
        try:
            return FunctionHandler(handler)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{exc} (registering it for type {message_type!r})") from None
    raise ConfigurationError(
        f"handler {handler!r} for type {message_type!r} is neither a function taking the "
        "message nor an object with a handle(message) method"
    )


def check_handler_function(function: object) -> None:
    """Refuse what cannot be called as ``function(message)`` once per message."""
    name = function_name(function)
    if not callable(function):
        raise ConfigurationError(f"{function!r} is not a function")
    if inspect.isasyncgenfunction(function):
        raise ConfigurationError(
            f"handler function {name} is an async generator; a handler returns once: "
            "write async def ... return True"
        )
    _check_signature(function, 1, f"handler function {name}", "take the message as its argument")


def _check_signature(function: Callable[..., object], count: int, what: str, must: str) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # some builtins have no signature to read; a wrong call fails when it is made
    try:
        signature.bind(*([None] * count))
    except TypeError:
        raise ConfigurationError(f"{what} must {must}, but its signature is {signature}") from None


def function_name(function: object) -> str:
    """``module.qualname`` of a function, else its repr."""
    qualname = getattr(function, "__qualname__", None)
    if not isinstance(qualname, str):
        return repr(function)
    module = getattr(function, "__module__", None)
    return f"{module}.{qualname}" if module else qualname


def handler_name(handler: object) -> str:
    """What logs call a handler: the function's name for a function, else the class name."""
    if isinstance(handler, FunctionHandler):
        return handler.name
    return type(handler).__name__


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _ScheduleMethod:
    """A method of :class:`Schedule` on a registry, built when first looked up.

    The first lookup replaces this descriptor on the class with the method
    itself (``on_schedule(Schedule.<name>)``), signature and docstring included.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type) -> Any:
        from hermes.core.app._schedule import Schedule, on_schedule

        method = on_schedule(getattr(Schedule, self.name))
        setattr(owner, self.name, method)
        return method if instance is None else method.__get__(instance, owner)


class HandlerRegistry:
    """Handlers collected when a module is imported, registered on a Dispatcher later.

    What ``hermes worker --handlers module:registry`` loads; it needs no
    Dispatcher (nor a broker connection) at import time::

        handlers = HandlerRegistry()

        @handlers.handler("send-email", max_retry=5)
        def send_email(message: Message) -> None: ...

    ``registry.register(dispatcher)`` registers everything on a Dispatcher, in
    the order it was collected.
    """

    def __init__(self) -> None:
        self._entries: list[tuple[str, Handler]] = []
        #: Type -> the limit declared for it.
        self.limits: dict[str, Limit] = {}

    def handler(
        self,
        type: str,
        *,
        max_retry: int | None = None,
        can_retry: CanRetry | None = None,
        backoff: Backoff | float | None = None,
        time_limit_s: float | None = None,
        limit: Limit | None = None,
    ) -> Callable[[F], F]:
        """Decorator: collect the function as a handler of ``type``; the function is unchanged.

        ``max_retry`` and ``can_retry`` retry it as :class:`RetryableFunctionHandler`;
        ``backoff`` (seconds, or a function of the retry number) sets when;
        ``time_limit_s`` replaces the worker's time limit for this function;
        ``limit`` holds the type to a :class:`~hermes.core.Limit` (see :meth:`limit`).
        """
        if limit is not None:
            self.limit(type, limit)

        def collect(function: F) -> F:
            handler = function_handler(
                function,
                max_retry=max_retry,
                can_retry=can_retry,
                backoff=backoff,
                time_limit_s=time_limit_s,
            )
            self._entries.append((type, handler))
            return function

        return collect

    def register_handler(self, type: str, handler: Handler | HandlerFunction) -> HandlerRegistry:
        """Collect ``handler`` (an object with ``handle`` or a function) for ``type``."""
        self._entries.append((type, as_handler(handler, type)))
        return self

    def limit(self, type: str, limit: Limit) -> HandlerRegistry:
        """Hold every job of ``type`` to ``limit`` fleet-wide (see ``Dispatcher.limit``)."""
        if not isinstance(limit, Limit):
            raise ConfigurationError(f"limit of {type!r} must be a Limit, got {limit!r}")
        self.limits[type] = limit
        return self

    def register(self, dispatcher: Dispatcher) -> Dispatcher:
        """Register every collected handler and limit on ``dispatcher``; returns the dispatcher."""
        for type, handler in self._entries:
            dispatcher.register_handler(type, handler)
        for type, limit in self.limits.items():
            dispatcher.limit(type, limit)
        return dispatcher

    def registered(self) -> dict[str, list[Handler]]:
        """Every type -> its handlers, both in the order they were collected."""
        result: dict[str, list[Handler]] = {}
        for type, handler in self._entries:
            result.setdefault(type, []).append(handler)
        return result

    def __repr__(self) -> str:
        types = ", ".join(self.registered()) or "nothing"
        return f"<HandlerRegistry {types}>"

    # Periodic entries, declared beside the handlers they feed -----------------

    @property
    def schedule(self) -> Schedule:
        """The periodic entries declared with :meth:`every` and :meth:`cron`.

        ``hermes scheduler --handlers module:registry`` and ``hermes worker
        --scheduler`` run them.
        """
        schedule: Schedule | None = self.__dict__.get("_schedule")
        if schedule is None:
            from hermes.core.app._schedule import Schedule

            schedule = self.__dict__["_schedule"] = Schedule()
        return schedule

    if TYPE_CHECKING:
        every = on_schedule(Schedule.every)
        cron = on_schedule(Schedule.cron)
    else:
        # Made on first use: a worker whose handlers declare no periodic entry
        # never imports the schedule's cron parser and calendar arithmetic.
        #: :meth:`Schedule.every`: emit a message type every interval.
        every = _ScheduleMethod("every")
        #: :meth:`Schedule.cron`: emit a message type on each tick of a cron expression.
        cron = _ScheduleMethod("cron")
