"""Job records on Redis: compare-and-set, expiry, waits woken by a write, listing newest first."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hermes_test_support import DEADLINE_S, eventually

from hermes.core import Dispatcher, Emitter, Message, Result, Worker, connect
from hermes.core.driver import Delivery, SupportsRecords
from hermes.core.drivertools import MemoryDriver
from hermes.core.heartbeat import HeartbeatPublisher
from hermes.core.jobs import JobResultError, Jobs, JobState, current_job
from hermes.drivers.redis import RedisSetDriver, _records


@pytest.fixture
def jobs(redis_url: str, namespace: str, client: redis.Redis[Any]) -> Iterator[Jobs]:
    """Job records on Redis under the test's prefix, through a URL as an application names it.

    ``client`` deletes the prefix's keys after the test.
    """
    jobs = Jobs(f"{redis_url}?prefix={namespace}:")
    yield jobs
    jobs.close()


def test_a_record_is_kept_beside_the_queue_key_under_the_prefix(
    driver: RedisSetDriver, client: redis.Redis[Any], namespace: str
) -> None:
    assert _records.record_key("app:hermes", "job:42") == "app:hermes_record:job:42"
    assert isinstance(driver, SupportsRecords)

    assert driver.record_put("job:1", b"{}", 60, None)

    assert client.get(f"{namespace}_record:job:1") == b"{}"
    assert 0 < client.pttl(f"{namespace}_record:job:1") <= 60_000
    assert client.zrange(f"{namespace}_records", 0, -1) == [f"{namespace}_record:job:1".encode()]


def test_put_writes_only_over_the_bytes_expected(driver: RedisSetDriver) -> None:
    assert driver.record_get("job:a") is None
    assert driver.record_put("job:a", b"one", 60, None)
    assert not driver.record_put("job:a", b"two", 60, None), "written over a record not expected"
    assert not driver.record_put("job:a", b"two", 60, b"other")
    assert driver.record_get("job:a") == b"one"

    assert driver.record_put("job:a", b"two", 60, b"one")

    assert driver.record_get("job:a") == b"two"
    assert not driver.record_put("job:b", b"x", 60, b"two"), "written where nothing was stored"
    assert driver.record_get("job:b") is None


def test_an_empty_record_is_not_taken_for_no_record(driver: RedisSetDriver) -> None:
    assert driver.record_put("job:e", b"", 60, None)
    assert driver.record_get("job:e") == b""
    assert not driver.record_put("job:e", b"x", 60, None)
    assert driver.record_put("job:e", b"x", 60, b"")


def test_sixteen_threads_incrementing_by_compare_and_set_lose_no_update(
    driver: RedisSetDriver,
) -> None:
    rounds = 25
    conflicts: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def increment() -> None:
        try:
            barrier.wait()
            lost = 0
            for _ in range(rounds):
                while True:
                    seen = driver.record_get("job:counter")
                    count = int(seen or b"0")
                    if driver.record_put("job:counter", b"%d" % (count + 1), 60, seen):
                        break
                    lost += 1
            conflicts.append(lost)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=increment) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S * 6)
    assert not errors, errors
    assert len(conflicts) == 16
    assert driver.record_get("job:counter") == b"%d" % (16 * rounds)


def test_redis_expires_a_record_after_its_ttl(driver: RedisSetDriver) -> None:
    assert driver.record_put("job:short", b"x", 1, None)
    assert driver.record_put("job:long", b"y", 60, None)

    eventually(lambda: driver.record_get("job:short") is None, "Redis to expire the record")

    assert driver.record_get("job:long") == b"y"
    assert driver.record_put("job:short", b"again", 60, None), "an expired record still counts"


def test_a_wait_is_woken_by_a_write_from_another_thread(driver: RedisSetDriver) -> None:
    assert driver.record_put("job:w", b"waiting", 60, None)
    writer = threading.Timer(0.2, driver.record_put, args=("job:w", b"running", 60, b"waiting"))
    writer.start()
    try:
        assert driver.record_wait("job:w", b"waiting", DEADLINE_S * 3) == b"running"
    finally:
        writer.join()


def test_a_wait_for_a_record_not_written_yet_returns_it_once_written(
    driver: RedisSetDriver,
) -> None:
    writer = threading.Timer(0.2, driver.record_put, args=("job:new", b"waiting", 60, None))
    writer.start()
    try:
        assert driver.record_wait("job:new", None, DEADLINE_S * 3) == b"waiting"
    finally:
        writer.join()


def test_a_wait_returns_what_differs_at_once_and_the_same_value_at_its_timeout(
    driver: RedisSetDriver, client: redis.Redis[Any]
) -> None:
    assert driver.record_put("job:s", b"now", 60, None)
    assert driver.record_wait("job:s", b"before", 30) == b"now"

    assert driver.record_wait("job:s", b"now", 0.3) == b"now"
    assert driver.record_wait("job:none", None, 0.2) is None
    # Each wait's pub/sub connection is closed when it returns.
    channel = driver.key + "_record:job:s"
    eventually(
        lambda: client.pubsub_numsub(channel) == [(channel.encode(), 0)],
        "the waits' subscriptions to end",
    )


def test_a_write_to_another_record_does_not_end_a_wait(driver: RedisSetDriver) -> None:
    assert driver.record_put("job:quiet", b"same", 60, None)
    writes = threading.Thread(
        target=lambda: [driver.record_put(f"job:other{i}", b"x", 60, None) for i in range(20)]
    )
    writes.start()
    try:
        assert driver.record_wait("job:quiet", b"same", 0.5) == b"same"
    finally:
        writes.join()


def test_scan_lists_the_newest_first_and_skips_expired_ones(driver: RedisSetDriver) -> None:
    assert driver.record_put("job:1", b"first", 60, None)
    assert driver.record_put("job:gone", b"short", 1, None)
    time.sleep(0.01)  # a later millisecond of the server's clock than the first
    assert driver.record_put("job:2", b"second", 60, None)
    time.sleep(0.01)
    assert driver.record_put("job:3", b"third", 60, None)
    time.sleep(0.01)
    assert driver.record_put("job:1", b"first, again", 60, b"first")  # keeps its place

    eventually(lambda: driver.record_get("job:gone") is None, "Redis to expire the record")

    assert driver.record_scan(10) == [b"third", b"second", b"first, again"]
    assert driver.record_scan(2) == [b"third", b"second"]
    assert driver.record_scan(0) == []


def test_pages_list_each_record_once_by_creation_while_records_are_written(
    driver: RedisSetDriver,
) -> None:
    # Several records a millisecond: members of one score are paged in byte order.
    for n in range(25):
        assert driver.record_put(f"job:{n:02d}", b"%d" % n, 60, None)
    for oldest_first in (False, True):
        listed: list[str] = []
        after: str | None = None
        while True:
            page = driver.record_page(after, 4, 1 << 20, oldest_first=oldest_first)
            assert len(page.entries) <= 4
            listed += [str(key) for key, _ in page.entries]
            if page.next is None:
                break
            after = page.next
            # A new record, and rewrites on both sides of the cursor: no skip, no repeat.
            assert driver.record_put(f"job:new-{len(listed)}-{oldest_first}", b"n", 60, None)
            for key in ("job:00", "job:24"):
                assert driver.record_put(key, b"x", 60, driver.record_get(key))
        old = [key for key in listed if "new" not in key]
        assert sorted(old) == [f"job:{n:02d}" for n in range(25)], listed
        assert len(set(listed)) == len(listed), listed
    assert sum("new" in key for key in listed) >= 6  # the oldest-first walk reached them


def test_a_page_is_held_to_its_bytes_and_skips_expired_records_within_its_reads(
    driver: RedisSetDriver,
) -> None:
    for n in range(3):
        assert driver.record_put(f"job:big{n}", b"x" * 1000, 60, None)
    assert [len(v) for _, v in driver.record_page(None, 10, 1500).entries] == [1000, 1000]
    assert len(driver.record_page(None, 10, 1).entries) == 1
    time.sleep(0.01)
    for n in range(10):
        assert driver.record_put(f"job:brief{n}", b"x", 0.001, None)
    eventually(
        lambda: all(driver.record_get(f"job:brief{n}") is None for n in range(10)),
        "Redis to expire the records",
    )

    first = driver.record_page(None, 4, 1 << 20)
    assert first.entries == [] and first.next is not None  # read 5 expired, listed none
    pages = [first]
    while pages[-1].next is not None:
        pages.append(driver.record_page(pages[-1].next, 4, 1 << 20))
    assert [key for page in pages for key, _ in page.entries] == [
        "job:big2",
        "job:big1",
        "job:big0",
    ]


def test_a_cursor_the_store_did_not_write_is_refused(driver: RedisSetDriver) -> None:
    with pytest.raises(ValueError, match="not a page of this store's job records"):
        driver.record_page("page-2", 10, 1 << 20)


def test_scan_finds_live_records_behind_many_expired_ones(driver: RedisSetDriver) -> None:
    assert driver.record_put("job:old", b"old", 60, None)
    time.sleep(0.01)
    for i in range(30):
        assert driver.record_put(f"job:brief{i}", b"x", 0.001, None)
    eventually(
        lambda: all(driver.record_get(f"job:brief{i}") is None for i in range(30)),
        "Redis to expire the records",
    )

    assert driver.record_scan(1) == [b"old"]


def test_a_write_drops_expired_records_from_the_indexes(
    driver: RedisSetDriver, client: redis.Redis[Any], namespace: str
) -> None:
    assert driver.record_put("job:brief", b"x", 0.001, None)
    eventually(lambda: driver.record_get("job:brief") is None, "Redis to expire the record")

    assert driver.record_put("job:next", b"y", 60, None)

    member = f"{namespace}_record:job:next".encode()
    assert client.zrange(f"{namespace}_records", 0, -1) == [member]
    assert client.zrange(f"{namespace}_records_expiry", 0, -1) == [member]


def test_a_driver_made_before_fork_keeps_records_from_the_child_and_wakes_the_parent(
    driver: RedisSetDriver,
) -> None:
    assert driver.record_put("job:f", b"parent", 60, None)
    assert driver.record_wait("job:f", None, 1) == b"parent"  # the parent's pool is in use

    def child() -> None:
        written = driver.record_get("job:f") == b"parent"
        time.sleep(0.2)  # the parent is waiting by now, most likely; either way it sees it
        written = written and driver.record_put("job:f", b"child", 60, b"parent")
        os._exit(0 if written else 3)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    try:
        assert driver.record_wait("job:f", b"parent", DEADLINE_S * 3) == b"child"
    finally:
        process.join(DEADLINE_S * 3)
    assert process.exitcode == 0
    assert driver.record_put("job:f", b"parent again", 60, b"child")


def test_a_record_written_with_a_ttl_of_zero_is_refused(driver: RedisSetDriver) -> None:
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        driver.record_put("job:z", b"x", 0, None)


def test_teardown_deletes_the_records(
    driver: RedisSetDriver, client: redis.Redis[Any], namespace: str
) -> None:
    assert driver.record_put("job:t", b"x", 60, None)

    driver.teardown()

    assert list(client.scan_iter(match=f"{namespace}*")) == []


def test_a_decoding_client_still_reads_bytes(
    client: redis.Redis[Any], namespace: str, redis_url: str
) -> None:
    decoding: redis.Redis[Any] = redis.Redis.from_url(redis_url, decode_responses=True)
    driver = RedisSetDriver(decoding, key=namespace, close_client=True)
    try:
        assert driver.record_put("job:d", b"\xff", 60, None)
        assert driver.record_get("job:d") == b"\xff"
        assert driver.record_scan(5) == [b"\xff"]
        assert driver.record_wait("job:d", None, 1) == b"\xff"
    finally:
        driver.close()


@pytest.mark.parametrize("delivery", list(Delivery))
def test_a_job_s_result_round_trips_through_records_on_redis(
    redis_url: str, namespace: str, client: redis.Redis[Any], delivery: Delivery
) -> None:
    # The records in the broker's own Redis, its mode named in the URL as a worker's is.
    jobs = Jobs(f"{redis_url}?prefix={namespace}:&delivery={delivery.value}")
    broker = RedisSetDriver(client, prefix=f"{namespace}:", delivery=delivery)
    try:
        message = Message("total")
        Emitter(broker, records=jobs).emit(message)
        assert jobs.job(message).state is JobState.WAITING
        dispatcher = Dispatcher(broker, records=jobs).register_handler("total", lambda m: Result(0))

        Worker(broker, dispatcher, max_items=1, handle_signals=False).run()

        assert jobs.job(message).result(timeout=DEADLINE_S) == 0
        record = jobs.get(message.id)
        assert record is not None and record.state is JobState.SUCCEEDED
        assert [r.id for r in jobs.scan()] == [message.id]
    finally:
        jobs.close()


def test_result_waits_on_redis_until_a_worker_on_the_memory_driver_ends_the_job(
    jobs: Jobs, namespace: str
) -> None:
    broker = MemoryDriver(f"records-{namespace}")
    message = Message("job")
    Emitter(broker, records=jobs).emit(message)
    dispatcher = Dispatcher(broker, records=jobs).register_handler("job", lambda m: Result(7))
    later = threading.Timer(
        0.2, lambda: Worker(broker, dispatcher, max_items=1, handle_signals=False).run()
    )
    later.start()
    try:
        assert jobs.job(message).result(timeout=DEADLINE_S) == 7
    finally:
        later.join()


def test_a_job_cancelled_before_it_starts_runs_no_handler(
    jobs: Jobs, driver: RedisSetDriver
) -> None:
    message = Message("job")
    Emitter(driver, records=jobs).emit(message)
    ran: list[Message] = []

    assert jobs.job(message).cancel().state is JobState.CANCELLED
    dispatcher = Dispatcher(driver, records=jobs).register_handler("job", ran.append)
    Worker(driver, dispatcher, max_items=1, handle_signals=False).run()

    assert ran == []
    with pytest.raises(JobResultError, match="cancelled"):
        jobs.job(message).result(timeout=1)


def test_a_wait_on_several_records_returns_the_one_written(driver: RedisSetDriver) -> None:
    assert driver.record_put("job:x", b"x1", 60, None)
    assert driver.record_wait_any({"job:x": b"x1", "job:y": None}, 0.05) == {}
    assert driver.record_wait_any({"job:x": None, "job:y": None}, 1) == {"job:x": b"x1"}
    writer = threading.Timer(0.2, lambda: driver.record_put("job:y", b"y1", 60, None))
    writer.start()
    try:
        woken = driver.record_wait_any({"job:x": b"x1", "job:y": None}, DEADLINE_S)
    finally:
        writer.join()

    assert woken == {"job:y": b"y1"}


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_cancelling_a_running_job_stops_its_handler_and_it_ends_cancelled(
    jobs: Jobs, driver: RedisSetDriver, kind: str
) -> None:
    started = threading.Event()
    stopped: list[str] = []
    dispatcher = Dispatcher(driver, records=jobs)

    class Sleeper:
        max_retry = 5

        async def handle(self, message: Message) -> bool:
            started.set()
            try:
                await asyncio.sleep(DEADLINE_S * 10)
            finally:
                stopped.append(message.id)
            return True

    @dispatcher.handler("sync", max_retry=5)
    def checks(message: Message) -> None:
        job = current_job()
        assert job is not None
        started.set()
        while not job.cancelled.wait(0.05):
            pass
        stopped.append(message.id)
        job.raise_if_cancelled()

    dispatcher.register_handler("async", Sleeper())
    other = Message("other")  # a second job watched beside it, which nobody cancels
    jobs.start(other, 100)
    message = Message(kind)
    Emitter(driver, records=jobs).emit(message)
    worker = threading.Thread(
        target=Worker(driver, dispatcher, max_items=1, handle_signals=False).run
    )
    worker.start()
    assert started.wait(DEADLINE_S)
    jobs.job(message).cancel()
    worker.join(DEADLINE_S)

    assert not worker.is_alive(), "the cancel did not stop the handler"
    assert stopped == [message.id]
    record = jobs.get(message.id)
    assert record is not None and record.state is JobState.CANCELLED and record.cancel_requested
    assert [a.outcome for a in record.attempts] == ["cancelled"]
    assert record.retry_at is None
    assert [(q.ready, q.scheduled) for q in driver.queue_stats()] == [(0, 0)], "a retry was sent"
    untouched = jobs.get(other.id)
    assert untouched is not None and untouched.state is JobState.RUNNING


JOBS_MODULE = """
import pathlib, time

