from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType

from hermes.core._driver import Driver
from hermes.core._errors import ConfigurationError
from hermes.core._handler import Handler
from hermes.core._message import Message
from hermes.core._registry import notify, plugin_manager
from hermes.core._retry import Randomizer, default_randomizer, next_retry, should_retry
from hermes.core._shutdown import Shutdown

#: Between WARNING and INFO: PSR-3's NOTICE, used for "Exiting hermes dispatcher".
NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")


@dataclass
class DispatcherStats:
    """What one Dispatcher did, counted per handler call."""

    #: Messages received from the driver.
    received: int = 0
    #: Handler calls that returned True.
    handled: int = 0
    #: Handler calls that raised or returned False, and messages with no handler.
    failed: int = 0
    #: Retry copies published.
    retried: int = 0


class _StopRequest:
    """The Shutdown the driver sees: the user's one, or a SIGTERM/SIGINT received."""

    def __init__(self, user: Shutdown | None) -> None:
        self.user = user
        self.signalled: int | None = None

    def should_shutdown(self, start_time: float) -> bool:
        if self.signalled is not None:
            return True
        return self.user is not None and self.user.should_shutdown(start_time)

    def shutdown(self, at: float | None = None) -> bool:
        return self.user.shutdown(at) if self.user is not None else False


