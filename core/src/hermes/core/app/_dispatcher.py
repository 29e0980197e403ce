from __future__ import annotations

import contextlib
import enum
import inspect
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from hermes.core.app._failed import ExceptionRecord, FailedStore
from hermes.core.app._handler import (
    Backoff,
    CanRetry,
    F,
    FunctionHandler,
    Handler,
    HandlerFunction,
    Result,
    as_handler,
    function_handler,
    handler_name,
)
from hermes.core.app._invoke import Awaiting, EventLoopThread, TimeLimitExceeded, Watchdog
from hermes.core.app._jobs import (
    EXPIRES_HEADER,
    WORKFLOW_HEADER,
    JobError,
    JobRecord,
    Jobs,
    JobState,
)
from hermes.core.app._limits import LIMIT_HEADER, Deferred, Limit, Limiter
from hermes.core.app._retry import (
    Randomizer,
    RetryVerdict,
    default_randomizer,
    describe_due,
    judge_retry,
    next_retry,
    readable_time,
    retry_at,
)
from hermes.core.app._watch import RecordWatch, RunningJob, entering, leaving, watched_job
from hermes.core.model._errors import BrokerUnavailableError, ConfigurationError
from hermes.core.model._message import Message
from hermes.core.spi._door import translate_errors
from hermes.core.spi._driver import DEFAULT_PRIORITY, Delay, Delivery, Driver, SupportsHeartbeats
from hermes.core.spi._registry import enter_calls, exit_calls, notify, plugin_manager
from hermes.core.spi._shutdown import Shutdown

if TYPE_CHECKING:
    from hermes.core.app._workflows import Workflows

#: When a workflow step's bookkeeping failed, its message comes back this much later.
STEP_AGAIN_S = 5.0


class Outcome(enum.Enum):
    """How a message's handling ended: one code per handler, and one per message.

    Passed to the ``hermes_message_finished`` hook beside the log sentence, so
    a plugin never parses log text. A message's outcome is SUCCEEDED when
    every handler succeeded, else the outcome of its first handler that did not.
    """

    #: The handler returned None or True.
    SUCCEEDED = "succeeded"
    #: The handler returned False: a failure that is never retried.
    RETURNED_FALSE = "returned_false"
    #: The handler raised, and a retry copy was sent.
    RETRIED = "retried"
    #: The handler raised and its retries are used up (or ``can_retry`` said no,
    #: or its retry policy raised).
    GAVE_UP = "gave_up"
    #: The handler raised and is not retried at all (no ``max_retry``).
    NOT_RETRYABLE = "not_retryable"
    #: The handler ran past its time limit (retried or not: the ``retried`` hook says).
    TIME_LIMIT = "time_limit"
    #: No handler is registered for the message's type.
    NO_HANDLER = "no_handler"
    #: A cancel arrived while it ran and its handler stopped (or had not started):
    #: not retried, not kept in the failed-message store.
    CANCELLED = "cancelled"


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
    #: Failures that ended without a retry (returned False, not retried, no handler).
    gave_up: int = 0
    #: Messages sent to the failed-message store.
    stored: int = 0
    #: Messages acknowledged without a handler call: cancelled, or expired before they started.
    skipped: int = 0
    #: Messages whose handler a cancel stopped while it ran.
    cancelled: int = 0
    #: Messages over their type's limit, sent again for their turn (not run, not retried).
    deferred: int = 0


