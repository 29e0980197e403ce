"""PostgresDriver against the real server: rows, leases, priorities, delay, wake-up, stats."""

from __future__ import annotations

import os
import threading
import time

import pytest
from hermes_test_support import DEADLINE_S, eventually, walk_pages

from hermes.core import BrokerRefusedError, Message, UnknownPriorityError
from hermes.core.driver import (
    Consumer,
    QueueStats,
    Received,
    SupportsClaim,
    SupportsPurge,
    SupportsStats,
    SupportsTeardown,
)
from hermes.core.drivertools import MessageSerializer, outgoing
from hermes.drivers.postgres import PostgresDriver, TableBrowser

HIGH = 200


def receive(consumer: Consumer, what: str = "a message") -> Received:
    received: Received = eventually(lambda: consumer.receive(0.2), what)
    return received


def rows(sql, table):
    return sql.execute(
        f"SELECT priority, attempts, locked_by IS NOT NULL FROM {table} ORDER BY id"
    ).fetchall()


def test_a_message_sent_is_handled_once_and_its_row_deleted(driver, run_worker, sql, table):
    message = Message("greet", {"name": "Žofia"})
    driver.send(message)
    worker = run_worker(driver)
    assert worker.wait_for(1) == ["greet"]
    [(got, priority)] = worker.handled
    assert (got.id, got.payload, priority) == (message.id, {"name": "Žofia"}, 100)
    eventually(lambda: not rows(sql, table), "the acknowledged row to be deleted")


def test_the_row_holds_the_body_core_serialized(driver, sql, table):
    message = Message("greet", {"n": 1})
    driver.send(message)
    [(body, queue)] = sql.execute(f"SELECT body, queue FROM {table}").fetchall()
    assert (bytes(body), queue) == (outgoing(message).body, "default")


def test_priorities_are_read_highest_first_then_oldest_first(driver, table):
    driver.setup_priority_queue("high", HIGH)
    driver.send(Message("low-1"))
    driver.send(Message("low-2"))
    driver.send(Message("high-1"), HIGH)
    consumer = driver.consumer(())
    try:
        got = [receive(consumer) for _ in range(3)]
        assert [(r.decoded().type, r.priority) for r in got] == [
            ("high-1", HIGH),
            ("low-1", 100),
            ("low-2", 100),
        ]
    finally:
        consumer.close()


def test_a_consumer_of_one_priority_leaves_the_others(driver):
    driver.setup_priority_queue("high", HIGH)
    driver.send(Message("low"))
    driver.send(Message("high"), HIGH)
    consumer = driver.consumer([100])
    try:
        assert receive(consumer).decoded().type == "low"
        assert consumer.receive(0.1) is None
    finally:
        consumer.close()


def test_an_unknown_priority_is_refused_before_any_io():
    driver = PostgresDriver("host=127.0.0.1 port=1 connect_timeout=1")  # nothing listens
    with pytest.raises(UnknownPriorityError):
        driver.send(Message("x"), 7)
    with pytest.raises(UnknownPriorityError):
        driver.consumer([7])


def test_a_delayed_message_waits_until_its_execute_at(driver, run_worker):
    execute_at = time.time() + 1.0
    driver.send(Message("later", execute_at=execute_at))
    [stats] = driver.queue_stats()
    assert (stats.ready, stats.scheduled) == (0, 1)
    worker = run_worker(driver)
    worker.wait_for(1)
    assert time.time() >= execute_at


def test_an_idle_worker_is_woken_by_the_notification_not_by_polling(make_driver, run_worker):
    # With a poll interval longer than the test's deadline, only NOTIFY can wake it.
    driver = make_driver(poll_interval=DEADLINE_S * 3)
    worker = run_worker(driver)
    driver.send(Message("warm-up"))  # the worker has listened once it handled this
    worker.wait_for(1)
    driver.send(Message("woken"))
    assert worker.wait_for(2) == ["warm-up", "woken"]


def test_a_batch_is_put_in_one_statement_and_handled_in_order(driver, run_worker, sql, table):
    driver.send_batch([Message(f"m{i}") for i in range(50)])
    assert len(rows(sql, table)) == 50
    worker = run_worker(driver)
    assert worker.wait_for(50) == [f"m{i}" for i in range(50)]


def test_a_claimed_row_is_leased_and_counts_its_deliveries(driver, sql, table):
    driver.send(Message("x"))
    consumer = driver.consumer(())
    try:
        first = receive(consumer)
        assert first.delivery_count == 1
        [(_, attempts, locked)] = rows(sql, table)
        assert (attempts, locked) == (1, True)
        consumer.release(first)
        assert rows(sql, table) == [(100, 1, False)]
        again = receive(consumer, "the released message")
        assert (again.token, again.delivery_count) == (first.token, 2)
    finally:
        consumer.close()


