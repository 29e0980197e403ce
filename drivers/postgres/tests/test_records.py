"""Job records in PostgreSQL: compare-and-set, expiry, NOTIFY wake-up, scans, and Jobs on top."""

from __future__ import annotations

import os
import threading
import time

import pytest
from hermes_test_support import DEADLINE_S, eventually

from hermes.core import Dispatcher, Emitter, Message, Result, Worker
from hermes.core.driver import SupportsRecords
from hermes.core.jobs import Jobs, JobState, current_job
from hermes.drivers.postgres import PostgresDriver


def test_the_driver_keeps_job_records(driver):
    assert isinstance(driver, SupportsRecords)


def test_a_put_writes_only_over_what_it_expects(driver):
    assert driver.record_get("job:a") is None
    assert driver.record_put("job:a", b"v1", 60, b"v0") is False  # nothing stored yet
    assert driver.record_put("job:a", b"v1", 60, None) is True
    assert driver.record_put("job:a", b"other", 60, None) is False  # something is stored
    assert driver.record_put("job:a", b"other", 60, b"v0") is False  # not what is stored
    assert driver.record_get("job:a") == b"v1"
    assert driver.record_put("job:a", b"v2", 60, b"v1") is True
    assert driver.record_get("job:a") == b"v2"


def test_concurrent_read_modify_writes_lose_no_increment(make_driver):
    drivers = [make_driver(), make_driver()]  # two driver objects: two pools, as two processes
    threads_count, increments = 16, 10
    barrier = threading.Barrier(threads_count)
    errors: list[BaseException] = []

    def increment(driver: PostgresDriver) -> None:
        try:
            barrier.wait()
            for _ in range(increments):
                while True:
                    seen = driver.record_get("job:counter")
                    count = int(seen or b"0")
                    if driver.record_put("job:counter", str(count + 1).encode(), 60, seen):
                        break
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=increment, args=(drivers[i % 2],)) for i in range(threads_count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S * 4)
    assert errors == []
    assert drivers[0].record_get("job:counter") == str(threads_count * increments).encode()


def test_a_record_is_gone_once_its_ttl_passed_and_counts_as_absent(driver):
    assert driver.record_put("job:brief", b"v1", 1, None) is True
    assert driver.record_get("job:brief") == b"v1"
    eventually(lambda: driver.record_get("job:brief") is None, "the record expired")
    assert driver.record_scan(10) == []
    assert driver.record_put("job:brief", b"v2", 60, b"v1") is False  # expired is not v1
    assert driver.record_put("job:brief", b"v2", 60, None) is True  # expired is absent
    assert driver.record_get("job:brief") == b"v2"


def test_a_ttl_must_be_positive(driver):
    with pytest.raises(ValueError, match="ttl_s"):
        driver.record_put("job:a", b"v", 0, None)


def test_a_wait_is_woken_by_a_write_from_another_thread(make_driver):
    waiter, writer = make_driver(), make_driver()
    writer.record_put("job:w", b"waiting", 60, None)
    got: list[bytes | None] = []
    thread = threading.Thread(
        target=lambda: got.append(waiter.record_wait("job:w", b"waiting", DEADLINE_S * 2))
    )
    thread.start()
    writer.record_put("job:w", b"done", 60, b"waiting")
    thread.join(DEADLINE_S * 3)
    assert got == [b"done"]


def test_a_wait_returns_what_is_stored_at_once_when_it_differs_from_seen(driver):
    driver.record_put("job:x", b"now", 60, None)
    assert driver.record_wait("job:x", b"before", 30) == b"now"
    assert driver.record_wait("job:none", b"before", 30) is None


def test_a_wait_with_nothing_new_returns_what_is_stored_at_the_timeout(driver):
    driver.record_put("job:still", b"same", 60, None)
    started = time.monotonic()
    assert driver.record_wait("job:still", b"same", 0.3) == b"same"
    assert time.monotonic() - started >= 0.3
    assert driver.record_wait("job:absent", None, 0.1) is None


def test_a_write_to_another_key_leaves_the_wait_on_its_own(driver):
    driver.record_put("job:mine", b"same", 60, None)
    got: list[bytes | None] = []
    thread = threading.Thread(
        target=lambda: got.append(driver.record_wait("job:mine", b"same", 1.0))
    )
    thread.start()
    driver.record_put("job:other", b"new", 60, None)
    thread.join(DEADLINE_S)
    assert got == [b"same"]


