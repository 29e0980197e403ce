"""The retry policy: when a failed handler's message is published again, and when it runs."""

from __future__ import annotations

import logging
import random
import threading
import time
import warnings
from abc import ABC, abstractmethod
from typing import Protocol

from hermes.core._message import Message


class Randomizer(Protocol):
    """What the Dispatcher needs of a random source: ``random.Random`` and ``SystemRandom`` fit."""

    def randint(self, a: int, b: int) -> int: ...


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


def should_retry(
    handler: object, message: Message, exception: Exception, logger: logging.Logger
) -> bool:
    """Whether ``handler``'s failure on ``message`` publishes a retry copy."""
    if isinstance(handler, RetryableHandler):
        if message.retries >= handler.max_retry():
            return False
        return bool(handler.can_retry(message, exception))
    can_retry = getattr(handler, "can_retry", None)
    max_retry = getattr(handler, "max_retry", None)
    if callable(can_retry) and callable(max_retry):
        _warn_legacy(type(handler), logger)
        return message.retries < int(max_retry())
    return False


def next_retry(message: Message, randomizer: Randomizer, now: float | None = None) -> float:
    """When the retry of ``message`` may run: ``now + r**4 + 15 + randint(1, 30) * (r + 1)``.

    ``r`` is ``message.retries`` before the increment: r=0 gives 16..45 s,
    r=1 18..76 s, r=2 34..121 s.
    """
    r = message.retries
    now = time.time() if now is None else now
    return now + r**4 + 15 + randomizer.randint(1, 30) * (r + 1)


def default_randomizer() -> Randomizer:
    return random.SystemRandom()
