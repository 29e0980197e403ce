"""The handlers of ``manage.py hermes_worker``: every installed app's ``@task`` functions.

``hermes worker --handlers hermes.django.worker:register`` imports this
module, in each worker process (a ``--processes N`` pool's children import it
themselves), and importing it sets Django up (``django.setup()``), so
``DJANGO_SETTINGS_MODULE`` must name the project's settings, as ``manage.py``
sets it. :func:`register` then imports ``<app>.tasks`` of each installed app
that has one and registers every ``@task`` found there (defined there or
imported into it) as the handler of its module path, the type
:class:`~hermes.django.HermesBackend` sends it under.

Each job runs like a Django request: ``django.db.close_old_connections()``
before and after it, so a database connection that broke or outlived
``CONN_MAX_AGE`` since the last job is replaced rather than failing the job.
The function's return value is the job's result (``Result(value)``, so ``0``
and ``False`` are values); an exception fails the job, which Hermes does not
retry (Django tasks have no retry policy). An ``async def`` task runs as a
coroutine on the worker's event loop.

Two environment variables, which ``manage.py hermes_worker`` sets, carry its
options to every process: :data:`BACKEND_ENV` (the ``TASKS`` alias, default
``default``) and :data:`HANDLERS_ENV` (a ``module:object`` of Hermes handlers
registered beside the tasks, as ``hermes worker --handlers`` takes it).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import socket
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import django
from django.core.exceptions import ImproperlyConfigured

if not os.environ.get("DJANGO_SETTINGS_MODULE"):
    raise ImproperlyConfigured(
        "hermes.django.worker sets Django up: set DJANGO_SETTINGS_MODULE to your settings "
        "module, or run the worker with python manage.py hermes_worker"
    )
django.setup()

from asgiref.sync import sync_to_async  # noqa: E402 - after django.setup()
from django.apps import apps  # noqa: E402
from django.db import close_old_connections  # noqa: E402
from django.utils import timezone  # noqa: E402

from hermes.core import Dispatcher, HandlerRegistry, Message, Result  # noqa: E402
from hermes.django._backend import HermesBackend, set_up_priorities  # noqa: E402
from hermes.django._compat import (  # noqa: E402
    DEFAULT_TASK_QUEUE_NAME,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)

#: The ``TASKS`` alias whose priorities the worker reads (default ``default``).
BACKEND_ENV = "HERMES_DJANGO_BACKEND"
#: The Django queue the worker reads (default ``default``): its periodic tasks are scheduled.
QUEUE_ENV = "HERMES_DJANGO_QUEUE"
#: ``module:object`` of Hermes handlers registered beside the tasks.
HANDLERS_ENV = "HERMES_DJANGO_HANDLERS"


def __getattr__(name: str) -> Any:
    """``schedule``: the periodic tasks of the worker's queue, for ``hermes worker --scheduler``.

    Made when first asked for (every installed app's tasks imported first), so
    a worker without ``--scheduler`` never builds it.
    """
    if name == "schedule":
        find_tasks()  # their modules declare the @periodic entries
        return _backend().schedule(os.environ.get(QUEUE_ENV) or DEFAULT_TASK_QUEUE_NAME)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _backend() -> HermesBackend:
    alias = os.environ.get(BACKEND_ENV) or "default"
    backend = task_backends[alias]
    if not isinstance(backend, HermesBackend):
        raise ImproperlyConfigured(
            f'TASKS["{alias}"] is {type(backend).__module__}.{type(backend).__qualname__}, '
            "not hermes.django.HermesBackend: its tasks do not go through Hermes"
        )
    return backend


def register(dispatcher: Dispatcher) -> None:
    """Register every installed app's tasks (and ``$HERMES_DJANGO_HANDLERS``) on ``dispatcher``.

    Also sets up the queue of each priority the backend lists, so the worker
    reads them. Raises ``ImproperlyConfigured`` when the backend is not a
    :class:`~hermes.django.HermesBackend`, and when nothing at all was found.
    """
    backend = _backend()
    backend.configured()
    set_up_priorities(dispatcher.driver, backend.priorities)
    for task in find_tasks():
        # Never retried, and the worker's log says so rather than suggesting a max_retry.
        dispatcher.handler(task.module_path, max_retry=0)(task_handler(task))
    extra = os.environ.get(HANDLERS_ENV)
    if extra:
        register_extra(dispatcher, extra)
    if not dispatcher.registered():
        raise ImproperlyConfigured(
            "no tasks found: no installed app has a tasks module with @task functions, "
            "and no --handlers was given"
        )


def find_tasks() -> list[Task[Any, Any]]:
    """The ``@task`` objects in each installed app's ``tasks`` module, one per module path."""
    found: dict[str, Task[Any, Any]] = {}
    for app in apps.get_app_configs():
        name = f"{app.name}.tasks"
        if importlib.util.find_spec(name) is None:
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, Task):
                found.setdefault(value.module_path, value)
    return list(found.values())