def test_a_wait_outlives_the_listening_connection_being_killed(driver, sql):
    driver.record_put("job:k", b"before", 60, None)
    assert driver.record_wait("job:k", b"before", 0) == b"before"  # the listener is up
    listener = driver._records._listener.get()
    assert listener.conn is not None
    old_pid = listener.conn.info.backend_pid
    got: list[bytes | None] = []
    thread = threading.Thread(
        target=lambda: got.append(driver.record_wait("job:k", b"before", DEADLINE_S * 2))
    )
    thread.start()
    sql.execute("SELECT pg_terminate_backend(%s)", [old_pid])
    driver.record_put("job:k", b"after", 60, b"before")
    thread.join(DEADLINE_S * 3)
    assert got == [b"after"]

    def listening_again() -> bool:
        conn = listener.conn
        return listener.listening and conn is not None and conn.info.backend_pid != old_pid

    eventually(listening_again, "the listener connected again")
    got.clear()
    thread = threading.Thread(
        target=lambda: got.append(driver.record_wait("job:k", b"after", DEADLINE_S * 2))
    )
    thread.start()
    driver.record_put("job:k", b"again", 60, b"after")
    thread.join(DEADLINE_S * 3)
    assert got == [b"again"]


def test_closing_the_driver_ends_the_listening_connection(driver, sql):
    driver.record_wait("job:c", None, 0)
    listener = driver._records._listener.get()
    assert listener.conn is not None
    pid = listener.conn.info.backend_pid

    driver.close()

    assert not listener.thread.is_alive()
    eventually(
        lambda: (
            sql.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone() is None
        ),
        "the listening backend is gone",
    )


def test_a_forked_child_waits_on_a_listener_of_its_own(driver):
    driver.record_put("job:f", b"old", 60, None)
    driver.record_wait("job:f", b"old", 0)  # the parent's listener is up
    parent_listener = driver._records._listener.get()
    assert parent_listener.conn is not None
    parent_pid = parent_listener.conn.info.backend_pid
    pid = os.fork()
    if pid == 0:  # the child: never the parent's connection, nor its (absent) thread
        code = 1
        try:
            got = driver.record_wait("job:f", b"old", DEADLINE_S * 2)
            conn = driver._records._listener.get().conn
            code = 0 if got == b"new" and conn and conn.info.backend_pid != parent_pid else 3
        finally:
            os._exit(code)
    driver.record_put("job:f", b"new", 60, b"old")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    got: list[bytes | None] = []
    thread = threading.Thread(
        target=lambda: got.append(driver.record_wait("job:f", b"new", DEADLINE_S * 2))
    )
    thread.start()
    driver.record_put("job:f", b"newer", 60, b"new")
    thread.join(DEADLINE_S * 3)
    assert got == [b"newer"]
    assert parent_listener.conn is not None
    assert parent_listener.conn.info.backend_pid == parent_pid


def test_a_scan_lists_live_records_newest_first_up_to_its_limit(driver, sql, table):
    for name in ("first", "second", "third", "gone"):
        driver.record_put(f"job:{name}", name.encode(), 60, None)
    sql.execute(
        f"UPDATE {table}_records SET expires_at = now() - interval '1 s' WHERE key = 'job:gone'"
    )
    driver.record_put("job:first", b"first-again", 60, b"first")  # rewritten: keeps its place
    assert driver.record_scan(10) == [b"third", b"second", b"first-again"]
    assert driver.record_scan(2) == [b"third", b"second"]


def test_pages_list_each_record_once_by_creation_while_records_are_written(driver):
    for n in range(25):
        assert driver.record_put(f"job:{n:02d}", b"%d" % n, 60, None)
    for oldest_first in (False, True):
        listed, after = [], None
        while True:
            page = driver.record_page(after, 4, 1 << 20, oldest_first=oldest_first)
            assert len(page.entries) <= 4
            listed += [key for key, _ in page.entries]
            if page.next is None:
                break
            after = page.next
            assert driver.record_put(f"job:new-{len(listed)}-{oldest_first}", b"n", 60, None)
            for key in ("job:00", "job:24"):
                assert driver.record_put(key, b"x", 60, driver.record_get(key))
        expected = [f"job:{n:02d}" for n in range(25)]
        assert [key for key in listed if "new" not in key] == (
            expected if oldest_first else expected[::-1]
        )
    assert sum("new" in key for key in listed) >= 6  # the oldest-first walk reached them


def test_a_page_is_held_to_its_bytes_and_passes_expired_rows(driver, sql, table):
    for n in range(3):
        driver.record_put(f"job:big{n}", b"x" * 1000, 60, None)
    assert [len(v) for _, v in driver.record_page(None, 10, 1500).entries] == [1000, 1000]
    assert len(driver.record_page(None, 10, 1).entries) == 1
    for n in range(10):
        driver.record_put(f"job:gone{n}", b"x", 60, None)
    sql.execute(f"UPDATE {table}_records SET expires_at = now() WHERE key LIKE 'job:gone%%'")

    first = driver.record_page(None, 4, 1 << 20)
    assert first.entries == [] and first.next is not None  # read 5 expired rows, listed none
    pages = [first]
    while pages[-1].next is not None:
        pages.append(driver.record_page(pages[-1].next, 4, 1 << 20))
    assert [k for page in pages for k, _ in page.entries] == ["job:big2", "job:big1", "job:big0"]


