"""What the tests share: a test's own queue, a worker process, the backend's settings."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from django.test import override_settings

from hermes_django_tests.settings import tasks_setting

#: The directory of ``manage.py``.
HERE = Path(__file__).resolve().parent.parent
#: A Redis database of their own: ``hermes shutdown --url`` elsewhere stops none of these workers.
DATABASE = 12
#: How long a worker (start-up included) may take to finish a job.
WORKER_S = 30.0


@dataclass
class Queue:
    """One test's broker (and records store), under a key prefix of its own."""

    url: str
    prefix: str
    client: redis.Redis[bytes]

    def keys(self) -> list[bytes]:
        return sorted(self.client.scan_iter(match=f"{self.prefix}*"))


@contextlib.contextmanager
def on_commit_backend(queue: Queue, enqueue_on_commit: bool) -> Iterator[None]:
    """The ``default`` backend with ``enqueue_on_commit`` as given, for the body of the block."""
    setting = tasks_setting(queue.url, queue.url, enqueue_on_commit=enqueue_on_commit)
    with override_settings(TASKS=setting):
        yield


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    output: Path

    @property
    def name(self) -> str:
        """``host:pid``, as the job records name the worker."""
        import socket

        return f"{socket.gethostname()}:{self.process.pid}"

    def log(self) -> str:
        return self.output.read_text()
