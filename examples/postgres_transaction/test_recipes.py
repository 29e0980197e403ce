"""The two recipes on a real server: commit -> handled once; rollback -> never handled."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hermes_test_services import ensure_postgres
from hermes_test_support import eventually

from hermes.core import Message, Worker
from hermes.drivers.postgres import PostgresDriver

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def database(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """The server's URL, with HERMES_URL and ORDERS_TABLE of the test's own; dropped after."""
    url = ensure_postgres()
    name = f"ex_{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("HERMES_URL", f"{url}?table={name}_jobs")
    monkeypatch.setenv("ORDERS_TABLE", f"{name}_orders")
    monkeypatch.setenv("DATABASE_URL", url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name}_orders (id serial PRIMARY KEY, item text)")
    yield url, name
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}_orders, {name}_jobs, {name}_jobs_rejected")


@pytest.fixture
def handled(database: tuple[str, str]) -> Iterator[list[Message]]:
    """What a worker on HERMES_URL handled, in order; the worker runs for the test."""
    from hermes.core import connect

    driver = connect(os.environ["HERMES_URL"])
    assert isinstance(driver, PostgresDriver)
    seen: list[Message] = []
    worker = Worker(driver, lambda message, priority: seen.append(message) or True,
                    handle_signals=False)  # fmt: skip
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    yield seen
    worker.stop()
    thread.join(10)
    driver.close()


def sentinel_after(seen: list[Message]) -> list[str]:
    """Send a last message and wait for it: anything due before it was handled first."""
    from examples.postgres_transaction import sqlalchemy_orders

    sqlalchemy_orders.jobs().send(Message("sentinel"))
    eventually(lambda: any(m.type == "sentinel" for m in seen), "the sentinel")
    return [m.type for m in seen]


def test_sqlalchemy_commit_handles_the_job_once_and_rollback_never(database, handled):
    from sqlalchemy import create_engine, func, select
    from sqlalchemy.orm import Session

    from examples.postgres_transaction import sqlalchemy_orders
    from examples.postgres_transaction.sqlalchemy_orders import Order, place_order

    sqlalchemy_orders.jobs.cache_clear()
    Order.__table__.name = os.environ["ORDERS_TABLE"]
    url, _ = database
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with Session(engine) as session, session.begin():
        order_id = place_order(session, "book").id
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        place_order(session, "never")
        raise RuntimeError("rolled back")
    assert sentinel_after(handled) == ["send-receipt", "sentinel"]
    assert handled[0].payload == {"order": order_id, "item": "book"}
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Order)) == 1
    engine.dispose()
    sqlalchemy_orders.jobs().close()
    sqlalchemy_orders.jobs.cache_clear()


def test_django_atomic_commit_handles_the_job_once_and_rollback_never(database, handled):
    pytest.importorskip("django")
    run = [sys.executable, "-m", "examples.postgres_transaction.place_django_order"]
    # The Django app's test, earlier in the session, sets its own settings module in
    # os.environ; the recipe's process must not inherit it.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "examples.postgres_transaction.django_settings"}
    place = functools.partial(subprocess.run, cwd=ROOT, env=env, capture_output=True, text=True)
    committed = place([*run, "book"])
    assert committed.returncode == 0, committed.stderr
    failed = place([*run, "never", "--fail"])
    assert failed.returncode == 1, failed.stderr
    assert sentinel_after(handled) == ["send-receipt", "sentinel"]
    from examples.postgres_transaction import sqlalchemy_orders

    sqlalchemy_orders.jobs().close()
    sqlalchemy_orders.jobs.cache_clear()
