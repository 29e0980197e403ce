"""Django's task framework: ``django.tasks`` where it exists (Django 6), else the backport.

The two keep the same backend contract. Where a name differs, the one Django 6
uses is exported: ``InvalidTask`` (the backport's ``InvalidTaskError``).
Tested on Django 6.1 (Python 3.13) and on Django 5.2 with django-tasks 0.12.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:  # typed against the backport, which the typecheck session installs
    from django_tasks import default_task_backend, task, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_PRIORITY,
        DEFAULT_TASK_QUEUE_NAME,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
else:
    try:  # Django 6
        from django.tasks import default_task_backend, task, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import (
            DEFAULT_TASK_PRIORITY,
            DEFAULT_TASK_QUEUE_NAME,
            TASK_MAX_PRIORITY,
            TASK_MIN_PRIORITY,
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
    except ImportError:  # Django 5.2 with the backport
        try:
            from django_tasks import default_task_backend, task, task_backends
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import (
                DEFAULT_TASK_PRIORITY,
                DEFAULT_TASK_QUEUE_NAME,
                TASK_MAX_PRIORITY,
                TASK_MIN_PRIORITY,
                Task,
                TaskContext,
                TaskError,
                TaskResult,
                TaskResultStatus,
            )
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued, task_finished, task_started
        except ImportError as exc:
            raise ImproperlyConfigured(
                "hermes.django needs Django's task framework: Django 6's django.tasks, or on "
                "Django 5.2 the django-tasks backport (pip install django-tasks)"
            ) from exc

#: Whether Django's own ``django.tasks`` is in use (else the backport, which
#: must then be in ``INSTALLED_APPS`` as ``"django_tasks"``).
BUILT_IN = BaseTaskBackend.__module__.startswith("django.tasks")

__all__ = [
    "BUILT_IN",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "default_task_backend",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
