"""Fixtures for the Redis driver's tests: every test gets its own keys on the shared Redis."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hermes_test_support import DEADLINE_S, StopFlag

from hermes.core import Message, compat
from hermes.drivers.redis import RedisSetDriver


@dataclass
class Worker:
    """``driver.wait()`` running in a thread, recording what it was given."""

    driver: RedisSetDriver
    handled: list[tuple[Message, int]] = field(default_factory=list)
    error: BaseException | None = None
    stop: StopFlag = field(default_factory=StopFlag)
    thread: threading.Thread | None = None

    def start(self, priorities: Sequence[int] = ()) -> Worker:
        compat.set_shutdown(self.driver, self.stop)

        def run() -> None:
            try:
                compat.wait(self.driver, self._record, priorities)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    def _record(self, message: Message, priority: int) -> bool:
        self.handled.append((message, priority))
        return True

    def ids(self) -> list[str]:
        return [message.id for message, _ in self.handled]

    def join(self) -> None:
        """Stop the worker and wait for its thread; re-raise what ``wait()`` raised."""
        assert self.thread is not None
        self.stop.shutdown()
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive(), "wait() did not return after shutdown"
        if self.error is not None:
            raise self.error


@pytest.fixture
def namespace() -> str:
    """A key prefix no other test uses."""
    return f"hermes-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def client(redis_url: str, namespace: str) -> Iterator[redis.Redis[Any]]:
    """A client on the shared Redis; every key under the test's namespace is deleted after."""
    client: redis.Redis[Any] = redis.Redis.from_url(redis_url)
    yield client
    keys = list(client.scan_iter(match=f"{namespace}*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def driver(client: redis.Redis[Any], namespace: str) -> RedisSetDriver:
    """A driver whose keys are the test's own: ``<namespace>`` and ``<namespace>_schedule``."""
    return RedisSetDriver(
        client, key=namespace, schedule_key=f"{namespace}_schedule", refresh_interval=0.2
    )


@pytest.fixture
def start_worker() -> Iterator[Callable[..., Worker]]:
    """Start ``driver.wait()`` in a thread; stopped at the end of the test."""
    workers: list[Worker] = []

    def start(driver: RedisSetDriver, priorities: Sequence[int] = ()) -> Worker:
        worker = Worker(driver).start(priorities)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop.shutdown()
    for worker in workers:
        if worker.thread is not None:
            worker.thread.join(DEADLINE_S)


@contextlib.contextmanager
def _redis_server(port: int, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    import hermes_test_services

    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed; tools/services.py installs it with apt")
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", *args]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        hermes_test_services.wait_for_port(port, 30, "redis-server", server)
        yield server
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture(scope="session")
def redis_server() -> Callable[..., contextlib.AbstractContextManager[subprocess.Popen[bytes]]]:
    """``with redis_server(port, *options):`` a throwaway redis-server of the test's own.

    For what the shared server on 6379 must never see: a restart, a password.
    """
    return _redis_server
