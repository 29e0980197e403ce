"""A database that drops the driver's connections: the worker reconnects, no ack is lost silently.

The server is shared, so it is not restarted: the test terminates the
driver's own backends (found by their application_name), which is what a
restart or a failover does to them.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from hermes_test_support import eventually

from hermes.core import BrokerUnavailableError, Message
from hermes.core.spi._door import translate_errors


def terminate(sql, app_name: str) -> int:
    """End every backend of ``app_name``; how many there were."""
    return len(
        sql.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [app_name],
        ).fetchall()
    )


def receive_retrying(driver, consumer):
    """``consumer.receive``, with an unavailable broker meaning "nothing yet", as in core."""
    try:
        with translate_errors(driver, "receiving"):
            return consumer.receive(0.2)
    except BrokerUnavailableError:
        return None


def test_a_worker_whose_connections_are_terminated_reconnects_and_goes_on(
    make_driver, run_worker, sql, app_name
):
    driver = make_driver(poll_interval=0.2)
    worker = run_worker(driver)
    driver.send(Message("before"))
    worker.wait_for(1)
    assert terminate(sql, app_name) >= 2  # the consumer's and the pool's
    eventually(lambda: terminate(sql, app_name) == 0, "the backends to be gone")
    # The first send after may meet a pooled connection that died: the pool
    # replaces its idle ones after that failure, so the emitter retries once.
    try:
        driver.send(Message("after"))
    except BrokerUnavailableError:
        driver.send(Message("after"))
    assert worker.wait_for(2) == ["before", "after"]


def test_an_ack_on_a_dropped_connection_raises_and_the_message_runs_again(
    make_driver, sql, app_name, table
):
    driver = make_driver(lease_timeout=0.5, poll_interval=0.1)
    driver.send_batch([Message("first"), Message("x")])
    consumer = driver.consumer(())
    try:
        first = eventually(lambda: consumer.receive(0.2), "the first message")
        consumer.ack(first)  # the settling connections are open, as in a running worker
        taken = eventually(lambda: consumer.receive(0.2), "the message")
        terminate(sql, app_name)
        with pytest.raises(BrokerUnavailableError):
            with translate_errors(driver, "acknowledging"):  # what core wraps ack in
                consumer.ack(taken)
        again = eventually(
            lambda: receive_retrying(driver, consumer), "the message after its lease"
        )
        assert (again.token, again.delivery_count) == (taken.token, 2)
        with translate_errors(driver, "acknowledging"):
            consumer.ack(again)
    finally:
        consumer.close()
    assert sql.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_failed_calls_start_one_check_of_the_idle_connections_at_a_time(make_driver) -> None:
    driver = make_driver()
    driver.send(Message("warm-up"))  # the pool is open
    pool = driver._pool.get()
    release = threading.Event()
    checks: list[int] = []
    real_check = pool.check

    def slow_check() -> None:
        # A check waiting out a silent server's timeout: it lasts until released.
        checks.append(1)
        release.wait(30)
        real_check()

    pool.check = slow_check

    def checkers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "hermes-pool-check"]

    try:
        for _ in range(5):  # five handler threads whose connections died at once
            with pytest.raises(psycopg.OperationalError), driver.connection():
                raise psycopg.OperationalError("terminating connection due to administrator")
        eventually(lambda: checks == [1], "the check to start")
        assert len(checkers()) == 1
    finally:
        release.set()
    eventually(lambda: not checkers(), "the check to end")
    with pytest.raises(psycopg.OperationalError), driver.connection():
        raise psycopg.OperationalError("terminating connection due to administrator")
    eventually(lambda: len(checks) == 2, "a failure after it to start another check")
    eventually(lambda: not checkers(), "that check to end")