def test_a_row_left_by_a_dead_consumer_comes_back_after_its_lease(make_driver):
    driver = make_driver(lease_timeout=0.5, poll_interval=0.1)
    driver.send(Message("orphan"))
    dead = driver.consumer(())
    taken = receive(dead)
    dead.close()  # like a worker killed mid-handler: close gives back nothing
    survivor = driver.consumer(())
    try:
        again = receive(survivor, "the orphan after its lease ran out")
        assert (again.token, again.delivery_count) == (taken.token, 2)
    finally:
        survivor.close()


def test_the_lease_is_renewed_while_the_handler_runs(make_driver, sql, table):
    driver = make_driver(lease_timeout=0.6, poll_interval=0.1)
    driver.send(Message("slow"))
    holder = driver.consumer(())
    other = driver.consumer(())
    try:
        taken = receive(holder)
        deadline = time.monotonic() + 3 * driver.lease_timeout_s
        while time.monotonic() < deadline:  # three leases long, renewed every third of one
            assert other.receive(0.1) is None
        holder.ack(taken)
        assert rows(sql, table) == []
    finally:
        holder.close()
        other.close()


def test_two_consumers_never_get_the_same_row(driver):
    driver.send_batch([Message(f"m{i}") for i in range(200)])
    taken: list[int] = []
    lock = threading.Lock()

    def consume() -> None:
        consumer = driver.consumer(())
        try:
            while (received := consumer.receive(0.3)) is not None:
                with lock:
                    taken.append(received.token)
                consumer.ack(received)
        finally:
            consumer.close()

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S * 3)
    assert len(taken) == 200
    assert len(set(taken)) == 200


def test_a_body_that_is_not_a_hermes_message_is_set_aside(driver, run_worker, sql, table):
    driver.send_raw(b"\xffnot json\x00")
    driver.send(Message("after"))
    worker = run_worker(driver)
    assert worker.wait_for(1) == ["after"]
    [(body, reason)] = sql.execute(f"SELECT body, reason FROM {table}_rejected").fetchall()
    assert bytes(body) == b"\xffnot json\x00"  # kept whole; the reason quotes NUL as \\x00
    assert reason
    assert [s.set_aside for s in driver.queue_stats()] == [1]


def test_stats_count_ready_scheduled_in_flight_and_set_aside_per_priority(driver):
    assert isinstance(driver, SupportsStats)
    driver.setup_priority_queue("high", HIGH)
    driver.send_batch([Message("a"), Message("b")])
    driver.send(Message("later", execute_at=time.time() + 60))
    driver.send(Message("high"), HIGH)
    consumer = driver.consumer([HIGH])
    try:
        receive(consumer)
        table = f"public.{driver.names.table} queue 'default'"
        assert driver.queue_stats() == [
            QueueStats(HIGH, f"{table} priority {HIGH}", 0, 0, 1, 0),
            QueueStats(100, f"{table} priority 100", 2, 1, 0, 0),
        ]
    finally:
        consumer.close()


def test_purge_deletes_what_waits_but_not_what_a_worker_holds(driver):
    assert isinstance(driver, SupportsPurge)
    driver.setup_priority_queue("high", HIGH)
    driver.send_batch([Message("a"), Message("b")])
    driver.send(Message("later", execute_at=time.time() + 60))
    driver.send(Message("high"), HIGH)
    consumer = driver.consumer([100])
    try:
        held = receive(consumer)
        assert driver.purge(HIGH) == 1
        assert driver.purge() == 2
        assert [(s.ready, s.scheduled, s.in_flight) for s in driver.queue_stats()] == [
            (0, 0, 0),
            (0, 0, 1),
        ]
        consumer.ack(held)
    finally:
        consumer.close()


def test_the_browser_lists_and_removes_waiting_rows_only(driver):
    driver.send_batch([Message("a"), Message("b")])
    browser = TableBrowser(driver)
    consumer = driver.consumer(())
    try:
        held = receive(consumer)
        [(entry, body)] = list(browser.entries())
        assert b'"b"' in body
        assert browser.remove(entry) is True
        assert browser.remove(entry) is False
        assert browser.remove(held.token) is False  # a worker holds it
    finally:
        consumer.close()


