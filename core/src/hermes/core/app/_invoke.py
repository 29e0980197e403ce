"""How a handler is called: time limits for threads and coroutines, and an event loop.

A sync handler over its time limit gets :class:`TimeLimitExceeded` raised
inside its thread (``PyThreadState_SetAsyncExc``: it lands at the handler's
next Python bytecode, so a handler blocked inside one long C call — a
``time.sleep(60)``, a socket read without a timeout — is interrupted only
when that call returns; give such calls their own timeouts). An ``async def
handle`` runs on an event loop the worker owns, in a thread of its own, and is
cancelled when it overruns, or when its job is cancelled while it runs.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from hermes.core.app._watch import RunningJob
from hermes.core.model._errors import HermesError, JobCancelled

if TYPE_CHECKING:
    import asyncio

# asyncio (about a fifth of `import hermes.core`) is imported when the first
# async handler runs: a worker of plain handlers never needs it.

logger = logging.getLogger("hermes")


class TimeLimitExceeded(HermesError):
    """A handler ran longer than its time limit and was interrupted."""


class Awaiting(NamedTuple):
    """A handler's coroutine that the Dispatcher's steps wait on (see ``message_steps``)."""

    coroutine: Coroutine[Any, Any, Any]
    #: Cancel it after this many seconds (None: no limit): :class:`TimeLimitExceeded`.
    limit_s: float | None
    #: The job whose cancel cancels it (None without job records).
    job: RunningJob | None


#: Called on the event loop thread with what a coroutine returned, or what it raised.
Done = Callable[[Any, BaseException | None], None]


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> int:
    """Schedule ``exc`` in thread ``thread_id`` (None clears a pending one); threads affected."""
    import ctypes  # only once a time limit fires: a costly import otherwise unused

    return int(
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
        )
    )


class _Timer:
    __slots__ = ("deadline", "fired", "thread_id")

    def __init__(self, deadline: float, thread_id: int) -> None:
        self.deadline = deadline
        self.thread_id = thread_id
        self.fired = False


class Watchdog:
    """One thread that interrupts handler threads past their deadline."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, limit_s: float) -> _Timer:
        """Interrupt the calling thread in ``limit_s`` seconds unless :meth:`disarm`\\ ed."""
        timer = _Timer(time.monotonic() + limit_s, threading.get_ident())
        with self._lock:
            heapq.heappush(self._heap, (timer.deadline, next(self._order), timer))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="hermes-time-limits", daemon=True
                )
                self._thread.start()
            self._lock.notify()
        return timer

    def disarm(self, timer: _Timer) -> bool:
        """Stop watching; True if the limit had already fired (its exception is cleared).

        Called by the handler's own thread right after the handler returned or
        raised, so an interruption that had not landed yet cannot land later,
        in code that is not the handler's.
        """
        with self._lock:
            timer.deadline = -1.0  # the watcher drops it when it reaches it
            if timer.fired:
                _raise_in(timer.thread_id, None)
            return timer.fired

    def _watch(self) -> None:
        with self._lock:
            while True:
                while self._heap and self._heap[0][2].deadline < 0:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._lock.wait()
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                _, _, timer = heapq.heappop(self._heap)
                if timer.deadline >= 0:
                    timer.fired = True
                    _raise_in(timer.thread_id, TimeLimitExceeded)