def task_handler(task: Task[Any, Any]) -> Callable[[Message], Any]:
    """The Hermes handler that runs ``task`` for a message ``HermesBackend`` sent.

    Sync or ``async def`` like the task's function; named after the task,
    so the worker's log lines name it. Sends Django's ``task_started`` before
    the function runs and ``task_finished`` after it, with the same
    ``TaskResult`` a ``takes_context`` task sees, as Django's own backends do;
    robustly (``send_robust``, which logs a receiver's exception on
    ``django.dispatch``), since a receiver's mistake must not fail a job that
    ran or is about to.
    """
    function = task.func
    sender = type(task_backends[task.backend])
    if inspect.iscoroutinefunction(function):

        async def run_async(message: Message) -> Result:
            args, kwargs, running = _call(task, message)
            await sync_to_async(close_old_connections)()
            try:
                await task_started.asend_robust(sender, task_result=running)
                try:
                    value = await function(*args, **kwargs)
                except BaseException as exc:  # a time limit or a cancel ends it too
                    await task_finished.asend_robust(sender, task_result=_ended(running, exc))
                    raise
                await task_finished.asend_robust(sender, task_result=_ended(running, None))
            finally:
                await sync_to_async(close_old_connections)()
            return Result(value)

        handler: Callable[[Message], Any] = run_async
    else:

        def run(message: Message) -> Result:
            args, kwargs, running = _call(task, message)
            close_old_connections()
            try:
                task_started.send_robust(sender, task_result=running)
                try:
                    value = function(*args, **kwargs)
                except BaseException as exc:  # a time limit or a cancel ends it too
                    task_finished.send_robust(sender, task_result=_ended(running, exc))
                    raise
                task_finished.send_robust(sender, task_result=_ended(running, None))
            finally:
                close_old_connections()
            return Result(value)

        handler = run
    handler.__name__ = handler.__qualname__ = task.name
    handler.__module__ = function.__module__
    return handler


def _call(
    task: Task[Any, Any], message: Message
) -> tuple[list[Any], dict[str, Any], TaskResult[Any]]:
    """The call's arguments from the payload (the context first for ``takes_context``),
    and the RUNNING ``TaskResult`` the signals and the context carry."""
    payload = message.payload
    if (
        not isinstance(payload, Mapping)
        or not isinstance(payload.get("args", []), list)
        or not isinstance(payload.get("kwargs", {}), dict)
    ):
        raise ValueError(
            f"message #{message.id} for task {task.module_path} has payload {payload!r}; "
            'a task takes {"args": [...], "kwargs": {...}}, as HermesBackend sends it'
        )
    args: list[Any] = list(payload.get("args", []))
    kwargs: dict[str, Any] = dict(payload.get("kwargs", {}))
    running = _running(task, message, list(args), dict(kwargs))
    if task.takes_context:
        args.insert(0, TaskContext(task_result=running))
    return args, kwargs, running


def _running(
    task: Task[Any, Any], message: Message, args: list[Any], kwargs: dict[str, Any]
) -> TaskResult[Any]:
    """The ``TaskResult`` of the job now: RUNNING, on this worker, one attempt per delivery."""
    now = timezone.now()
    return TaskResult(
        task=task,
        id=message.id,
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        last_attempted_at=now,
        finished_at=None,
        args=args,
        kwargs=kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=[f"{socket.gethostname()}:{os.getpid()}"] * (message.retries + 1),
    )


def _ended(running: TaskResult[Any], exc: BaseException | None) -> TaskResult[Any]:
    """``running`` as the function left it: SUCCESSFUL, or FAILED with ``exc`` as its error.

    Changed in place, as Django's own backends change theirs, so a context
    a task kept sees the end too. The return value is the job record's to keep
    (``get_result`` reads it there); the signal's result does not carry it.
    """
    object.__setattr__(running, "finished_at", timezone.now())
    if exc is None:
        object.__setattr__(running, "status", TaskResultStatus.SUCCESSFUL)
    else:
        object.__setattr__(running, "status", TaskResultStatus.FAILED)
        running.errors.append(
            TaskError(
                exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
                traceback="".join(traceback.format_exception(exc)),
            )
        )
    return running


def register_extra(dispatcher: Dispatcher, spec: str) -> None:
    """Register the Hermes handlers ``module:object`` names, as ``hermes worker --handlers`` does.

    ``object`` is a :class:`~hermes.core.HandlerRegistry`, a dict of type ->
    handler (or list of handlers), or a function taking the Dispatcher.
    """
    target = _load(spec)
    if isinstance(target, HandlerRegistry):
        target.register(dispatcher)
    elif isinstance(target, Mapping):
        for type_, value in target.items():
            handlers = value if isinstance(value, list | tuple) else [value]
            dispatcher.register_handlers(str(type_), handlers)
    elif callable(target):
        target(dispatcher)
    else:
        raise ImproperlyConfigured(
            f"--handlers {spec} is a {type(target).__name__}: name a HandlerRegistry, a dict "
            "of type -> handler(s), or a function taking the Dispatcher"
        )


def _load(spec: str) -> object:
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise ImproperlyConfigured(
            f"--handlers {spec!r} must be module:object, e.g. myapp.jobs:handlers"
        )
    target: object = importlib.import_module(module_name)
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ImproperlyConfigured(
                f"--handlers {spec}: module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    return target
