"""``HermesBackend``: Django's task backend contract, kept by Hermes messages and job records.

``task.enqueue(*args, **kwargs)`` emits one Hermes message:

* its **type** is the task function's module path (``myapp.tasks.send_mail``),
  which is what ``manage.py hermes_worker`` registers the function under;
* its **payload** is ``{"args": [...], "kwargs": {...}}``, JSON only: an
  argument that is not is refused with a ``TypeError`` naming it (what
  Django's own ``TaskResult`` raises for one), before anything is sent;
* its **id** is the ``TaskResult``'s id;
* a task's ``run_after`` is the message's ``execute_at``.

**Priorities.** Hermes keeps one queue per priority (an integer, higher first,
default 100) and a worker reads the queues it knows from the highest down.
A Django priority P (-100 to 100) is sent at Hermes priority ``100 + P``: the
order is kept, Django's default 0 is Hermes's default 100 (the queue every
worker reads, and where Hermes puts retry copies), and the numbers stay
within 0 to 200 where PHP Hermes deployments name theirs. Only the Django
priorities listed in ``OPTIONS["priorities"]`` get a queue (0 always has one):
each queue is one more place every worker looks, so they are not made for
all 201 values; a task with another priority is refused by
:meth:`HermesBackend.validate_task` (``InvalidTask``), which names the
option. The queue of Hermes priority P is named ``<key>_priority_<P>``, as
``hermes worker --priority P`` names it, so ``hermes stats`` shows it. On
Redis, a message with a future ``execute_at`` lands on the default priority
when due, like every delayed Hermes message there.

**Queues.** Django's ``QUEUES`` lists the queue names a task may use
(Django's own check). Every queue is on ``OPTIONS["url"]`` unless
``OPTIONS["queue_urls"]`` gives it a broker URL of its own; a worker reads one
URL, so ``manage.py hermes_worker --queue-name NAME`` reads the queue NAME.
Queues that share a URL share their messages: give a queue its own URL (a
Redis ``prefix`` or ``key``, a PostgreSQL ``queue``) for workers of its own.

**Results.** With ``OPTIONS["results_url"]`` (a Hermes records store:
``redis://``, ``postgresql://``, ``file://``, ``memory://``) each message's job
record is kept and :meth:`HermesBackend.get_result` reads it
(``supports_get_result`` is then True); without it results cannot be read.
The status of a job record, by its :class:`~hermes.core.jobs.JobState`:

============================ ============= ==============================================
Hermes state                 Django status why
============================ ============= ==============================================
waiting, scheduled           READY         enqueued, not started
failed                       READY         a handler failed and a retry copy is due
running                      RUNNING
succeeded                    SUCCESSFUL
given_up, cancelled,         FAILED        it raised, or never ran and never will
expired, lost
============================ ============= ==============================================

A fetched result's ``errors`` has one entry per failed attempt, with the
exception's class path and traceback; a job that ended without an exception
of its own (cancelled, expired, lost, no handler) has one entry naming
:class:`hermes.core.jobs.JobResultError` and saying why. Hermes records do
not keep a message's payload, so a *fetched* result's ``args`` and ``kwargs``
are empty; the result ``enqueue`` returned has them.

**Transactions.** ``OPTIONS["enqueue_on_commit"]`` (default False, Django's
own behaviour) sends the message when the current transaction of the
``default`` database commits, and never if it rolls back; outside a
transaction it is sent at once. The ``TaskResult`` is returned at once either
way; until the commit the result cannot be fetched.
"""

from __future__ import annotations

