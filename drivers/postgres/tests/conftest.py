"""Fixtures for the PostgreSQL driver's tests: every test gets tables of its own."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hermes_test_services import ensure_postgres
from hermes_test_support import DEADLINE_S, eventually

from hermes.core import Message, Worker, connect
from hermes.drivers.postgres import PostgresDriver


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """``postgresql://postgres@127.0.0.1:5432/test``; a server is started if nothing listens."""
    return str(ensure_postgres())


@pytest.fixture
def table() -> str:
    """A table name no other test uses."""
    return f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def app_name(table: str) -> str:
    """The application_name of the test's driver connections, for pg_stat_activity."""
    return f"hermes-test-{table}"


@pytest.fixture
def make_driver(
    postgres_url: str, table: str, app_name: str
) -> Iterator[Callable[..., PostgresDriver]]:
    """``make_driver(**options)``: drivers on the test's table; its tables are dropped after."""
    drivers: list[PostgresDriver] = []

    def make(**options: Any) -> PostgresDriver:
        query = {"table": table, "application_name": app_name, "lease_timeout": "2"}
        query.update({key: str(value) for key, value in options.items()})
        url = postgres_url + "?" + "&".join(f"{key}={value}" for key, value in query.items())
        driver = connect(url)
        assert isinstance(driver, PostgresDriver)
        drivers.append(driver)
        return driver

    yield make
    if drivers:
        cleaner = make()
        try:
            cleaner.teardown()
        finally:
            for driver in drivers:
                driver.close()


@pytest.fixture
def driver(make_driver: Callable[..., PostgresDriver]) -> PostgresDriver:
    return make_driver()


@pytest.fixture
def sql(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection of the test's own (autocommit), to look at the tables."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        yield conn


@dataclass
class Running:
    """A core :class:`Worker` on a thread, recording what its handler was given."""

    worker: Worker | None = None
    handled: list[tuple[Message, int]] = field(default_factory=list)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def types(self) -> list[str]:
        return [message.type for message, _ in self.handled]

    def wait_for(self, count: int) -> list[str]:
        eventually(lambda: len(self.handled) >= count, f"{count} message(s) handled")
        return self.types()

    def stop(self) -> None:
        assert self.worker is not None and self.thread is not None
        self.worker.stop()
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error


@pytest.fixture
def run_worker() -> Iterator[Callable[..., Running]]:
    """``run_worker(driver, priorities=(), concurrency=1)``: stopped at the end of the test."""
    running: list[Running] = []

    def start(
        driver: PostgresDriver, priorities: Sequence[int] = (), concurrency: int = 1
    ) -> Running:
        run = Running()

        def handle(message: Message, priority: int) -> bool:
            run.handled.append((message, priority))
            return True

        run.worker = Worker(
            driver,
            handle,
            priorities=priorities,
            concurrency=concurrency,
            handle_signals=False,
            grace_s=5,
        )

        def target() -> None:
            try:
                assert run.worker is not None
                run.worker.run()
            except BaseException as exc:
                run.error = exc

        run.thread = threading.Thread(target=target, daemon=True)
        run.thread.start()
        running.append(run)
        return run

    yield start
    for run in running:
        assert run.worker is not None and run.thread is not None
        run.worker.stop()
    for run in running:
        assert run.thread is not None
        run.thread.join(DEADLINE_S)