def test_a_new_record_over_an_expired_row_takes_a_new_place(driver, sql, table):
    driver.record_put("job:a", b"a", 60, None)
    driver.record_put("job:b", b"b", 60, None)
    sql.execute(f"UPDATE {table}_records SET expires_at = now() WHERE key = 'job:a'")
    driver.record_put("job:a", b"a again", 60, None)
    assert [k for k, _ in driver.record_page(None, 10, 1 << 20).entries] == ["job:a", "job:b"]


def test_a_records_table_made_before_pages_gains_its_seq_column(make_driver, sql, table):
    first = make_driver()
    first.record_put("job:old", b"old", 60, None)
    sql.execute(f"ALTER TABLE {table}_records DROP COLUMN seq")
    later = make_driver()  # a new driver object: it looks at the table once
    later.record_put("job:new", b"new", 60, None)
    assert [k for k, _ in later.record_page(None, 10, 1 << 20).entries] == ["job:new", "job:old"]
    with pytest.raises(ValueError, match="not a page of this store's job records"):
        later.record_page("12:job:old", 10, 1 << 20)


def test_records_of_another_queue_in_the_same_table_are_its_own(make_driver):
    a, b = make_driver(queue="a"), make_driver(queue="b")
    assert a.record_put("job:1", b"a", 60, None) is True
    assert b.record_put("job:1", b"b", 60, None) is True
    assert (a.record_get("job:1"), b.record_get("job:1")) == (b"a", b"b")
    assert a.record_scan(10) == [b"a"]


def test_expired_records_are_deleted_by_a_later_put(driver, sql, table):
    driver.record_put("job:old", b"old", 60, None)
    sql.execute(f"UPDATE {table}_records SET expires_at = now() - interval '1 s'")
    driver._records._next_sweep = 0.0
    driver.record_put("job:new", b"new", 60, None)
    keys = sql.execute(f"SELECT key FROM {table}_records").fetchall()
    assert keys == [("job:new",)]


def test_teardown_drops_the_records_table(driver, sql, table):
    driver.record_put("job:a", b"v", 60, None)
    driver.teardown()
    found = sql.execute("SELECT to_regclass(%s)", [f"{table}_records"]).fetchone()
    assert found == (None,)
    assert driver.record_get("job:a") is None  # made again on the next use


# Jobs on PostgreSQL -------------------------------------------------------------


def _work_one(driver: PostgresDriver, dispatcher: Dispatcher) -> threading.Thread:
    worker = Worker(driver, dispatcher, max_items=1, handle_signals=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def test_a_job_s_result_round_trips_through_postgresql(postgres_url, driver, table):
    jobs = Jobs(f"{postgres_url}?table={table}")
    try:
        message = Message("total")
        Emitter(driver, records=jobs).emit(message)
        assert jobs.job(message).state is JobState.WAITING
        dispatcher = Dispatcher(driver, records=jobs).register_handler("total", lambda m: Result(0))
        thread = _work_one(driver, dispatcher)
        assert jobs.job(message).result(timeout=DEADLINE_S) == 0
        thread.join(DEADLINE_S)
        record = jobs.get(message.id)
        assert record is not None and record.state is JobState.SUCCEEDED
        assert [attempt.outcome for attempt in record.attempts] == ["succeeded"]
    finally:
        jobs.close()


def test_a_job_cancelled_before_it_starts_runs_no_handler(driver):
    jobs = Jobs(driver)
    message = Message("job")
    Emitter(driver, records=jobs).emit(message)
    ran: list[Message] = []

    assert jobs.job(message).cancel().state is JobState.CANCELLED
    thread = _work_one(driver, Dispatcher(driver, records=jobs).register_handler("job", ran.append))
    thread.join(DEADLINE_S)

    assert not thread.is_alive()
    assert ran == []
    record = jobs.get(message.id)
    assert record is not None and record.state is JobState.CANCELLED and record.attempts == ()
    assert driver.queue_stats()[0].ready == 0


def test_a_running_job_cancelled_hears_it_through_notify_and_ends_cancelled(driver):
    jobs = Jobs(driver)
    message = Message("job")
    Emitter(driver, records=jobs).emit(message)
    started = threading.Event()
    dispatcher = Dispatcher(driver, records=jobs)

    @dispatcher.handler("job", max_retry=5)
    def checks(message: Message) -> None:
        job = current_job()
        assert job is not None
        started.set()
        while not job.cancelled.wait(0.05):
            pass
        job.raise_if_cancelled()

    thread = _work_one(driver, dispatcher)
    assert started.wait(DEADLINE_S)
    jobs.job(message).cancel()
    thread.join(DEADLINE_S)

    assert not thread.is_alive(), "the cancel did not reach the handler"
    record = jobs.get(message.id)
    assert record is not None and record.state is JobState.CANCELLED
    assert [attempt.outcome for attempt in record.attempts] == ["cancelled"]
    assert record.retry_at is None and driver.queue_stats()[0].ready == 0
