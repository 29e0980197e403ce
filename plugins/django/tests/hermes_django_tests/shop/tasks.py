"""The tasks the tests enqueue."""

from __future__ import annotations

import asyncio
from typing import Any

from django.db import connection

from hermes.django import periodic
from hermes.django._compat import task

from . import signals  # noqa: F401 - connects the receivers the worker tests read


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def zero() -> int:
    return 0


@task
def fail(text: str) -> None:
    raise ValueError(text)


@task
def label(name: str) -> str:
    return name


@task
def backend_pid() -> int:
    """The PostgreSQL backend pid of the worker's database connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    return int(row[0])


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
def attempt(context: Any) -> dict[str, Any]:
    return {"id": context.task_result.id, "attempt": context.attempt}


@periodic(every=1)
@task
def tick() -> str:
    """Sent every second by a worker started with --scheduler."""
    return "tick"
