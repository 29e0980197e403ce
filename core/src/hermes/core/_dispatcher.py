from __future__ import annotations

import contextlib
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType

from hermes.core._driver import Driver
from hermes.core._errors import ConfigurationError
from hermes.core._handler import (
    CanRetry,
    F,
    FunctionHandler,
    Handler,
    HandlerFunction,
    as_handler,
    function_handler,
)
from hermes.core._invoke import EventLoopThread, TimeLimitExceeded, Watchdog
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
        *,
        concurrency: int = 1,
        time_limit_s: float | None = None,
        grace_s: float = 30.0,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be an int >= 1, got {concurrency!r}")
        if time_limit_s is not None and not time_limit_s > 0:
            raise ConfigurationError(f"time_limit_s must be > 0 seconds, got {time_limit_s!r}")
        if not grace_s >= 0:
            raise ConfigurationError(f"grace_s must be >= 0 seconds, got {grace_s!r}")
        #: Handlers run at once: threads fed by one receiving loop.
        self.concurrency = concurrency
        #: Longest a handler may run before it is interrupted (None: no limit). A
        #: handler's own ``time_limit_s`` attribute overrides it.
        self.time_limit_s = time_limit_s
        #: On shutdown, how long handlers in flight get to finish.
        self.grace_s = grace_s
        self._watchdog = Watchdog()
        self._event_loop = EventLoopThread()
        self._count_lock = threading.Lock()
        self.driver = driver
        self.logger = logger or logging.getLogger("hermes")
        self.shutdown = shutdown
        self.randomizer = randomizer if randomizer is not None else default_randomizer()
        self.stats = DispatcherStats()
        self._handlers: dict[str, list[Handler]] = {}
        self._hooks = plugin_manager().hook

    # Registration ------------------------------------------------------------

    def register_handler(self, type: str, handler: Handler | HandlerFunction) -> Dispatcher:
        """Call ``handler`` for every message of ``type``, after those registered before it.

        ``handler`` is an object with ``handle(message)``, or a function taking
        the message (it becomes a :class:`FunctionHandler`: None or True is a
        success, False a failure, and it is never retried; see :meth:`handler`
        for a retried one). A class, an ``async def`` or a function that cannot
        take the message raises :class:`ConfigurationError`.
        """
        self._handlers.setdefault(type, []).append(as_handler(handler, type))
        return self

    def register_handlers(
        self, type: str, handlers: Iterable[Handler | HandlerFunction]
    ) -> Dispatcher:
        for handler in handlers:
            self.register_handler(type, handler)
        return self

    def handler(
        self, type: str, *, max_retry: int | None = None, can_retry: CanRetry | None = None
    ) -> Callable[[F], F]:
        """Decorator: register the function as a handler of ``type``; the function is unchanged.

        With ``max_retry`` (and optionally ``can_retry(message, exception)``) a
        failure is retried by the rules of :class:`RetryableHandler`: a copy is
        published while ``message.retries < max_retry`` and then only if
        ``can_retry`` agrees; ``max_retry=0`` never retries. ``can_retry``
        alone means ``max_retry=25``. Without either, the function is never retried.
        """

        def register(function: F) -> F:
            handler = function_handler(function, max_retry=max_retry, can_retry=can_retry)
            self.register_handler(type, handler)
            return function

        return register

    def unregister_handler(self, type: str, handler: object) -> Dispatcher:
        """Remove ``handler`` from ``type``: a handler object by identity, a function by equality.

        A function matches the :class:`FunctionHandler` it was registered as (a
        bound method ``obj.method`` is a new object at every access, but equal).
        Unknown handlers are ignored.
        """
        handlers = self._handlers.get(type, [])
        self._handlers[type] = [
            h
            for h in handlers
            if h is not handler and not (isinstance(h, FunctionHandler) and h.function == handler)
        ]
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
                if self.concurrency == 1:
                    self.driver.wait(self.handle_message, priorities)
                else:
                    self.driver.wait(
                        self.handle_message,
                        priorities,
                        concurrency=self.concurrency,
                        grace_s=self.grace_s,
                    )
            except Exception as exc:
                self.logger.error(
                    "Driver %s failed - %s", type(self.driver).__name__, exc, exc_info=True
                )
                raise
            finally:
                self.driver.set_shutdown(previous)
                self._event_loop.close()
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

    def _count(self, name: str) -> None:
        # Handler threads finish at once; a bare ``+=`` could lose a count.
        with self._count_lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def call_handler(self, handler: Handler, message: Message) -> bool:
        """Run one handler on ``message`` within its time limit; what it returned, as a bool.

        ``async def handle`` (or a handle that returns a coroutine) runs on the
        worker's event loop. Over the limit: :class:`TimeLimitExceeded`.
        """
        limit = getattr(handler, "time_limit_s", None)
        if limit is None:
            limit = self.time_limit_s
        handle = handler.handle
        if inspect.iscoroutinefunction(handle):
            return bool(self._event_loop.run(handle(message), limit))
        if limit is None:
            result = handle(message)
        else:
            fired = False
            timer = self._watchdog.arm(limit)
            try:
                try:
                    result = handle(message)
                finally:
                    fired = self._watchdog.disarm(timer)
            except TimeLimitExceeded:
                raise TimeLimitExceeded(f"timed out after {limit:g} s") from None
            if fired:
                raise TimeLimitExceeded(f"timed out after {limit:g} s")
        if inspect.iscoroutine(result):
            result = self._event_loop.run(result, limit)
        return bool(result)

    def handle_message(self, message: Message, priority: int) -> bool:
        """The driver's callback: run every handler of ``message.type``; True if all succeeded."""
        result = self._run_handlers(message, priority)
        notify(
            self._hooks.hermes_message_finished, message=message, priority=priority, result=result
        )
        return result

    def _run_handlers(self, message: Message, priority: int) -> bool:
        self._count("received")
        info = self.logger.isEnabledFor(logging.INFO)
        if info:
            self.logger.info(
                "Start handle message #%s (%s) priority:%s", message.id, message.type, priority
            )
        handlers = self._handlers.get(message.type)
        if not handlers:
            self._count("failed")
            self.logger.warning(
                "No handlers registered for message #%s (%s); dropped", message.id, message.type
            )
            return False
        hooks = self._hooks
        notify(hooks.hermes_message_started, message=message, priority=priority)
        result = True
        for handler in list(handlers):
            try:
                ok = self.call_handler(handler, message)
            except Exception as exc:
                result = False
                self._count("failed")
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
                self._count("handled")
            else:
                self._count("failed")
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
        """When a retry of ``message`` may run: now + r⁴ + 15 + randint(1, 30)·(r+1)."""
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
        self._count("retried")
        self.logger.info(
            "Message #%s (%s) scheduled for retry %d at %.3f",
            retry.id,
            retry.type,
            retry.retries,
            retry.execute_at,
        )
        notify(self._hooks.hermes_message_retried, message=message, retry=retry, handler=handler)