async def _cancelled_by(job: RunningJob, coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Await ``coroutine`` in a task that ``job``'s cancel cancels."""
    import asyncio

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None  # run by run_coroutine_threadsafe: always in a task

    def cancel() -> None:
        loop.call_soon_threadsafe(task.cancel)

    job.on_cancel(cancel)
    return await coroutine


class EventLoopThread:
    """An asyncio loop in a daemon thread, started on first use, for ``async def handle``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: What :meth:`start` was given since the loop last took it, oldest first.
        self._starting: list[tuple[Awaiting, contextvars.Context, Done]] = []
        self._starting_lock = threading.Lock()

    @property
    def started(self) -> bool:
        """Whether a loop runs (until :meth:`close`)."""
        return self._loop is not None

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                import asyncio

                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._run_until_stopped,
                    args=(loop,),
                    name="hermes-event-loop",
                    daemon=True,
                ).start()
                self._loop = loop
            return self._loop

    @staticmethod
    def _run_until_stopped(loop: asyncio.AbstractEventLoop) -> None:
        import asyncio

        try:
            loop.run_forever()
            # Coroutines abandoned by a grace period that ran out are cancelled, not leaked.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def run(
        self,
        coroutine: Coroutine[Any, Any, Any],
        limit_s: float | None,
        job: RunningJob | None = None,
    ) -> Any:
        """Run ``coroutine`` on the loop and wait for it; cancel it after ``limit_s``.

        With ``job``, a cancel of the job cancels the coroutine's task
        (``CancelledError`` at its next ``await``); once the task ended so, this
        raises :class:`JobCancelled`.
        """
        import asyncio
        import concurrent.futures

        if job is not None:
            coroutine = _cancelled_by(job, coroutine)
        future = asyncio.run_coroutine_threadsafe(coroutine, self._running_loop())
        try:
            return future.result(limit_s)
        except TimeoutError:
            future.cancel()
            raise TimeLimitExceeded(f"timed out after {limit_s:g} s") from None
        except concurrent.futures.CancelledError:
            if job is not None and job.cancelled.is_set():
                raise JobCancelled(
                    f"job #{job.id} ({job.message.type}) was cancelled while it ran"
                ) from None
            raise

    def start(self, awaiting: Awaiting, context: contextvars.Context, done: Done) -> None:
        """Start ``awaiting``'s coroutine on the loop and return at once; no thread waits.

        The coroutine runs as a task in ``context`` (the handler's
        ``current_job()`` and the driver's current message). When it ends
        ``done(result, None)`` or ``done(None, exception)`` is called on the
        loop thread: it must not block (hand the rest to a thread). Past
        ``limit_s`` the task is cancelled and ``done`` gets
        :class:`TimeLimitExceeded`; cancelled by its job, :class:`JobCancelled`.

        What several threads start between two turns of the loop is started in
        one: the loop is woken once for them, not once each. If it cannot be
        woken (it was closed), this raises, and the others given meanwhile get
        ``done(None, exception)`` on this thread.
        """
        loop = self._running_loop()
        with self._starting_lock:
            starting = self._starting
            starting.append((awaiting, context, done))
            if len(starting) > 1:
                return  # the loop is woken already, and takes this one with the others
        try:
            loop.call_soon_threadsafe(self._start_all, loop)
        except BaseException as exc:
            with self._starting_lock:
                starting, self._starting = self._starting, []
            for other in starting[1:]:  # given while this call failed: they fail alike
                other[0].coroutine.close()
                other[2](None, exc)
            raise

    def _start_all(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._starting_lock:
            starting, self._starting = self._starting, []
        for awaiting, context, done in starting:
            _start_task(loop, awaiting, context, done)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


def _start_task(
    loop: asyncio.AbstractEventLoop, awaiting: Awaiting, context: contextvars.Context, done: Done
) -> None:
    """On the loop: run ``awaiting`` as a task, cancelled at its limit or by its job."""
    coroutine, limit_s, job = awaiting
    try:
        task = loop.create_task(coroutine, context=context)
    except BaseException as exc:
        coroutine.close()
        done(None, exc)
        return
    timed_out = False
    timer = None
    if limit_s is not None:

        def time_up() -> None:
            nonlocal timed_out
            if not task.done():
                timed_out = True
                task.cancel()

        timer = loop.call_later(limit_s, time_up)
    if job is not None:

        def cancel() -> None:
            loop.call_soon_threadsafe(task.cancel)

        job.on_cancel(cancel)

    def finished(task: asyncio.Task[Any]) -> None:
        if timer is not None:
            timer.cancel()
        if timed_out:  # cancelled at its limit (even if it caught the cancellation)
            done(None, TimeLimitExceeded(f"timed out after {limit_s:g} s"))
            return
        if task.cancelled():
            exc: BaseException
            if job is not None and job.cancelled.is_set():
                exc = JobCancelled(f"job #{job.id} ({job.message.type}) was cancelled while it ran")
            else:
                import asyncio

                exc = asyncio.CancelledError()
            done(None, exc)
            return
        exc_ = task.exception()
        if exc_ is not None:
            done(None, exc_)
        else:
            done(task.result(), None)

    # Its own empty context: the callback never enters the task's, which the
    # thread that takes over next enters.
    task.add_done_callback(finished, context=contextvars.Context())
