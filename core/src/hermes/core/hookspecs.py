"""The hooks a Hermes plugin may implement.

A plugin is a module (or object) registered under the entry-point group
``hermes``::

    [project.entry-points.hermes]
    foo = "hermes_foo._plugin"

whose functions are marked with :data:`hermes.core.hookimpl`. Each hook below
states who calls it and when. Hooks take keyword arguments; an
implementation may accept only the ones it needs.

A message's hooks run in one :mod:`contextvars` context of its own, but not
always on one thread: for a message whose handlers are all ``async def``,
the worker runs ``started`` and the handler call's ``__enter__`` on the
thread that took it, and the handler's outcome, the ``__exit__`` and
``finished`` on another, while the coroutine runs on the event loop. A plugin
that carries state from one hook of a message to the next in a
:class:`~contextvars.ContextVar` says so with a module (or object) attribute
``hermes_async_safe = True``; while a plugin without it implements
:func:`hermes_message_started` or :func:`hermes_handler_call`, the worker
keeps a thread per message (it takes no async path) so that a thread-local
of the plugin's still pairs them.

The ``hermes_message_*`` hooks observe messages. They run in the worker or
emitting process, synchronously, one implementation after the other: keep
them fast. They cannot change what Hermes does: an exception raised by an
implementation is logged (an ERROR with the traceback and the plugin's name
the first time that plugin fails in that hook, DEBUG lines after) and the
other implementations are still called; the Dispatcher still sends its retry
and goes on with the next message, ``Emitter.emit`` still returns. Wrapper
implementations (``wrapper=True``, ``hookwrapper=True``) of these hooks are
skipped with an error: there is no call of other plugins for them to wrap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import argparse
    from contextlib import AbstractContextManager

    from hermes.core.app._dispatcher import Outcome
    from hermes.core.app._jobs import JobRecord
    from hermes.core.app._schedule import Entry, Tick
    from hermes.core.model._message import Message
    from hermes.core.spi._driver import Driver
    from hermes.core.spi._registry import DriverPlugin

hookspec = pluggy.HookspecMarker("hermes")


@hookspec
def hermes_drivers() -> Sequence[DriverPlugin]:  # type: ignore[empty-body]
    """Return the drivers this plugin provides, one :class:`DriverPlugin` each.

    Called by :func:`hermes.core.connect`, :func:`hermes.core.available_drivers`
    and :func:`hermes.core.drivertools.isolated_url`, on every call (so a plugin registered
    later is seen): return the same drivers each time, cheaply. Every result of
    every plugin is collected; two plugins claiming one URL scheme is an error
    that names both.
    """


@hookspec
def hermes_message_emitted(message: Message, priority: int, driver: Driver) -> None:
    """Called by :meth:`Emitter.emit` after ``driver.send`` returned (``emit_batch``: per message).

    The message is on the broker by then: whatever the hook does, ``emit`` returns normally.
    """


@hookspec
def hermes_message_started(message: Message, priority: int) -> None:
    """Called by the Dispatcher when it takes ``message`` on, before any handler runs.

    Every ``started`` is followed by exactly one :func:`hermes_message_finished`
    in the same context, whatever happens (no handler included): on the same
    thread too, unless the plugin is ``hermes_async_safe`` (see above).
    """


@hookspec
def hermes_handler_call(
    message: Message, priority: int, handler: object, driver: Driver
) -> AbstractContextManager[None] | None:
    """Return a context manager to run around one handler call, or None.

    The hook for tracing and error reports: called by the Dispatcher right
    before ``handler.handle(message)``; the manager is entered then and exited
    when the call returned or raised (its ``__exit__`` sees the exception).
    ``driver`` is the Dispatcher's (the broker the message came from, where
    its retry copy goes). The handler's outcome follows the exit:
    :func:`hermes_message_succeeded`, :func:`hermes_message_retried` or
    :func:`hermes_message_gave_up`, in the same context (see above).
    A plugin cannot change the outcome: a manager that raises is logged and
    left out, and one that would swallow the handler's exception does not.
    """


@hookspec
def hermes_message_succeeded(
    message: Message, priority: int, handler: object, result: bool
) -> None:
    """Called by the Dispatcher after ``handler.handle(message)`` succeeded (None or True).

    ``result`` is always True (kept for plugins written when this hook also
    saw False). A handler that returns False has failed:
    :func:`hermes_message_gave_up` follows it instead.
    """


@hookspec
def hermes_message_failed(
    message: Message, priority: int, handler: object, exception: BaseException
) -> None:
    """Called by the Dispatcher after ``handler.handle(message)`` raised ``exception``.

    Then either :func:`hermes_message_retried` or :func:`hermes_message_gave_up`
    follows for the same handler.
    """


@hookspec
def hermes_message_retried(
    message: Message, retry: Message, handler: object, exception: BaseException
) -> None:
    """Called by the Dispatcher after it sent ``retry``, the copy of a failed ``message``.

    ``exception`` is what ``handler`` raised.
    """


@hookspec
def hermes_message_deferred(message: Message, key: str, wait_s: float) -> None:
    """Called by the Dispatcher when ``message`` was over the limit of ``key``.

    It was not run: a copy due in ``wait_s`` seconds was sent (no retry is
    used up) and the message in hand is acknowledged.
    """


@hookspec
def hermes_message_gave_up(
    message: Message,
    priority: int,
    handler: object | None,
    reason: str,
    exception: BaseException | None,
    outcome: Outcome,
) -> None:
    """Called by the Dispatcher when ``handler``'s failure on ``message`` ends without a retry.

    That is: the handler returned False, or it raised ``exception`` and is not
    retried (it is not a ``RetryableHandler``, ``can_retry`` said no, its
    retries are used up, or its retry policy raised). ``handler`` is None and
    ``exception`` None when no handler is registered for ``message.type``.
    ``reason`` is the sentence the Dispatcher logs, e.g. ``"gave up after 25
    retries"``; ``outcome`` says the same as a code (RETURNED_FALSE, GAVE_UP,
    NOT_RETRYABLE, TIME_LIMIT, NO_HANDLER). Called once per such handler; the message is sent to the
    Dispatcher's failed-message store (when it has one) after its last handler.
    """


@hookspec
def hermes_message_finished(
    message: Message, priority: int, result: bool, outcome: Outcome
) -> None:
    """Called by the Dispatcher after every handler of ``message`` ran (or none was found).

    Always after a :func:`hermes_message_started` for the same message, in
    its context. ``outcome`` is the message's
    :class:`~hermes.core.Outcome` (SUCCEEDED when every handler succeeded,
    else the first handler's that did not); ``result`` is
    ``outcome is Outcome.SUCCEEDED``.
    """


@hookspec
def hermes_job_finished(record: JobRecord, message: Message | None) -> None:
    """Called when a job's record reached a final state, by the worker that wrote it.

    Only with job records on (``records=``, ``--results-url``). ``record`` is
    the :class:`~hermes.core.jobs.JobRecord` as stored; ``record.state`` is
    one of ``succeeded``, ``given_up``, ``cancelled`` (while it ran, or found
    cancelled when taken), ``expired`` (found expired when taken) or ``lost``.

    The Dispatcher calls it once its last handler ended (or it skipped the
    message), after writing the record and before
    :func:`hermes_message_finished`, on the thread that ran the handlers, with
    the ``message``. ``lost`` is found by the worker that swept for lost jobs,
    on its watching thread, with ``message`` None: the message died with its
    worker. A job cancelled or expired whose message no worker took again is
    not reported by anyone.
    """


@hookspec
def hermes_message_rejected(body: str | bytes, priority: int, reason: str) -> None:
    """Called by the Worker when a body the broker handed over is not a Hermes message.

    It is set aside by the driver (quarantine, dead-letter, or deleted) and
    never reaches a handler, so no ``started``/``finished`` pair is called for it.
    """


@hookspec(firstresult=True)
def hermes_worker_metrics(port: int, url: str, host: str) -> str | None:
    """Serve the worker's metrics on ``host:port``; return where (``http://127.0.0.1:9100/metrics``).

    firstresult: the first plugin that serves them answers; None from every
    plugin means none is installed. Called by ``hermes worker --metrics-port``
    before it starts handling; ``url`` is the worker's broker URL, for
    sampling queue depth on a connection of the plugin's own. ``host`` is
    127.0.0.1 unless the user named another address (``--metrics-host``).
    In a worker pool (``--processes N``) it is called once, in a helper
    process of the supervisor's that does nothing else: the threads the
    plugin starts run there, never in the process that forks the workers.
    """


@hookspec
def hermes_worker_process_exited(pid: int) -> None:
    """Called by the supervisor of ``hermes worker --processes N`` after it reaped child ``pid``.

    In the supervisor, before a replacement starts. For a plugin that keeps
    state per process outside it (prometheus_client's multiprocess mode drops
    the dead process's live gauges here).
    """


@hookspec
def hermes_process_exiting() -> None:
    """Called in a worker process that is about to exit: flush what is buffered, now.

    A child of ``hermes worker --processes N`` calls it as the last thing
    before it leaves through ``os._exit``, which skips ``atexit`` handlers and
    so the exit-time flush of an SDK (a tracer provider's batched spans, an
    error reporter's queue): without this hook what they hold is lost. A
    single ``hermes worker`` calls it at the end of its run, whatever ended
    it. Not called by a :class:`~hermes.core.Worker` run from library code:
    there the process exits normally and ``atexit`` runs.

    Once per process, on the main thread, after the run and its handlers have
    finished (a handler that outlived the grace period may still run). Keep it
    bounded in time -- a flush with a timeout of a few seconds -- or a pool's
    supervisor kills the child once the grace period is over.
    """


@hookspec
def hermes_tick(entry: Entry, tick: Tick, fired: bool) -> None:
    """Called by a scheduler for each periodic tick it settled: emitted or skipped.

    ``fired`` True: this scheduler won the tick's claim and its message is on
    the broker. False: the tick was missed (every scheduler was down) and the
    entry's catch-up policy skipped it; the scheduler that won its claim
    reports it. Ticks another scheduler took are not reported, so adding up
    every scheduler's calls counts each tick once.
    """


@hookspec
def hermes_emit_call(
    message: Message, priority: int, driver: Driver
) -> AbstractContextManager[Mapping[str, str] | None] | None:
    """Return a context manager to run around sending one emitted message, or None.

    The hook for tracing on the producer side: called by :meth:`Emitter.emit`
    (``emit_batch``: once per message, every manager entered before the one
    batch send) right before ``driver.send``. The manager is entered then; its
    ``__enter__`` may return headers to add to the message -- a trace
    context, say -- and the message sent (and passed to
    :func:`hermes_message_emitted`) is ``message`` with them, a plugin's names
    replacing the message's own. It is exited when the send returned or raised
    (its ``__exit__`` sees the exception). The next implementation is called
    with the headers of the ones before it already added.

    Retry copies the Dispatcher sends are not emits: they keep the headers the
    message had, so every run of a job stays tied to the emit that started it.
    As with :func:`hermes_handler_call`, a plugin cannot change the outcome: an
    implementation that raises (or returns headers a :class:`Message` refuses)
    is logged and left out, and the message is sent anyway.
    """


@hookspec
def hermes_cli_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add subcommands of ``hermes`` to ``commands``, the ``add_subparsers()`` of ``hermes``.

    Called by ``hermes`` each time it builds its parser, after core's own
    commands, so a separate distribution can add one (hermes-dashboard adds
    ``hermes dashboard``). Each implementation adds its parsers like a core
    command module does: ``parser = commands.add_parser("name", help=...)``,
    then ``parser.set_defaults(run=function)``, where ``function(args) -> int``
    returns the exit code and raises ``CliError``-like mistakes as
    :class:`~hermes.core.HermesError` or ``SystemExit(2)`` after one line on
    stderr. A name core already has raises in argparse: pick another. An
    implementation that raises is logged and skipped; ``hermes`` goes on
    without its commands.
    """
