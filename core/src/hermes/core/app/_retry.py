"""The retry policy: when a failed handler's message is published again, and when it runs."""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hermes.core.app._handler import FunctionHandler, RetryableHandler, handler_name
from hermes.core.model._message import Message


class Randomizer(Protocol):
    """What the Dispatcher needs of a random source: ``random.Random`` and ``SystemRandom`` fit."""

    def randint(self, a: int, b: int) -> int: ...


_legacy_warned: set[type] = set()
_legacy_lock = threading.Lock()


def _warn_legacy(handler_class: type, logger: logging.Logger) -> None:
    with _legacy_lock:
        if handler_class in _legacy_warned:
            return
        _legacy_warned.add(handler_class)
    name = f"{handler_class.__module__}.{handler_class.__qualname__}"
    text = (
        f"Handler {name} is retried by the 5.x rule (retries < max_retry(); can_retry() is "
        "not called) because it has can_retry() and max_retry() but does not subclass "
        "hermes.core.RetryableHandler. Subclass RetryableHandler and give can_retry the "
        "(message, exception) signature; the 5.x rule is removed in 7.0."
    )
    logger.warning(text, extra={"handler": handler_class})
    warnings.warn(text, DeprecationWarning, stacklevel=4)


@dataclass(frozen=True, slots=True)
class RetryVerdict:
    """Whether a handler's failure publishes a retry copy, and if not, why not."""

    #: Why no copy is published, as the Dispatcher logs it; None when one is.
    refused: str | None
    #: The handler's ``max_retry()``; None when it has none.
    max_retry: int | None = None


def _used_up(retries: int, limit: int) -> str:
    if limit <= 0:
        return "retries are off (max_retry() is 0)"
    text = f"gave up after {retries} {'retry' if retries == 1 else 'retries'}"
    return text if retries == limit else f"{text} (max_retry() is {limit})"


def judge_retry(
    handler: object, message: Message, exception: Exception, logger: logging.Logger
) -> RetryVerdict:
    """Whether ``handler``'s failure on ``message`` publishes a retry copy, and why not.

    A :class:`RetryableHandler` is retried while ``message.retries <
    max_retry()`` and then only if ``can_retry(message, exception)``; a 5.x
    handler (both methods, no base class) while ``retries < max_retry()``;
    any other handler never.
    """
    if isinstance(handler, RetryableHandler):
        limit = int(handler.max_retry())
        if message.retries >= limit:
            return RetryVerdict(_used_up(message.retries, limit), limit)
        if not handler.can_retry(message, exception):
            return RetryVerdict("can_retry() said no", limit)
        return RetryVerdict(None, limit)
    can_retry = getattr(handler, "can_retry", None)
    max_retry = getattr(handler, "max_retry", None)
    if callable(can_retry) and callable(max_retry):
        _warn_legacy(type(handler), logger)
        limit = int(max_retry())
        if message.retries >= limit:
            return RetryVerdict(_used_up(message.retries, limit), limit)
        return RetryVerdict(None, limit)
    if isinstance(handler, FunctionHandler):
        # A function is made retryable by its decorator, not by a base class.
        return RetryVerdict(
            "the function has no max_retry (give it one, "
            f"@handler({message.type!r}, max_retry=25), to retry it when it raises)"
        )
    return RetryVerdict(
        f"{handler_name(handler)} is not a RetryableHandler "
        "(subclass RetryableHandler with RetryMixin to retry it when it raises)"
    )


def next_retry(message: Message, randomizer: Randomizer, now: float | None = None) -> float:
    """When the retry of ``message`` may run: ``now + r**4 + 15 + randint(1, 30) * (r + 1)``.

    ``r`` is ``message.retries`` before the increment: r=0 gives 16..45 s,
    r=1 18..76 s, r=2 34..121 s.
    """
    r = message.retries
    now = time.time() if now is None else now
    return now + r**4 + 15 + randomizer.randint(1, 30) * (r + 1)


def default_randomizer() -> Randomizer:
    import random  # when a dispatcher first needs it: most workers never retry

    return random.SystemRandom()


def retry_at(
    handler: object,
    message: Message,
    default: Callable[[Message], float],
    logger: logging.Logger,
) -> float:
    """When the retry copy of ``message`` after ``handler`` failed is due.

    ``handler.backoff(retry)`` -- a method of a class handler, or the
    ``backoff=`` of a decorated function -- gives the seconds to wait for
    retry number ``retry`` (``message.retries + 1``); without one, ``default``
    (the Dispatcher's :meth:`next_retry`, the Sidekiq formula). A backoff that
    raises or gives no number of seconds >= 0 is logged and ``default`` is used:
    it must not cost the retry.
    """
    backoff = getattr(handler, "backoff", None)
    if not callable(backoff):
        return default(message)
    retry = message.retries + 1
    try:
        seconds = float(backoff(retry))
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"it gave {seconds!r}, not a number of seconds >= 0")
    except Exception as exc:
        logger.error(
            "Handler %s backoff raised %s: %s for retry %d; the default backoff is used",
            handler_name(handler),
            type(exc).__name__,
            exc,
            retry,
        )
        return default(message)
    return time.time() + seconds


def describe_due(due: float, delivers_at_once: bool) -> str:
    """``in 20.0 s at 12:00:20``, or, on a driver that ignores ``execute_at``, that it runs now.

    A retry's log line must not promise a wait the broker will not keep.
    """
    if delivers_at_once:
        return (
            f"at once: the driver delivers at once (delay ignored); the copy keeps its "
            f"execute_at {readable_time(due)}"
        )
    return f"in {max(0.0, due - time.time()):.1f} s at {readable_time(due)}"


def readable_time(timestamp: float) -> str:
    """A UNIX timestamp as local ``HH:MM:SS``, with the date in front when it is not today."""
    moment = time.localtime(timestamp)
    if moment[:3] == time.localtime()[:3]:
        return time.strftime("%H:%M:%S", moment)
    return time.strftime("%Y-%m-%d %H:%M:%S", moment)