def hang(message):
    pathlib.Path("started").write_text(message.id)
    time.sleep(600)

HANDLERS = {"hang": hang}
"""


def test_a_sigkilled_worker_s_job_ends_lost_once_its_heartbeat_expired(
    tmp_path: Path, redis_url: str, namespace: str, client: redis.Redis[Any]
) -> None:
    url = f"{redis_url}?prefix={namespace}:"
    (tmp_path / "jobs_module.py").write_text(JOBS_MODULE)
    jobs = Jobs(url)
    broker = connect(url)
    alive_beat = f"elsewhere:1:{namespace}"
    broker.beat({"id": alive_beat}, 600)  # a worker alive all along, on another host
    alive = Message("hang")
    jobs.start(alive, 100, heartbeat=alive_beat, registry=repr(broker))
    message = Message("hang")
    Emitter(broker, records=jobs).emit(message)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("HERMES_URL", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hermes.core.cli",
            "worker",
            "--url",
            url,
            "--results-url",
            url,
            "--handlers",
            "jobs_module:HANDLERS",
            "--heartbeat-interval",
            "0.2",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(
            lambda: (tmp_path / "started").exists(), "the worker to start the job", DEADLINE_S * 3
        )
        running = jobs.get(message.id)
        assert running is not None and running.state is JobState.RUNNING
        (attempt,) = running.attempts
        assert attempt.heartbeat is not None and attempt.heartbeat.split(":")[1] == str(process.pid)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(DEADLINE_S)
        assert [q.ready for q in broker.queue_stats()] == [0], "it came back: not at most once"

        # A worker that runs on with records sweeps it lost once the heartbeat has expired.
        deadline = time.monotonic() + DEADLINE_S * 3
        Worker(
            broker,
            Dispatcher(broker, records=jobs),
            heartbeat=HeartbeatPublisher(broker, interval_s=0.2),
            handle_signals=False,
            stop_when=lambda: (
                time.monotonic() > deadline or jobs.job(message).state is JobState.LOST
            ),
        ).run()
    finally:
        process.kill()
        process.wait()
        broker.close()

    lost = jobs.get(message.id)
    assert lost is not None and lost.state is JobState.LOST
    assert [a.outcome for a in lost.attempts] == ["lost"]
    with pytest.raises(JobResultError, match="lost"):
        jobs.job(message).result(timeout=1)
    kept = jobs.get(alive.id)
    assert kept is not None and kept.state is JobState.RUNNING
    jobs.close()
