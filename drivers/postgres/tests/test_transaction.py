"""send_in: a message inserted in the application's own transaction lives or dies with it.

There is one write -- the job row, in the caller's transaction -- so no
moment exists between "the order committed" and "the job was emitted" at
which a crash could separate them.
"""

from __future__ import annotations

import psycopg
import pytest
from hermes_test_support import DEADLINE_S

from hermes.core import Message, SerializeError


class Rollback(Exception):
    pass


@pytest.fixture
def app(postgres_url, table):
    """The application's own connection (not autocommit) and an orders table of its own."""
    conn = psycopg.connect(postgres_url)
    orders = f"{table}_orders"
    conn.execute(f"CREATE TABLE {orders} (id serial PRIMARY KEY, item text)")
    conn.commit()
    yield conn, orders
    conn.rollback()
    conn.execute(f"DROP TABLE IF EXISTS {orders}")
    conn.commit()
    conn.close()


def test_a_rolled_back_transaction_leaves_no_job_that_could_ever_be_handled(
    driver, run_worker, app
):
    conn, orders = app
    worker = run_worker(driver)
    with pytest.raises(Rollback), conn.transaction():
        conn.execute(f"INSERT INTO {orders} (item) VALUES ('book')")
        driver.send_in(conn, Message("receipt", {"order": "book"}))
        raise Rollback
    # FIFO within a priority: once the later message is handled, an earlier
    # one that existed would have been handled first.
    driver.send(Message("sentinel"))
    assert worker.wait_for(1) == ["sentinel"]
    assert driver.queue_stats()[0].ready == 0


def test_a_committed_transaction_is_handled_once(driver, run_worker, app, sql):
    conn, orders = app
    with conn.transaction():
        conn.execute(f"INSERT INTO {orders} (item) VALUES ('book')")
        driver.send_in(conn, Message("receipt", {"order": "book"}))
    worker = run_worker(driver)
    worker.wait_for(1)
    driver.send(Message("sentinel"))
    assert worker.wait_for(2) == ["receipt", "sentinel"]
    assert sql.execute(f"SELECT count(*) FROM {driver.names.table}").fetchone() == (0,)


def test_the_job_is_invisible_until_commit_and_the_commit_wakes_an_idle_worker(
    make_driver, run_worker, app
):
    # A poll interval beyond the deadline: the NOTIFY delivered at commit wakes it.
    driver = make_driver(poll_interval=DEADLINE_S * 3)
    worker = run_worker(driver)
    driver.send(Message("warm-up"))
    worker.wait_for(1)
    conn, orders = app
    conn.execute(f"INSERT INTO {orders} (item) VALUES ('book')")
    driver.send_in(conn, Message("receipt"))
    assert driver.queue_stats()[0].ready == 0  # another connection sees nothing yet
    conn.commit()
    assert worker.wait_for(2) == ["warm-up", "receipt"]


def test_a_crash_before_commit_loses_the_order_and_the_job_together(driver, app, postgres_url):
    conn, orders = app
    crashing = psycopg.connect(postgres_url)
    crashing.execute(f"INSERT INTO {orders} (item) VALUES ('book')")
    driver.send_in(crashing, Message("receipt"))
    crashing.close()  # the process dies: the server rolls the transaction back
    assert conn.execute(f"SELECT count(*) FROM {orders}").fetchone() == (0,)
    assert driver.queue_stats()[0].ready == 0


def test_a_batch_joins_the_transaction_in_one_insert(driver, app):
    conn, _ = app
    with conn.transaction():
        driver.send_batch_in(conn, [Message("a"), Message("b"), Message("c")])
        assert driver.queue_stats()[0].ready == 0
    assert driver.queue_stats()[0].ready == 3


def test_a_message_that_cannot_be_serialized_leaves_the_transaction_untouched(driver, app):
    conn, orders = app
    with conn.transaction():
        conn.execute(f"INSERT INTO {orders} (item) VALUES ('book')")
        with pytest.raises(SerializeError):
            driver.send_in(conn, Message("bad", {"x": object()}))
    assert conn.execute(f"SELECT count(*) FROM {orders}").fetchone() == (1,)