def test_pages_follow_the_claim_order_to_the_last_row_and_skip_held_ones(driver):
    driver.setup_priority_queue("high", 200)
    sent = [Message("job", {"n": n}) for n in range(23)]
    driver.send_batch(sent[:18])
    driver.send_batch(sent[18:], 200)
    later = Message("job", {"n": "later"}, execute_at=time.time() + 3600)
    driver.send(later)
    consumer = driver.consumer((200,))
    try:
        held = receive(consumer)  # the first of priority 200: a worker holds it
        pages = walk_pages(TableBrowser(driver), 5, 1 << 20)
    finally:
        consumer.close()
    ids = [MessageSerializer().unserialize(body).id for page in pages for body in page]
    assert [len(page) for page in pages] == [5, 5, 5, 5, 3]
    expected = [
        m.id for m in sent[18:] if m.id != MessageSerializer().unserialize(held.body).id
    ] + [m.id for m in sent[:18]]
    assert ids == [*expected, later.id]
    budget = TableBrowser(driver).page(None, 100, 1)
    assert len(budget.entries) == 1 and budget.next is not None


def test_teardown_drops_every_table(driver, sql, table):
    assert isinstance(driver, SupportsTeardown)
    driver.send(Message("x"))
    driver.claim("k", 60)
    driver.teardown()
    found = sql.execute(
        "SELECT count(*) FROM pg_tables WHERE tablename IN (%s, %s, %s)",
        [table, f"{table}_rejected", f"{table}_claims"],
    ).fetchone()
    assert found == (0,)


def test_a_claim_is_won_once_until_it_expires(driver, sql, table):
    assert isinstance(driver, SupportsClaim)
    assert driver.claim("tick:a@1", 0.5) is True
    assert driver.claim("tick:a@1", 0.5) is False
    sql.execute(f"UPDATE {table}_claims SET expires_at = now() - interval '1 s'")
    assert driver.claim("tick:a@1", 0.5) is True


def test_claims_of_another_queue_in_the_same_table_are_its_own(make_driver):
    assert make_driver(queue="a").claim("k", 60) is True
    assert make_driver(queue="b").claim("k", 60) is True
    assert make_driver(queue="a").claim("k", 60) is False


def test_expired_claims_are_swept_so_ticks_do_not_pile_up(driver, sql, table):
    driver.claim("old", 60)
    sql.execute(f"UPDATE {table}_claims SET expires_at = now() - interval '1 s'")
    driver._next_claim_sweep = 0.0
    driver.claim("new", 60)
    keys = sql.execute(f"SELECT key FROM {table}_claims").fetchall()
    assert keys == [("new",)]


def test_a_claim_ttl_must_be_positive(driver):
    with pytest.raises(ValueError, match="ttl_s"):
        driver.claim("k", 0)
    driver.send(Message("y"))  # first use again: created again
    assert driver.queue_stats()[0].ready == 1


def test_drivers_racing_to_first_use_create_the_tables_once(make_driver, sql, table):
    drivers = [make_driver() for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(drivers))

    def send(driver: PostgresDriver) -> None:
        barrier.wait()
        try:
            driver.send(Message("x"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(d,)) for d in drivers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert errors == []
    assert len(rows(sql, table)) == 4


def test_create_false_leaves_the_schema_to_the_deployment(make_driver, sql, table):
    driver = make_driver(create="false")
    with pytest.raises(BrokerRefusedError, match="create=false"):
        driver.send(Message("x"))
    sql.execute(driver.schema_sql())
    driver.send(Message("x"))
    assert len(rows(sql, table)) == 1


def test_a_driver_made_before_fork_works_in_the_child(driver, sql, table):
    driver.send(Message("parent"))  # the parent's pool is open
    pid = os.fork()
    if pid == 0:  # the child: its own pool, the parent's connections untouched
        code = 1
        try:
            driver.send(Message("child"))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    driver.send(Message("parent-again"))
    assert len(rows(sql, table)) == 3


def test_the_repr_masks_the_password(postgres_url, table):
    from hermes.core import connect

    url = postgres_url.replace("postgres@", "postgres:s3cret@") + f"?table={table}"
    driver = connect(url)
    assert "s3cret" not in repr(driver)
    assert "***" in repr(driver)


def test_a_notification_from_someone_else_on_the_channel_only_makes_the_worker_look(
    driver, run_worker, sql
):
    worker = run_worker(driver)
    driver.send(Message("warm-up"))
    worker.wait_for(1)
    sql.execute(f"NOTIFY \"{driver.channel}\", 'not a time'")
    driver.send(Message("after"))
    assert worker.wait_for(2) == ["warm-up", "after"]