import datetime
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from hermes.core import DEFAULT_PRIORITY, Emitter, Message, connect
from hermes.core.cli import priority_queue_name
from hermes.core.driver import Driver
from hermes.core.jobs import JobError, JobRecord, Jobs, JobState
from hermes.core.schedule import Schedule
from hermes.django._compat import (
    DEFAULT_TASK_PRIORITY,
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from hermes.django._periodic import PeriodicTask, declared, from_options, schedule_of

#: Known ``OPTIONS`` keys (anything else is a typo, refused at start).
OPTION_NAMES = frozenset(
    {
        "url",
        "results_url",
        "failed_url",
        "queue_urls",
        "priorities",
        "enqueue_on_commit",
        "periodic",
    }
)

#: The Django status of each Hermes job state (see the module's table).
STATUS_OF: Mapping[JobState, TaskResultStatus] = {
    JobState.WAITING: TaskResultStatus.READY,
    JobState.SCHEDULED: TaskResultStatus.READY,
    JobState.FAILED: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobState.GIVEN_UP: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
    JobState.EXPIRED: TaskResultStatus.FAILED,
    JobState.LOST: TaskResultStatus.FAILED,
}

#: The class path a failure without an exception of its own is reported under.
NO_EXCEPTION_CLASS = "hermes.core.jobs.JobResultError"


def hermes_priority(django_priority: int) -> int:
    """The Hermes priority a Django priority is sent at: ``100 + P`` (0 -> the default 100)."""
    return DEFAULT_PRIORITY + django_priority


def django_priority(hermes_priority: int) -> int:
    """The Django priority of a Hermes priority, the inverse of :func:`hermes_priority`."""
    return hermes_priority - DEFAULT_PRIORITY


def set_up_priorities(driver: Driver, priorities: Sequence[int]) -> None:
    """Give ``driver`` a queue for each Django priority in ``priorities`` (0 needs none)."""
    for priority in priorities:
        if priority != DEFAULT_TASK_PRIORITY:
            hermes = hermes_priority(priority)
            driver.setup_priority_queue(priority_queue_name(driver, hermes), hermes)


class HermesBackend(BaseTaskBackend):
    """A Django task backend that sends each task to a Hermes broker.

    Settings::

        TASKS = {
            "default": {
                "BACKEND": "hermes.django.HermesBackend",
                "QUEUES": ["default", "emails"],
                "OPTIONS": {
                    "url": "redis://localhost:6379/0",          # required
                    "results_url": "redis://localhost:6379/1",  # to read results
                    "failed_url": "redis://localhost:6379/1?key=failed",  # failed tasks
                    "queue_urls": {"emails": "redis://localhost:6379/0?key=emails"},
                    "priorities": [-10, 10],                   # besides 0
                    "enqueue_on_commit": False,
                },
            }
        }

    A bad option is a Django system check error (``hermes_django.E001``)
    naming the backend's alias and the option, so ``manage.py`` commands
    stop with one line, and an ``ImproperlyConfigured`` when the backend is
    used anyway. The module's docstring
    says how priorities, queues, statuses and transactions map onto Hermes.
    """

    supports_defer = True
    supports_async_task = True
    supports_priority = True
    #: True when ``OPTIONS["results_url"]`` names a records store (set per instance).
    supports_get_result = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        #: What is wrong with ``OPTIONS``; None when nothing is.
        self.configuration_error: ImproperlyConfigured | None = None
        # Usable values until a problem is found: Django builds every backend
        # for its checks, which must report the problem, not crash on it.
        #: The broker of every queue not in :attr:`queue_urls`.
        self.url = ""
        #: The records store results are read from; None: results cannot be read.
        self.results_url: str | None = None
        #: Where workers keep the tasks that failed (``hermes worker --failed-url``),
        #: which the admin lists and retries; None: failed tasks are not kept.
        self.failed_url: str | None = None
        #: Queue name -> its own broker URL.
        self.queue_urls: dict[str, str] = {}
        #: The Django priorities that have a queue, 0 included.
        self.priorities: tuple[int, ...] = (DEFAULT_TASK_PRIORITY,)
        #: Send when the ``default`` database's transaction commits.
        self.enqueue_on_commit = False
        #: ``OPTIONS["periodic"]``: name -> entry (see :mod:`hermes.django._periodic`).
        self.periodic: Mapping[str, Any] | None = None
        try:
            self._configure(self.options)
        except ImproperlyConfigured as exc:
            self.configuration_error = exc

    def _configure(self, options: Mapping[str, Any]) -> None:
        unknown = sorted(set(options) - OPTION_NAMES)
        if unknown:
            raise self._improper(f"unknown OPTIONS {unknown}; known: {sorted(OPTION_NAMES)}")
        url = options.get("url")
        if not isinstance(url, str) or not url:
            raise self._improper(
                'OPTIONS["url"] must be a Hermes broker URL, e.g. "redis://localhost:6379/0"'
            )
        self.url = url
        results_url = options.get("results_url")
        if results_url is not None and (not isinstance(results_url, str) or not results_url):
            raise self._improper(
                'OPTIONS["results_url"] must be the URL of a Hermes records store '
                "(redis://, postgresql://, file://, memory://), or left out"
            )
        self.results_url = results_url
        self.supports_get_result = results_url is not None
        failed_url = options.get("failed_url")
        if failed_url is not None and (not isinstance(failed_url, str) or not failed_url):
            raise self._improper(
                'OPTIONS["failed_url"] must be the URL of a Hermes failed store '
                "(redis://, postgresql://, file://), or left out"
            )
        self.failed_url = failed_url
        self.queue_urls = self._checked_queue_urls(options.get("queue_urls"))
        self.priorities = self._checked_priorities(options.get("priorities"))
        on_commit = options.get("enqueue_on_commit", False)
        if not isinstance(on_commit, bool):
            raise self._improper(
                f'OPTIONS["enqueue_on_commit"] must be True or False, got {on_commit!r}'
            )
        self.enqueue_on_commit = on_commit
        periodic = options.get("periodic")
        if periodic is not None and not isinstance(periodic, Mapping):
            raise self._improper(
                f'OPTIONS["periodic"] must be a dict of name -> entry, got {periodic!r}'
            )
        self.periodic = periodic

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's system check: a bad option is an error there, one line naming it."""
        if self.configuration_error is not None:
            return [checks.Error(str(self.configuration_error), id="hermes_django.E001")]
        try:
            from_options(self.periodic, self._periodic_where)
        except ImproperlyConfigured as exc:
            return [checks.Error(str(exc), id="hermes_django.E002")]
        return []

    @property
    def _periodic_where(self) -> str:
        return f'TASKS["{self.alias}"]["OPTIONS"]["periodic"]'

    def schedule(self, queue_name: str) -> Schedule:
        """The periodic tasks the workers of ``queue_name`` send (:mod:`hermes.django._periodic`).

        Those declared with ``@periodic`` in the modules imported so far and
        in ``OPTIONS["periodic"]``, whose task uses this backend and a queue
        on the same broker as ``queue_name``.
        """
        self.configured()
        here = self.url_of(queue_name)
        entries = [
            entry
            for entry in (*declared(), *from_options(self.periodic, self._periodic_where))
            if entry.task.backend == self.alias and self.url_of(entry.task.queue_name) == here
        ]
        for entry in entries:
            self.validate_task(entry.task)

        def payload(entry: PeriodicTask) -> dict[str, Any]:
            return _payload(entry.task, entry.args, entry.kwargs)

        return schedule_of(entries, payload, lambda task: hermes_priority(task.priority))

    def configured(self) -> None:
        """Raise the ``ImproperlyConfigured`` of a bad option, if there is one."""
        if self.configuration_error is not None:
            raise self.configuration_error

    def _improper(self, text: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(f'TASKS["{self.alias}"] (hermes.django.HermesBackend): {text}')

    def _checked_queue_urls(self, given: object) -> dict[str, str]:
        if given is None:
            return {}
        if not isinstance(given, Mapping):
            raise self._improper(
                f'OPTIONS["queue_urls"] must be a dict of queue name -> URL, got {given!r}'
            )
        checked: dict[str, str] = {}
        for name, url in given.items():
            if self.queues and name not in self.queues:
                raise self._improper(
                    f'OPTIONS["queue_urls"] names queue {name!r}, which is not in QUEUES '
                    f"{sorted(self.queues)}"
                )
            if not isinstance(url, str) or not url:
                raise self._improper(
                    f'OPTIONS["queue_urls"][{name!r}] must be a broker URL, got {url!r}'
                )
            checked[str(name)] = url
        return checked

    def _checked_priorities(self, given: object) -> tuple[int, ...]:
        if given is None:
            return (DEFAULT_TASK_PRIORITY,)
        if isinstance(given, str) or not isinstance(given, Sequence):
            raise self._improper(
                f'OPTIONS["priorities"] must be a list of whole numbers, got {given!r}'
            )
        for priority in given:
            if (
                isinstance(priority, bool)
                or not isinstance(priority, int)
                or not TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY
            ):
                raise self._improper(
                    f'OPTIONS["priorities"] holds {priority!r}: each must be a whole number '
                    f"from {TASK_MIN_PRIORITY} to {TASK_MAX_PRIORITY}"
                )
        return tuple(sorted({DEFAULT_TASK_PRIORITY, *given}, reverse=True))

    # Where messages go ------------------------------------------------------

    def url_of(self, queue_name: str) -> str:
        """The broker URL of the Django queue ``queue_name``."""
        self.configured()
        return self.queue_urls.get(queue_name, self.url)

    def emitter(self, queue_name: str) -> Emitter:
        """The process's Emitter for ``queue_name``: one per URL, shared by every thread."""
        return _emitter(self.url_of(queue_name), self.results_url, self.priorities)

    def jobs(self) -> Jobs:
        """The process's records store; ``NotImplementedError`` without ``results_url``."""
        self.configured()
        if self.results_url is None:
            raise NotImplementedError(
                f'TASKS["{self.alias}"] keeps no results: give OPTIONS["results_url"], a Hermes '
                "records store such as redis://localhost:6379/1, to read them"
            )
        return _jobs(self.results_url)

    # The backend contract ---------------------------------------------------

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Django's checks, and a priority this backend has a queue for.

        A backend with a bad option passes what it cannot judge: ``@task``
        validates as a module is imported (by the URL checks of ``manage.py``,
        say), and the option's system check error is what names the mistake;
        an enqueue then raises its ``ImproperlyConfigured``.
        """
        super().validate_task(task)
        if self.configuration_error is None and task.priority not in self.priorities:
            raise InvalidTask(
                f"priority {task.priority} of task {task.module_path} has no queue on backend "
                f'{self.alias!r}: add it to OPTIONS["priorities"] (now {list(self.priorities)})'
            )

    def enqueue(
        self, task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult[Any]:
        """Send ``task`` with its arguments; the result is READY with the message's id.

        Raises ``InvalidTask`` for a task this backend cannot run and
        ``TypeError`` for an argument that is not JSON, before anything is sent.
        """
        result, send = self._prepared(task, args, kwargs)
        if self.enqueue_on_commit:
            transaction.on_commit(send)
        else:
            send()
        return result

    async def aenqueue(
        self, task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult[Any]:
        """:meth:`enqueue` from async code: the event loop never waits on the broker.

        The send runs on a thread of its own, not Django's thread for sync
        code, so a slow broker holds up no other request's sync work. With
        ``enqueue_on_commit`` only the ``on_commit`` registration runs in
        Django's thread for sync code (where the caller's transaction is);
        the send then happens when that transaction commits.
        """
        result, send = self._prepared(task, args, kwargs)
        if self.enqueue_on_commit:
            await sync_to_async(transaction.on_commit, thread_sensitive=True)(send)
        else:
            await sync_to_async(send, thread_sensitive=False)()
        return result

    def _prepared(
        self, task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[TaskResult[Any], Callable[[], None]]:
        """The READY result of ``task``'s message and the function that sends it.

        Checks the backend, the task and its arguments; talks to no broker.
        """
        self.configured()
        self.validate_task(task)
        payload = _payload(task, args, kwargs)
        message = Message(
            task.module_path,
            payload,
            execute_at=task.run_after.timestamp() if task.run_after is not None else None,
        )
        result: TaskResult[Any] = TaskResult(
            task=task,
            id=message.id,
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        priority = hermes_priority(task.priority)

        def send() -> None:
            # The Emitter (and its broker connection) is made by the first send.
            self.emitter(task.queue_name).emit(message, priority)
            # Robust: the message is sent, a receiver's exception would only hide that.
            task_enqueued.send_robust(type(self), task_result=result)

        return result, send

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The result of job ``result_id`` as its record says now.

        Raises ``TaskResultDoesNotExist`` when the store has no record of it
        (never sent, rolled back, forgotten after the store's TTL) or when the
        record is of a Hermes job that is not a Django task.
        """
        record = self.jobs().get(result_id)
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        return self._result_of(record)

    async def aget_result(self, result_id: str) -> TaskResult[Any]:
        """:meth:`get_result` on a worker thread: the event loop never waits on the store."""
        return await sync_to_async(self.get_result, thread_sensitive=False)(result_id)

    def _result_of(self, record: JobRecord) -> TaskResult[Any]:
        task = _task_of(record)
        if record.priority is not None:
            priority = django_priority(record.priority)
            if priority != task.priority and TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY:
                task = task.using(priority=priority)
        attempts = record.attempts
        status = STATUS_OF[record.state]
        result: TaskResult[Any] = TaskResult(
            task=task,
            id=record.id,
            status=status,
            enqueued_at=_datetime(record.emitted_at),
            started_at=_datetime(record.started_at),
            finished_at=_datetime(record.finished_at) if record.state.final else None,
            last_attempted_at=_datetime(attempts[-1].started_at) if attempts else None,
            args=[],
            kwargs={},
            backend=self.alias,
            errors=_errors(record),
            worker_ids=[attempt.worker for attempt in attempts],
        )
        if record.has_result and status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", record.result)
        return result


def _task_of(record: JobRecord) -> Task[Any, Any]:
    """The ``@task`` the record's type names; ``TaskResultDoesNotExist`` when it names none."""
    try:
        found: object = import_string(record.type)
    except ImportError:
        found = None  # a plain Hermes type (``invoice.total``) or a task since removed
    if not isinstance(found, Task):
        raise TaskResultDoesNotExist(
            f"{record.id}: a Hermes job of type {record.type!r}, which is not a Django task "
            "this process can import"
        )
    return found


def _errors(record: JobRecord) -> list[TaskError]:
    """One ``TaskError`` per failed attempt; one for a failure without an exception."""
    errors = [
        _task_error(attempt.error) for attempt in record.attempts if attempt.error is not None
    ]
    if not errors and record.error is not None:
        errors.append(_task_error(record.error))
    if not errors and STATUS_OF[record.state] == TaskResultStatus.FAILED:
        errors.append(
            TaskError(exception_class_path=NO_EXCEPTION_CLASS, traceback=f"job {record.state}")
        )
    return errors


def _task_error(error: JobError) -> TaskError:
    if error.type:
        return TaskError(exception_class_path=error.type, traceback=error.traceback or str(error))
    # A reason rather than an exception: no handler, returned False, set aside.
    return TaskError(exception_class_path=NO_EXCEPTION_CLASS, traceback=error.message)


def _datetime(timestamp: float | None) -> datetime.datetime | None:
    """A UNIX time as Django wants it: aware UTC with ``USE_TZ``, else naive local time."""
    if timestamp is None:
        return None
    if settings.USE_TZ:
        return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return datetime.datetime.fromtimestamp(timestamp)


def _key(name: object, where: str, task: Task[Any, Any]) -> str:
    if not isinstance(name, str):
        raise TypeError(
            f"task {task.module_path}: {where} key {name!r} is a {type(name).__name__}; "
            "JSON object keys are strings"
        )
    return name


def _payload(
    task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """``{"args": [...], "kwargs": {...}}`` as a task's message carries them, JSON only."""
    return {
        "args": [_json(value, f"args[{i}]", task) for i, value in enumerate(args)],
        "kwargs": {
            _key(name, "kwargs", task): _json(value, f"kwargs[{name!r}]", task)
            for name, value in kwargs.items()
        },
    }


def _json(value: Any, where: str, task: Task[Any, Any]) -> Any:
    """``value`` as JSON keeps it (tuples as lists, UTF-8 bytes as text), or a ``TypeError``.

    Accepts what Django's own ``normalize_json`` accepts, except what JSON
    would change or cannot hold: keys that are not strings, NaN and infinities.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise TypeError(f"task {task.module_path}: {where} is {value!r}, which JSON cannot hold")
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise TypeError(
                f"task {task.module_path}: {where} is bytes that are not UTF-8 text; "
                "JSON holds text only"
            ) from None
    if isinstance(value, Mapping):
        return {
            _key(name, where, task): _json(item, f"{where}[{name!r}]", task)
            for name, item in value.items()
        }
    if isinstance(value, Sequence):
        return [_json(item, f"{where}[{i}]", task) for i, item in enumerate(value)]
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise TypeError(
        f"task {task.module_path}: {where} is a {kind}, not JSON; "
        "pass what JSON holds (ids, text, numbers, lists, dicts)"
    )


#: One Emitter per (URL, records, priorities), one Jobs per records URL, in this process.
_emitters: dict[tuple[str, str | None, tuple[int, ...]], Emitter] = {}
_stores: dict[str, Jobs] = {}
_lock = threading.RLock()


def _jobs(results_url: str) -> Jobs:
    with _lock:
        jobs = _stores.get(results_url)
        if jobs is None:
            jobs = _stores[results_url] = Jobs(results_url)
        return jobs


def _emitter(url: str, results_url: str | None, priorities: tuple[int, ...]) -> Emitter:
    """The process's Emitter for ``url``; its driver is thread-safe, so every thread shares it."""
    key = (url, results_url, priorities)
    with _lock:
        emitter = _emitters.get(key)
        if emitter is None:
            driver = connect(url)
            set_up_priorities(driver, priorities)
            records = _jobs(results_url) if results_url is not None else None
            emitter = _emitters[key] = Emitter(driver, records=records)
        return emitter


def close_connections() -> None:
    """Close the brokers and records stores this process's backends opened.

    The next enqueue or result opens them again: for tests, and for a process
    that forks after using a backend and wants no connection shared with its children.
    """
    with _lock:
        for emitter in _emitters.values():
            emitter.driver.close()
        _emitters.clear()
        for jobs in _stores.values():
            jobs.close()
        _stores.clear()