class Dispatcher:
    """Waits on a driver and calls the handlers registered for each message's type.

    ``randomizer`` (``random.Random(42)`` for a reproducible sequence) feeds the
    jitter of :meth:`next_retry`; it defaults to ``random.SystemRandom()``.
    """

    def __init__(
        self,
        driver: Driver,
        logger: logging.Logger | None = None,
        shutdown: Shutdown | None = None,
        randomizer: Randomizer | None = None,
    ) -> None:
        self.driver = driver
        self.logger = logger or logging.getLogger("hermes")
        self.shutdown = shutdown
        self.randomizer = randomizer if randomizer is not None else default_randomizer()
        self.stats = DispatcherStats()
        #: Log the INFO lines ``Start handle message`` / ``End handle message`` for every
        #: message. ``hermes worker`` turns them off unless ``-v``: two log lines per
        #: message take a large share of a busy worker's time.
        self.log_each_message = True
        self._handlers: dict[str, list[Handler]] = {}
        self._hooks = plugin_manager().hook

    # Registration ------------------------------------------------------------

    def register_handler(self, type: str, handler: Handler) -> Dispatcher:
        if not callable(getattr(handler, "handle", None)):
            raise ConfigurationError(
                f"handler {handler!r} for type {type!r} has no handle(message) method"
            )
        self._handlers.setdefault(type, []).append(handler)
        return self

    def register_handlers(self, type: str, handlers: Iterable[Handler]) -> Dispatcher:
        for handler in handlers:
            self.register_handler(type, handler)
        return self

    def unregister_handler(self, type: str, handler: Handler) -> Dispatcher:
        """Remove ``handler`` (by identity) from ``type``; unknown handlers are ignored."""
        handlers = self._handlers.get(type, [])
        self._handlers[type] = [h for h in handlers if h is not handler]
        if not self._handlers[type]:
            del self._handlers[type]
        return self

    def unregister_all_handlers(self) -> Dispatcher:
        self._handlers.clear()
        return self

    def handlers(self, type: str) -> list[Handler]:
        """The handlers registered for ``type``, in registration order."""
        return list(self._handlers.get(type, ()))

    def registered(self) -> dict[str, list[Handler]]:
        """Every type that has handlers -> its handlers, both in registration order."""
        return {type: list(handlers) for type, handlers in self._handlers.items()}

    # Running -----------------------------------------------------------------

    def handle(self, priorities: Sequence[int] = ()) -> None:
        """Handle messages until shutdown, max items, SIGTERM or SIGINT.

        ``priorities`` restricts this worker to those priority queues. A driver
        failure is logged with its cause and raised.
        """
        # A Shutdown set on the driver itself (PHP's ``$driver->setShutdown()``) still
        # counts when the Dispatcher was given none.
        previous = self.driver.shutdown
        stop = _StopRequest(self.shutdown if self.shutdown is not None else previous)
        self.driver.set_shutdown(stop)
        self.driver.start_time = time.time()
        with self._graceful_signals(stop):
            try:
                self.driver.wait(self.handle_message, priorities)
            except Exception as exc:
                self.logger.error(
                    "Driver %s failed - %s", type(self.driver).__name__, exc, exc_info=True
                )
                raise
            finally:
                self.driver.set_shutdown(previous)
        if stop.should_shutdown(self.driver.start_time):
            self.logger.log(NOTICE, "Exiting hermes dispatcher - shutdown")

    @contextlib.contextmanager
    def _graceful_signals(self, stop: _StopRequest) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if stop.signalled is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C does not wait for the handler
            stop.signalled = signum
            self.logger.log(
                NOTICE,
                "Received %s, stopping after the message in progress",
                signal.Signals(signum).name,
            )

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_message(self, message: Message, priority: int) -> bool:
        """The driver's callback: run every handler of ``message.type``; True if all succeeded."""
        self.stats.received += 1
        info = self.log_each_message and self.logger.isEnabledFor(logging.INFO)
        if info:
            self.logger.info(
                "Start handle message #%s (%s) priority:%s", message.id, message.type, priority
            )
        handlers = self._handlers.get(message.type)
        if not handlers:
            self.stats.failed += 1
            self.logger.warning(
                "No handlers registered for message #%s (%s); dropped", message.id, message.type
            )
            return False
        hooks = self._hooks
        notify(hooks.hermes_message_started, message=message, priority=priority)
        result = True
        for handler in list(handlers):
            try:
                ok = bool(handler.handle(message))
            except Exception as exc:
                result = False
                self.stats.failed += 1
                self.logger.error(
                    "Handler %s throws exception - %s", type(handler).__name__, exc, exc_info=True
                )
                notify(
                    hooks.hermes_message_failed,
                    message=message,
                    priority=priority,
                    handler=handler,
                    exception=exc,
                )
                if self._should_retry(handler, message, exc):
                    self._retry(message, handler)
                continue
            if info:
                self.logger.info("End handle message #%s (%s)", message.id, message.type)
            if ok:
                self.stats.handled += 1
            else:
                self.stats.failed += 1
                result = False
            notify(
                hooks.hermes_message_succeeded,
                message=message,
                priority=priority,
                handler=handler,
                result=ok,
            )
        return result

    def next_retry(self, message: Message) -> float:
        """When a retry of ``message`` may run (SPEC §5): now + r⁴ + 15 + randint(1, 30)·(r+1)."""
        return next_retry(message, self.randomizer)

    def _should_retry(self, handler: Handler, message: Message, exc: Exception) -> bool:
        try:
            return should_retry(handler, message, exc, self.logger)
        except Exception as policy_exc:
            # can_retry()/max_retry() are user code too: their failure must not
            # kill the worker (and bring the same message back to kill the next).
            self.logger.error(
                "Handler %s retry policy throws exception - %s; message #%s is not retried",
                type(handler).__name__,
                policy_exc,
                message.id,
                exc_info=True,
            )
            return False

    def _retry(self, message: Message, handler: Handler) -> None:
        retry = message.replace(retries=message.retries + 1, execute_at=self.next_retry(message))
        # No priority: the copy lands on the default priority queue, as in PHP Hermes.
        self.driver.send(retry)
        self.stats.retried += 1
        self.logger.info(
            "Message #%s (%s) scheduled for retry %d at %.3f",
            retry.id,
            retry.type,
            retry.retries,
            retry.execute_at,
        )
        notify(self._hooks.hermes_message_retried, message=message, retry=retry, handler=handler)
