"""Receivers of Django's task signals that write what they got to a file, for the worker tests.

Connected when the worker imports the app's tasks (``tasks`` imports this
module) and only while ``$HERMES_DJANGO_TESTS_SIGNALS`` names a file: each
signal appends ``<signal> <id> <status> <first error's class path or ->``.
A task labelled ``raise-in-receiver`` makes the ``task_started`` receiver
raise after writing its line.
"""

from __future__ import annotations

import os
from typing import Any

from hermes.django._compat import TaskResult, task_enqueued, task_finished, task_started

#: The file each signal appends a line to; unset, nothing is written.
SIGNALS_ENV = "HERMES_DJANGO_TESTS_SIGNALS"


def _write(name: str, task_result: TaskResult[Any]) -> None:
    path = os.environ.get(SIGNALS_ENV)
    if not path:
        return
    error = task_result.errors[0].exception_class_path if task_result.errors else "-"
    with open(path, "a") as out:
        out.write(f"{name} {task_result.id} {task_result.status.value} {error}\n")


def on_enqueued(sender: type, task_result: TaskResult[Any], **kwargs: Any) -> None:
    _write("enqueued", task_result)


def on_started(sender: type, task_result: TaskResult[Any], **kwargs: Any) -> None:
    _write("started", task_result)
    if task_result.args == ["raise-in-receiver"]:
        raise RuntimeError("a receiver's own mistake")


def on_finished(sender: type, task_result: TaskResult[Any], **kwargs: Any) -> None:
    _write("finished", task_result)


task_enqueued.connect(on_enqueued, dispatch_uid="hermes-django-tests-enqueued")
task_started.connect(on_started, dispatch_uid="hermes-django-tests-started")
task_finished.connect(on_finished, dispatch_uid="hermes-django-tests-finished")