class Dispatcher:
    """Waits on a driver and calls the handlers registered for each message's type.

    ``randomizer`` (``random.Random(42)`` for a reproducible sequence) feeds the
    jitter of :meth:`next_retry`; it defaults to ``random.SystemRandom()``.

    ``failed`` -- a driver (``connect(url)``) or a :class:`FailedStore` -- turns
    on the failed-message store: a message whose handler gave up (returned
    False, or raised and is not retried) or that has no handler is sent there
    once, after its last handler, with the reasons and what each handler
    that gave up raised (class, message and traceback, redacted and
    bounded). Without it such a message is gone after its log line.

    ``max_deliveries`` (0, the default: no limit) is read by the
    :class:`Worker` that runs this Dispatcher: a message its driver counts as
    delivered more often (its handler never finished: the worker was killed
    each time) is set aside without calling a handler -- into ``failed`` when
    given, else the driver's reject path. Off by default because some brokers
    count receives no handler saw (SQS: a prefetched message given back, a
    delayed one hidden again), and without a store the reject path of some
    deletes (SQS without a redrive policy).

    Every handler call ends in one log line that names the message: INFO
    ``End handle message`` when the handler returned True; WARNING when it
    raised and a retry copy was sent (with when the copy is due); ERROR when
    it failed and will not run again, with the reason. A message without a
    handler is one ERROR line. A handler's exception is logged at ERROR with
    its traceback (``Handler X throws exception``) before that outcome line.

    A retry copy the broker cannot take because it is unavailable for a moment
    is sent again after each of :attr:`retry_send_waits_s` (a WARNING line
    each); when it still cannot be sent, or the broker refused it outright,
    the error is logged and raised: the Worker releases the message (an
    at-least-once broker delivers it again) and its run ends.
    """

    #: Seconds to wait before each further attempt to send a retry copy while the
    #: broker is unavailable (:class:`BrokerUnavailableError`): a restarting broker
    #: or a failover. An at-most-once broker has already forgotten the message,
    #: so a copy that is never sent loses it.
    retry_send_waits_s: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 4.0)

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
        failed: Driver | FailedStore | None = None,
        max_deliveries: int = 0,
        records: Jobs | Driver | str | None = None,
        limit_store: Driver | str | None = None,
    ) -> None:
        if (
            isinstance(max_deliveries, bool)
            or not isinstance(max_deliveries, int)
            or (max_deliveries < 0)
        ):
            raise ConfigurationError(f"max_deliveries must be an int >= 0, got {max_deliveries!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be an int >= 1, got {concurrency!r}")
        if time_limit_s is not None and not time_limit_s > 0:
            raise ConfigurationError(f"time_limit_s must be > 0 seconds, got {time_limit_s!r}")
        if not grace_s >= 0:
            raise ConfigurationError(f"grace_s must be >= 0 seconds, got {grace_s!r}")
        #: Messages in the handlers at once: a thread each for sync handlers, a task on
        #: the event loop (no thread) for a message whose handlers are all async def.
        self.concurrency = concurrency
        #: Longest a handler may run before it is interrupted (None: no limit). A
        #: handler's own ``time_limit_s`` attribute overrides it.
        self.time_limit_s = time_limit_s
        #: On shutdown, how long handlers in flight get to finish.
        self.grace_s = grace_s
        #: A message the broker delivered more than this many times (its handler
        #: never finished: the worker died each time) is set aside unhandled; 0: no limit.
        self.max_deliveries = max_deliveries
        self._watchdog = Watchdog()
        self._event_loop = EventLoopThread()
        #: Worker runs using this Dispatcher now, and whether they started its event loop.
        self._runs = 0
        self._runs_own_loop = False
        self._runs_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.driver = driver
        self.logger = logger or logging.getLogger("hermes")
        self.shutdown = shutdown
        self._randomizer = randomizer
        #: Where messages given up on are kept; None (the default) keeps none.
        self.failed = _failed_store(failed, driver) if failed is not None else None
        #: Where each job's record is kept (state, attempts, result); None keeps none.
        self.records = _jobs(records) if records is not None else None
        #: The bookkeeping of workflow steps, made on the first step that ends.
        self._workflows: Workflows | None = None
        self._watch: RecordWatch | None = None
        #: Type -> its limit (see :meth:`limit`).
        self.limits: dict[str, Limit] = {}
        #: Where limits are kept: ``limit_store``, else this Dispatcher's driver.
        self.limit_store = limit_store
        self._limiter: Limiter | None = None
        #: (heartbeat id, registry) the new attempts name: see :meth:`beats_on`.
        self._beats: tuple[str, str] | None = None
        self.stats = DispatcherStats()
        #: Log the INFO lines ``Start handle message`` / ``End handle message`` for every
        #: message. ``hermes worker`` turns them off unless ``-v``: two log lines per
        #: message take a large share of a busy worker's time.
        self.log_each_message = True
        #: Called with a message no handler is registered for and the priority it
        #: came from; what it returns ends that message's ERROR line (e.g. why this
        #: worker reads that queue). ``hermes worker`` sets it; None adds nothing.
        self.explain_unhandled: Callable[[Message, int], str] | None = None
        self._handlers: dict[str, list[Handler]] = {}
        #: id(handler) -> (handler, whether its ``handle`` is ``async def``): asked
        #: once per handler, not per message (the handler is kept so its id stays its own).
        self._async: dict[int, tuple[Handler, bool]] = {}
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
        self,
        type: str,
        *,
        max_retry: int | None = None,
        can_retry: CanRetry | None = None,
        backoff: Backoff | float | None = None,
        time_limit_s: float | None = None,
        limit: Limit | None = None,
    ) -> Callable[[F], F]:
        """Decorator: register the function as a handler of ``type``; the function is unchanged.

        With ``max_retry`` (and optionally ``can_retry(message, exception)``) a
        failure is retried by the rules of :class:`RetryableHandler`: a copy is
        published while ``message.retries < max_retry`` and then only if
        ``can_retry`` agrees; ``max_retry=0`` never retries. ``can_retry``
        alone means ``max_retry=25``. Without either, the function is never retried.
        ``backoff`` -- seconds, or a function of the retry number (1 for the first
        retry) returning seconds -- replaces :meth:`next_retry` for this handler.
        ``time_limit_s`` replaces the Dispatcher's :attr:`time_limit_s` for it (a
        function's own ``time_limit_s`` attribute does too). ``limit`` sets the
        type's :meth:`limit`.
        """
        if limit is not None:
            self.limit(type, limit)

        def register(function: F) -> F:
            handler = function_handler(
                function,
                max_retry=max_retry,
                can_retry=can_retry,
                backoff=backoff,
                time_limit_s=time_limit_s,
            )
            self.register_handler(type, handler)
            return function

        return register

    def limit(self, type: str, limit: Limit | None) -> Dispatcher:
        """Hold every job of ``type`` to ``limit`` across the fleet (None: no limit).

        The limit's state is kept by ``limit_store`` (else this Dispatcher's
        driver), which must keep limits (memory, filesystem, Redis,
        PostgreSQL). A job over its limit is sent again for the time the store
        says it may start and the message in hand is acknowledged: it is not
        run, not retried, and no handler thread waits for it. Declaring a
        limit again for a type replaces it.
        """
        if limit is None:
            self.limits.pop(type, None)
        elif not isinstance(limit, Limit):
            raise ConfigurationError(f"limit of {type!r} must be a Limit, got {limit!r}")
        else:
            self.limits[type] = limit
        return self

    def limiter(self) -> Limiter | None:
        """The Limiter of this Dispatcher's limits, made on first use; None without limits.

        Raises :class:`ConfigurationError` when the store cannot keep limits or
        the broker cannot hold a deferred job back.
        """
        if not self.limits:
            return None
        if self._limiter is None:
            limiter = Limiter(self.limit_store if self.limit_store is not None else self.driver)
            limiter.check_driver(self.driver)
            self._limiter = limiter
        return self._limiter

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
        self._async.clear()
        return self

    def handlers(self, type: str) -> list[Handler]:
        """The handlers registered for ``type``, in registration order."""
        return list(self._handlers.get(type, ()))

    def registered(self) -> dict[str, list[Handler]]:
        """Every type that has handlers -> its handlers, both in registration order."""
        return {type: list(handlers) for type, handlers in self._handlers.items()}

    # Running -----------------------------------------------------------------

    def close(self) -> None:
        """End what a run started: the event loop of async handlers, the records watch."""
        self._event_loop.close()
        if self._watch is not None:
            self._watch.close()
        if self._limiter is not None:
            self._limiter.close()
            self._limiter = None
        self._beats = None

    def beats_on(self, registry: SupportsHeartbeats, heartbeat_id: str, interval_s: float) -> None:
        """The run that uses this Dispatcher publishes heartbeat ``heartbeat_id`` on ``registry``.

        Called by the :class:`Worker` as its run starts; nothing happens
        without job records. With them, the run sweeps for lost jobs every
        ``interval_s`` (:class:`~hermes.core.app._watch.RecordWatch`), and on
        an at-most-once driver each attempt names the heartbeat, so that
        another worker's sweep marks it ``lost`` once that heartbeat expired.
        An at-least-once driver delivers a dead worker's message again: its
        attempts name no heartbeat and are never judged lost.
        """
        if self.records is None:
            return
        if self.driver.capabilities.delivery is Delivery.AT_MOST_ONCE:
            self._beats = (heartbeat_id, repr(registry))
        self._records_watch(self.records).sweep_with(registry, heartbeat_id, interval_s)

    def _records_watch(self, records: Jobs) -> RecordWatch:
        watch = self._watch
        if watch is None or watch.jobs is not records:
            watch = self._watch = RecordWatch(records, on_lost=self._lost_step)
        return watch

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around one Worker run: the event loop the runs started ends with the last of them.

        Several runs may share this Dispatcher at once (two Workers on other
        queues, in two threads): one that ends leaves the loop to the others.
        A loop that was there before the runs (the application's own calls) is
        left running; :meth:`close` ends it.
        """
        self.limiter()  # a store that cannot keep limits fails the start, not the first job
        with self._runs_lock:
            if not self._runs:
                self._runs_own_loop = not self._event_loop.started
            self._runs += 1
        try:
            yield
        finally:
            with self._runs_lock:
                self._runs -= 1
                if not self._runs and self._runs_own_loop:
                    self.close()

    def _count(self, name: str) -> None:
        # Handler threads finish at once; a bare ``+=`` could lose a count.
        with self._count_lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def call_handler(self, handler: Handler, message: Message) -> bool | Result:
        """Run one handler on ``message`` within its time limit; what it returned.

        A :class:`~hermes.core.Result` comes back as it is; anything else as a bool.

        ``async def handle`` (or a handle that returns a coroutine) runs on the
        worker's event loop, and this thread waits for it. Over the limit:
        :class:`TimeLimitExceeded`.
        """
        answer = self._call(handler, message)
        if isinstance(answer, Awaiting):
            answer = _answer(self._event_loop.run(answer.coroutine, answer.limit_s, answer.job))
        return answer

    def _call(self, handler: Handler, message: Message) -> bool | Result | Awaiting:
        """One call of ``handler.handle``: its answer, or the coroutine it made, to await.

        A plain function, not steps: a sync handler's call (most calls) costs no
        generator; the caller awaits an :class:`Awaiting` and passes what it
        returned through :func:`_answer`.
        """
        limit = getattr(handler, "time_limit_s", None)
        if limit is None:
            limit = self.time_limit_s
        handle = handler.handle
        known = self._async.get(id(handler))
        if known is None:
            known = self._async[id(handler)] = (handler, inspect.iscoroutinefunction(handle))
        if known[1]:  # an async def handle: calling it made a coroutine
            return Awaiting(cast(Coroutine[Any, Any, Any], handle(message)), limit, watched_job())
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
        if result is None or result is True or result is False:  # the usual answers, at once
            return bool(result)
        if inspect.iscoroutine(result):
            return Awaiting(result, limit, watched_job())
        return _answer(result)

    def _drive(self, steps: Generator[Awaiting, Any, Any], awaiting: Awaiting) -> Any:
        """Run ``steps`` on from ``awaiting``, the first coroutine they yielded, on this thread."""
        run = self._event_loop.run
        try:
            while True:
                try:
                    value = run(awaiting.coroutine, awaiting.limit_s, awaiting.job)
                except BaseException as exc:
                    awaiting = steps.throw(exc)
                else:
                    awaiting = steps.send(value)
        except StopIteration as done:
            return done.value

    def runs_async(self, message: Message) -> bool:
        """Whether ``message`` can take the worker's async path (:meth:`message_steps`).

        True when every handler of its type is an ``async def handle`` and no
        installed plugin pairs hooks by thread (``hermes_message_started``,
        ``hermes_handler_call``: a plugin that keeps what they start in a
        thread-local would see its ``finished`` on another thread), unless the
        plugin says it keeps them per context (``hermes_async_safe = True``).
        """
        handlers = self._handlers.get(message.type)
        if not handlers:
            return False
        known = self._async
        for handler in handlers:
            entry = known.get(id(handler))
            if entry is None:
                entry = known[id(handler)] = (
                    handler,
                    inspect.iscoroutinefunction(handler.handle),
                )
            # A FunctionHandler of an async def returns its coroutine from a plain handle().
            if not entry[1] and getattr(handler, "is_async", False) is not True:
                return False
        return self.async_hooks_ok()

    def async_hooks_ok(self) -> bool:
        """Whether no installed plugin pairs hooks by thread (see :meth:`runs_async`)."""
        hooks = self._hooks
        for hook in (hooks.hermes_message_started, hooks.hermes_handler_call):
            for impl in hook.get_hookimpls():
                if not getattr(impl.plugin, "hermes_async_safe", False):
                    return False
        return True

    @property
    def event_loop(self) -> EventLoopThread:
        """The event loop that runs ``async def`` handlers (started on first use)."""
        return self._event_loop

    def handle_message(self, message: Message, priority: int) -> bool:
        """Run every handler of ``message.type``; True if all succeeded.

        What the Worker calls per message. Plugins see ``started`` first and
        ``finished`` last, with the message's :class:`Outcome`, on every path.
        """
        steps = self.message_steps(message, priority)
        try:
            awaiting = next(steps)  # a message of sync handlers runs to its end here
        except StopIteration as done:
            return bool(done.value)
        return bool(self._drive(steps, awaiting))

    def message_steps(self, message: Message, priority: int) -> Generator[Awaiting, Any, bool]:
        """:meth:`handle_message` as steps, for a worker that awaits coroutines itself.

        Each ``async def`` handler's coroutine is yielded as an :class:`Awaiting`
        (with its time limit and its job, for cancels); the caller runs it and
        sends back its result, or throws in what it raised. The work before
        and after each handler (limits, job records, retries, the failed store,
        hooks) runs on whatever thread advances the steps -- never on the event
        loop -- so one code path serves threads and coroutines alike. A step
        closed before it finished (the worker abandoned it) writes nothing.
        """
        limit = self.limits.get(message.type) if self.limits else None
        if limit is None:
            return self._handle_message(message, priority)
        return self._limited_steps(message, priority, limit)

    def _limited_steps(
        self, message: Message, priority: int, limit: Limit
    ) -> Generator[Awaiting, Any, bool]:
        """:meth:`_handle_message` within ``limit``: run now, or deferred to its turn."""
        limiter = self.limiter()
        assert limiter is not None
        held = limiter.take(limit, message)
        if isinstance(held, Deferred):
            self._defer(message, priority, limit, held)
            return True  # acknowledged: its copy runs at its turn
        abandoned = False
        try:
            return (yield from self._handle_message(message, priority))
        except GeneratorExit:
            abandoned = True  # closed by the worker: the broker delivers it again
            raise
        finally:
            if held is not None and not abandoned:
                limiter.release(held)

    def _handle_message(self, message: Message, priority: int) -> Generator[Awaiting, Any, bool]:
        hooks = self._hooks
        expires = message.headers.get(EXPIRES_HEADER) if message.headers else None
        report = None
        records = self.records
        job = watch = None
        if records is not None or expires is not None:
            report = _Report()
            skipped = self._start(message, priority, expires)
            if skipped is not None:
                return True  # acknowledged without running: cancelled or expired
            if records is not None:
                watch = self._records_watch(records)
                job = watch.add(message)
        # Asked before notify(): without observers (most workers) no keyword dict
        # is built for nobody, three times a message.
        if hooks.hermes_message_started.get_hookimpls():
            notify(hooks.hermes_message_started, message=message, priority=priority)
        outcome = Outcome.NO_HANDLER
        token = entering(job if job is not None else message)
        abandoned = False
        try:
            outcome = yield from self._run_handlers(message, priority, report, job)
        except GeneratorExit:
            # Abandoned at the end of a grace period (or collected with its worker):
            # its record stays running and the broker delivers it again.
            abandoned = True
            raise
        finally:
            if job is not None and watch is not None:
                watch.remove(job)
            if not abandoned:
                leaving(token)
                if job is not None and job.cancelled.is_set():
                    self._cancel_came(message, outcome, report)
                if records is not None and report is not None:
                    self._finish(records, message, outcome, report)
                if hooks.hermes_message_finished.get_hookimpls():
                    notify(
                        hooks.hermes_message_finished,
                        message=message,
                        priority=priority,
                        result=outcome is Outcome.SUCCEEDED,
                        outcome=outcome,
                    )
        return outcome is Outcome.SUCCEEDED

    def _start(self, message: Message, priority: int, expires: str | None) -> str | None:
        """Whether ``message`` runs: None, or why not (``cancelled``, ``expired``).

        A records store that cannot be read raises: a cancel could not be
        honoured, so the message is not run (an at-least-once broker delivers
        it again).
        """
        expires_at = _expiry(expires, message)
        if self.records is not None:
            beats = self._beats
            token = message.headers.get(WORKFLOW_HEADER) if message.headers else None
            start = self.records.start(
                message,
                priority,
                expires_at,
                heartbeat=beats[0] if beats is not None else None,
                registry=beats[1] if beats is not None else None,
                token=token,
            )
            skipped = start.skipped
            if skipped in ("ended", "duplicate"):
                self._count("skipped")
                self.logger.info(
                    "Workflow step #%s (%s) %s: acknowledged without running a handler",
                    message.id,
                    message.type,
                    "had ended already" if skipped == "ended" else "was started by another copy",
                )
                if skipped == "ended" and start.record is not None:
                    self._step_ended(start.record, message, priority)
                return skipped
            if skipped is not None and start.record is not None:
                self._job_finished(start.record, message)
                if token is not None:
                    self._step_ended(start.record, message, priority)
        else:
            skipped = "expired" if expires_at is not None and time.time() > expires_at else None
        if skipped is not None:
            self._count("skipped")
            self.logger.warning(
                "Message #%s (%s) %s: acknowledged without running a handler",
                message.id,
                message.type,
                "was cancelled" if skipped == "cancelled" else "expired before it started",
            )
        return skipped

    def _defer(self, message: Message, priority: int, limit: Limit, deferred: Deferred) -> None:
        """Send ``message`` again for when its limit lets it start; no retry is used up."""
        headers = dict(message.headers or {})
        header = deferred.header(message)
        if header is None:
            headers.pop(LIMIT_HEADER, None)
        else:
            headers[LIMIT_HEADER] = header
        due_at = time.time() + deferred.wait_s
        copy = message.replace(execute_at=due_at, headers=headers)
        with translate_errors(self.driver, f"defer message #{message.id}"):
            self.driver.send(copy, priority)
        self._count("deferred")
        self.logger.debug(
            "Message #%s (%s) deferred %.3g s by its limit %s (%s)",
            message.id,
            message.type,
            deferred.wait_s,
            deferred.key,
            limit.describe(),
        )
        if self._hooks.hermes_message_deferred.get_hookimpls():
            notify(
                self._hooks.hermes_message_deferred,
                message=message,
                key=deferred.key,
                wait_s=deferred.wait_s,
            )

    def _cancel_came(self, message: Message, outcome: Outcome, report: _Report | None) -> None:
        """The one line that says a cancel came while ``message`` ran, and how it ended."""
        if outcome is Outcome.CANCELLED:
            stopped = report.stopped if report is not None else None
            self.logger.warning(
                "Message #%s (%s) was cancelled while it ran: %s; recorded cancelled",
                message.id,
                message.type,
                f"{stopped} stopped" if stopped else "its next handler did not start",
            )
        else:
            self.logger.warning(
                "Message #%s (%s): a cancel came while it ran, too late: its handlers had "
                "finished (%s), so that is what its record says",
                message.id,
                message.type,
                outcome.value,
            )

    def _job_finished(self, record: JobRecord, message: Message) -> None:
        hook = self._hooks.hermes_job_finished
        if record.state.final and hook.get_hookimpls():
            notify(hook, record=record, message=message)

    def _finish(self, jobs: Jobs, message: Message, outcome: Outcome, report: _Report) -> None:
        """Write how ``message``'s attempt ended into its record; a store failure is logged."""
        if outcome is Outcome.SUCCEEDED:
            state, error = JobState.SUCCEEDED, None
        elif outcome is Outcome.CANCELLED:
            state, error = JobState.CANCELLED, None
        elif report.retry_at is not None:
            state, error = JobState.FAILED, report.error
        else:
            state, error = JobState.GIVEN_UP, report.error
        try:
            record = jobs.finish(
                message,
                outcome.value,
                state=state,
                error=error,
                result=report.result,
                has_result=state is JobState.SUCCEEDED,
                retry_at=None if state is JobState.CANCELLED else report.retry_at,
            )
        except Exception as exc:
            self.logger.error(
                "Message #%s (%s) ended %s, and its record in %r could not say so - %s",
                message.id,
                message.type,
                outcome.value,
                jobs.driver,
                exc,
            )
            return
        if record is not None:
            self._job_finished(record, message)
            if record.state.final and message.headers and WORKFLOW_HEADER in message.headers:
                self._step_ended(record, message, None)

    def _lost_step(self, record: JobRecord) -> None:
        """A job the sweep marked lost: if a workflow's step, count it as ended."""
        if record.token is not None and self.records is not None:  # only steps carry one
            self._workflows_of(self.records).step_ended(record)

    def _workflows_of(self, records: Jobs) -> Workflows:
        if self._workflows is None:
            # Imported once a workflow's step ends: most workers never run one,
            # and the module costs a worker's start-up milliseconds.
            from hermes.core.app._workflows import Workflows

            self._workflows = Workflows(self.driver, records)
        return self._workflows

    def _step_ended(self, record: JobRecord, message: Message, priority: int | None) -> None:
        """Count a workflow step that ended and send what follows it; before its ack.

        A store or broker that fails here would leave the workflow waiting for
        this step: a copy of the message is sent for a few seconds later,
        which finds the step ended and does this again.
        """
        assert self.records is not None
        try:
            self._workflows_of(self.records).step_ended(record)
        except Exception as exc:
            again = time.time() + STEP_AGAIN_S
            self.logger.error(
                "Workflow step #%s (%s) ended %s and its workflow could not count it - %s; "
                "its message comes back in %g s to count it again",
                message.id,
                message.type,
                record.state.value,
                exc,
                STEP_AGAIN_S,
            )
            at = record.priority if record.priority is not None else priority
            copy = message.replace(execute_at=again)
            with translate_errors(self.driver, f"sending workflow step #{message.id} again"):
                self.driver.send(copy, at if at is not None else DEFAULT_PRIORITY)

    def _run_handlers(
        self,
        message: Message,
        priority: int,
        report: _Report | None = None,
        job: RunningJob | None = None,
    ) -> Generator[Awaiting, Any, Outcome]:
        with self._count_lock:  # _count's work, without its getattr/setattr per message
            self.stats.received += 1
        info = self.log_each_message and self.logger.isEnabledFor(logging.INFO)
        if info:
            self.logger.info(
                "Start handle message #%s (%s) priority:%s", message.id, message.type, priority
            )
        handlers = self._handlers.get(message.type)
        if not handlers:
            self._count("failed")
            reason = "no handler is registered for its type"
            if report is not None:
                report.error = JobError.reason(f"no handler is registered for {message.type!r}")
            unhandled = self._give_up(message, priority, None, reason, None, Outcome.NO_HANDLER)
            if self.failed is not None:
                self._store(self.failed, message, priority, [unhandled])
            return Outcome.NO_HANDLER
        outcome = Outcome.SUCCEEDED
        gave_up: list[_GivenUp] = []
        for handler in list(handlers):
            if job is not None and job.cancelled.is_set():
                outcome = Outcome.CANCELLED  # the handlers after a cancel do not start
                self._count("cancelled")
                break
            result, given_up = yield from self._run_one(
                handler, message, priority, info, report, job
            )
            if result is Outcome.CANCELLED:
                outcome = result
                break
            if result is not Outcome.SUCCEEDED and outcome is Outcome.SUCCEEDED:
                outcome = result
            if given_up is not None:
                gave_up.append(given_up)
        if gave_up and self.failed is not None:
            self._store(self.failed, message, priority, gave_up)
        return outcome

    def _run_one(
        self,
        handler: Handler,
        message: Message,
        priority: int,
        info: bool,
        report: _Report | None = None,
        job: RunningJob | None = None,
    ) -> Generator[Awaiting, Any, tuple[Outcome, _GivenUp | None]]:
        """One handler on ``message``: its outcome, and what the store keeps if it gave up.

        A handler that raises or returns False after a cancel of its job
        arrived was stopped by it: CANCELLED, neither retried nor given up.
        """
        hooks = self._hooks
        debug = self.logger.isEnabledFor(logging.DEBUG)
        started = time.perf_counter() if debug else 0.0
        around = hooks.hermes_handler_call
        try:
            if around.get_hookimpls():
                # Entered and exited around the steps, not one Python call: a
                # coroutine handler's are awaited on the event loop in between.
                entered = enter_calls(
                    around, message=message, priority=priority, handler=handler, driver=self.driver
                )
                try:
                    ok = self._call(handler, message)
                    if isinstance(ok, Awaiting):
                        ok = _answer((yield ok))
                except BaseException as exc:
                    exit_calls(around, entered, exc)
                    raise
                exit_calls(around, entered, None)
            else:  # nobody wraps handler calls (most workers)
                ok = self._call(handler, message)
                if isinstance(ok, Awaiting):
                    ok = _answer((yield ok))
        except Exception as exc:
            if debug:
                self._took(handler, message, started, f"raised {type(exc).__name__}")
            if job is not None and job.cancelled.is_set():
                return self._stopped(handler, report), None
            self._count("failed")
            self.logger.error(
                "Handler %s throws exception - %s", handler_name(handler), exc, exc_info=True
            )
            notify(
                hooks.hermes_message_failed,
                message=message,
                priority=priority,
                handler=handler,
                exception=exc,
            )
            timed_out = isinstance(exc, TimeLimitExceeded)
            verdict = self._judge_retry(handler, message, exc)
            if report is not None:
                report.error = JobError.from_exception(exc)
            if verdict.refused is None:
                due_at = self._retry(message, handler, verdict.max_retry, exc)
                if report is not None:
                    report.retry_at = due_at
                return (Outcome.TIME_LIMIT if timed_out else Outcome.RETRIED), None
            if timed_out:
                outcome = Outcome.TIME_LIMIT
            elif verdict.max_retry is not None:
                outcome = Outcome.GAVE_UP
            else:
                outcome = Outcome.NOT_RETRYABLE
            return outcome, self._give_up(message, priority, handler, verdict.refused, exc, outcome)
        if debug:
            self._took(handler, message, started, f"returned {ok}")
        if isinstance(ok, Result):
            if report is not None:
                report.result = ok.value
            ok = True
        if ok:
            with self._count_lock:
                self.stats.handled += 1
            if info:
                self.logger.info("End handle message #%s (%s)", message.id, message.type)
            if hooks.hermes_message_succeeded.get_hookimpls():
                notify(
                    hooks.hermes_message_succeeded,
                    message=message,
                    priority=priority,
                    handler=handler,
                    result=True,
                )
            return Outcome.SUCCEEDED, None
        if job is not None and job.cancelled.is_set():
            return self._stopped(handler, report), None
        self._count("failed")
        reason = "it returned False (a handler that returns False is never retried)"
        if report is not None:
            report.error = JobError.reason(f"{handler_name(handler)} returned False")
        outcome = Outcome.RETURNED_FALSE
        return outcome, self._give_up(message, priority, handler, reason, None, outcome)

    def _stopped(self, handler: Handler, report: _Report | None) -> Outcome:
        self._count("cancelled")
        if report is not None:
            report.stopped = handler_name(handler)
        return Outcome.CANCELLED

    def _took(self, handler: Handler, message: Message, started: float, outcome: str) -> None:
        self.logger.debug(
            "Handler %s %s on message #%s (%s) after %.1f ms",
            handler_name(handler),
            outcome,
            message.id,
            message.type,
            (time.perf_counter() - started) * 1000,
        )

    @property
    def randomizer(self) -> Randomizer:
        """The random source of :meth:`next_retry`'s jitter (default ``random.SystemRandom()``)."""
        if self._randomizer is None:
            self._randomizer = default_randomizer()
        return self._randomizer

    @randomizer.setter
    def randomizer(self, randomizer: Randomizer) -> None:
        self._randomizer = randomizer

    def next_retry(self, message: Message) -> float:
        """When a retry of ``message`` may run: now + r⁴ + 15 + randint(1, 30)·(r+1)."""
        return next_retry(message, self.randomizer)

    def _judge_retry(self, handler: Handler, message: Message, exc: Exception) -> RetryVerdict:
        try:
            return judge_retry(handler, message, exc, self.logger)
        except Exception as policy_exc:
            # can_retry()/max_retry() are user code too: their failure must not
            # kill the worker (and bring the same message back to kill the next).
            self.logger.error(
                "Handler %s retry policy throws exception - %s",
                handler_name(handler),
                policy_exc,
                exc_info=True,
            )
            return RetryVerdict(
                f"its retry policy raised {type(policy_exc).__name__}: {policy_exc}"
            )

    def _retry(
        self, message: Message, handler: Handler, max_retry: int | None, exc: Exception
    ) -> float:
        """Send the retry copy of ``message``; when it is due."""
        due_at = retry_at(handler, message, self.next_retry, self.logger)
        retry = message.replace(retries=message.retries + 1, execute_at=due_at)
        name = handler_name(handler)
        waits = iter(self.retry_send_waits_s)
        attempts = 0
        while True:
            attempts += 1
            try:
                # No priority: the copy lands on the default priority queue, as in PHP Hermes.
                self.driver.send(retry)
                break
            except BrokerUnavailableError as send_exc:
                wait_s = next(waits, None)
                if wait_s is None:
                    self._retry_not_sent(message, name, attempts, send_exc)
                    raise
                self.logger.warning(
                    "Message #%s (%s): its retry copy could not be sent (attempt %d), "
                    "trying again in %g s - %s",
                    message.id,
                    message.type,
                    attempts,
                    wait_s,
                    send_exc,
                )
                time.sleep(wait_s)
            except Exception as send_exc:
                self._retry_not_sent(message, name, attempts, send_exc)
                raise
        self._count("retried")
        self.logger.warning(
            "Message #%s (%s) failed in %s, retry %d%s %s",
            retry.id,
            retry.type,
            name,
            retry.retries,
            f" of {max_retry}" if max_retry is not None else "",
            describe_due(due_at, self.driver.capabilities.delay is Delay.IGNORED),
        )
        notify(
            self._hooks.hermes_message_retried,
            message=message,
            retry=retry,
            handler=handler,
            exception=exc,
        )
        return due_at

    def _retry_not_sent(self, message: Message, name: str, attempts: int, exc: Exception) -> None:
        self.logger.error(
            "Message #%s (%s) failed in %s and its retry copy could not be sent%s - %s",
            message.id,
            message.type,
            name,
            f" after {attempts} attempts" if attempts > 1 else "",
            exc,
        )

    def _give_up(
        self,
        message: Message,
        priority: int,
        handler: Handler | None,
        reason: str,
        exc: Exception | None,
        outcome: Outcome,
    ) -> _GivenUp:
        """Log and announce that ``handler`` will not run ``message`` again; what the store keeps.

        The exception is formatted for the store only when there is a store.
        """
        self._count("gave_up")
        kept = "; it goes to the failed-message store" if self.failed is not None else ""
        if handler is None:
            self.logger.error(
                "No handlers registered for message #%s (%s); %s%s",
                message.id,
                message.type,
                "it goes to the failed-message store" if kept else "dropped",
                self._explained(message, priority),
            )
        else:
            self.logger.error(
                "Message #%s (%s) failed in %s, not retried: %s%s",
                message.id,
                message.type,
                handler_name(handler),
                reason,
                kept,
            )
        notify(
            self._hooks.hermes_message_gave_up,
            message=message,
            priority=priority,
            handler=handler,
            reason=reason,
            exception=exc,
            outcome=outcome,
        )
        if handler is None:
            return _GivenUp(reason, None)
        name = handler_name(handler)
        record = None
        if exc is not None and self.failed is not None:
            record = ExceptionRecord.of(exc, name)
        return _GivenUp(f"{name}: {reason}", record)

    def _explained(self, message: Message, priority: int) -> str:
        """``" - why"`` from :attr:`explain_unhandled`, or ``""``."""
        explain = self.explain_unhandled
        if explain is None:
            return ""
        try:
            why = explain(message, priority)
        except Exception as exc:  # the message is given up on all the same
            return f" (explain_unhandled raised {type(exc).__name__}: {exc})"
        return f" - {why}" if why else ""

    def _store(
        self, store: FailedStore, message: Message, priority: int, gave_up: list[_GivenUp]
    ) -> None:
        reason = "; ".join(each.reason for each in gave_up)
        raised = [each.exception for each in gave_up if each.exception is not None]
        try:
            stored = store.keep(message, reason, exceptions=raised, priority=priority)
        except Exception as exc:
            self.logger.error(
                "Message #%s (%s) could not be sent to the failed-message store %r and is "
                "lost - %s",
                message.id,
                message.type,
                store.driver,
                exc,
                exc_info=True,
            )
            return
        self._count("stored")
        self.logger.debug(
            "Message #%s (%s) kept in %r at %s",
            message.id,
            message.type,
            store.driver,
            readable_time(stored.failed_at),
        )


class _GivenUp(NamedTuple):
    """One handler's failure as the failed-message store keeps it."""

    #: ``"SendEmail: gave up after 25 retries"``; the bare reason when no handler ran.
    reason: str
    #: What the handler raised; None when it raised nothing (or there is no store).
    exception: ExceptionRecord | None


def _failed_store(failed: Driver | FailedStore, driver: Driver) -> FailedStore:
    if (failed.driver if isinstance(failed, FailedStore) else failed) is driver:
        raise ConfigurationError(
            f"failed= is the Dispatcher's own driver {driver!r}: messages given up on "
            "would come straight back; connect the store to another queue"
        )
    return failed if isinstance(failed, FailedStore) else FailedStore(failed)


def _answer(result: object) -> bool | Result:
    return result if isinstance(result, Result) else bool(result)


class _Report:
    """What one message's handlers did, for its job record."""

    __slots__ = ("error", "result", "retry_at", "stopped")

    def __init__(self) -> None:
        self.result: Any = None
        self.error: JobError | None = None
        self.retry_at: float | None = None
        #: The handler a cancel stopped.
        self.stopped: str | None = None


def _expiry(header: str | None, message: Message) -> float | None:
    if header is None:
        return None
    try:
        return float(header)
    except ValueError:
        logging.getLogger("hermes").warning(
            "Message #%s (%s) has an unreadable %s header %r: it does not expire",
            message.id,
            message.type,
            EXPIRES_HEADER,
            header,
        )
        return None


def _jobs(records: Jobs | Driver | str) -> Jobs:
    if isinstance(records, Jobs):
        return records
    return Jobs(records)
