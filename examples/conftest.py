"""What the example apps' tests share: a Redis queue of their own and a real ``hermes worker``.

Each test drives its app in-process with the framework's test client; the
job goes through Redis to a ``hermes worker`` process started from the
repository root, exactly as in production, and the test polls for the job's
effect (an email in the worker's outbox list) until a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

ROOT = Path(__file__).resolve().parents[1]
#: The venv's console script, as `pip install hermes-core` puts it on PATH.
HERMES = shutil.which("hermes", path=str(Path(sys.executable).parent)) or shutil.which("hermes")
#: A database of their own: ``hermes shutdown --url`` on another one stops none of these workers.
DATABASE = 13
#: How long a worker (start-up included) may take to handle one message.
WORKER_S = 30.0


@dataclass
class Queue:
    """One test's Redis queue (a key prefix of its own) and the outbox its worker writes."""

    #: The broker URL app and worker share (``HERMES_URL``).
    url: str
    #: The Redis database, without the prefix.
    database_url: str
    #: The list the example workers push each "sent" email to.
    outbox_key: str
    client: redis.Redis[bytes]

    def outbox(self) -> list[dict[str, Any]]:
        return [json.loads(item) for item in self.client.lrange(self.outbox_key, 0, -1)]


@pytest.fixture
def queue(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Queue]:
    """A queue no other test shares, in ``$HERMES_URL`` for the app under test."""
    database_url = f"{redis_url.rsplit('/', 1)[0]}/{DATABASE}"
    prefix = f"examples-{uuid.uuid4().hex[:8]}:"
    client: redis.Redis[bytes] = redis.Redis.from_url(database_url)
    queue = Queue(f"{database_url}?prefix={prefix}", database_url, f"{prefix}outbox", client)
    monkeypatch.setenv("HERMES_URL", queue.url)
    yield queue
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    output: Path

    def finished(self) -> str:
        """The worker's last line, once it has exited 0 (it runs with ``--max-items``)."""
        code = self.process.wait(WORKER_S)
        text = self.output.read_text()
        assert code == 0, text
        return text.splitlines()[-1]


@contextlib.contextmanager
def running_worker(handlers: str, queue: Queue, tmp_path: Path, items: int = 1) -> Iterator[Worker]:
    """``hermes worker --handlers HANDLERS --max-items ITEMS`` on ``queue``; stopped at the end."""
    assert HERMES is not None, "the hermes console script is not installed"
    command = [HERMES, "worker", "--url", queue.url, "--handlers", handlers,
               "--max-items", str(items)]  # fmt: skip
    with running(command, queue, tmp_path) as worker:
        yield worker


@contextlib.contextmanager
def running(command: list[str], queue: Queue, tmp_path: Path) -> Iterator[Worker]:
    """``command`` run from the repository's root, writing to ``queue``'s outbox; stopped after.

    ``HERMES_URL`` names the queue, for a worker whose settings read it.
    """
    env = {
        **os.environ,
        "HERMES_URL": queue.url,
        "OUTBOX_URL": queue.database_url,
        "OUTBOX_KEY": queue.outbox_key,
    }
    output = tmp_path / "worker.out"
    with output.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield Worker(process, output)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
