"""Job records in records/: compare-and-set across processes, expiry, waits, scans, and Jobs."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hermes_test_support import eventually

from hermes.core import Dispatcher, Emitter, Message, Result, Worker
from hermes.core.driver import SupportsRecords
from hermes.core.jobs import Jobs, JobState, current_job
from hermes.drivers.filesystem import FileSystemDriver, _records

HERMES = shutil.which("hermes", path=str(Path(sys.executable).parent)) or shutil.which("hermes")


@pytest.fixture
def store(tmp_path: Path) -> FileSystemDriver:
    return FileSystemDriver(tmp_path / "store", fsync=False)


def record_files(store: FileSystemDriver) -> list[str]:
    directory = Path(store.path) / "records"
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def test_the_driver_keeps_records(store: FileSystemDriver) -> None:
    assert isinstance(store, SupportsRecords)


def test_a_put_writes_only_when_the_stored_bytes_are_the_expected_ones(
    store: FileSystemDriver,
) -> None:
    assert store.record_get("job:1") is None
    assert store.record_put("job:1", b"first", 60, expect=b"something") is False
    assert store.record_get("job:1") is None

    assert store.record_put("job:1", b"first", 60, expect=None) is True
    assert store.record_get("job:1") == b"first"

    assert store.record_put("job:1", b"second", 60, expect=None) is False
    assert store.record_put("job:1", b"second", 60, expect=b"other") is False
    assert store.record_get("job:1") == b"first"

    assert store.record_put("job:1", b"second", 60, expect=b"first") is True
    assert store.record_get("job:1") == b"second"
    assert record_files(store) == ["k=job:1"]


def test_a_record_keeps_any_bytes_including_newlines_and_an_empty_value(
    store: FileSystemDriver,
) -> None:
    value = b"line one\nline two\n\x00\xff" * 10_000  # larger than one read
    assert store.record_put("job:bin", value, 60, None)
    assert store.record_get("job:bin") == value
    assert store.record_put("job:empty", b"", 60, None)
    assert store.record_get("job:empty") == b""
    assert store.record_put("job:empty", b"x", 60, None) is False  # empty is not absent


def test_a_ttl_that_is_not_positive_is_refused(store: FileSystemDriver) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        store.record_put("job:1", b"v", 0, None)


def _increment(path: str, key: str, times: int) -> None:
    driver = FileSystemDriver(path, fsync=False)
    for _ in range(times):
        while True:
            current = driver.record_get(key)
            count = int(current) if current is not None else 0
            if driver.record_put(key, str(count + 1).encode(), 60, current):
                break


def test_four_processes_incrementing_one_record_lose_no_update(store: FileSystemDriver) -> None:
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_increment, args=(store.path, "job:counter", 50)) for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    assert store.record_get("job:counter") == b"200"


def test_threads_incrementing_one_record_lose_no_update(store: FileSystemDriver) -> None:
    threads = [
        threading.Thread(target=_increment, args=(store.path, "job:threads", 25)) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert store.record_get("job:threads") == b"100"


def test_an_expired_record_is_absent_its_file_deleted_and_its_key_free_again(
    store: FileSystemDriver,
) -> None:
    assert store.record_put("job:short", b"v", 1, None)
    assert store.record_put("job:long", b"v", 600, None)
    assert store.record_get("job:short") == b"v"

    assert eventually(lambda: store.record_get("job:short") is None, "job:short to expire")

    assert record_files(store) == ["k=job:long"]  # the read that found it expired deleted it
    assert store.record_put("job:short", b"again", 60, expect=b"v") is False
    assert store.record_put("job:short", b"again", 60, expect=None) is True


def test_a_put_expecting_an_expired_value_fails_as_on_an_absent_record(
    store: FileSystemDriver,
) -> None:
    assert store.record_put("job:1", b"old", 0.05, None)
    assert eventually(lambda: store.record_get("job:1") is None, "job:1 to expire")
    assert store.record_put("job:1", b"new", 60, expect=b"old") is False


def test_a_wait_returns_the_value_another_thread_writes(store: FileSystemDriver) -> None:
    assert store.record_put("job:1", b"running", 60, None)

    def finish() -> None:
        time.sleep(0.2)
        store.record_put("job:1", b"succeeded", 60, b"running")

    writer = threading.Thread(target=finish)
    writer.start()
    try:
        assert store.record_wait("job:1", b"running", timeout_s=30) == b"succeeded"
    finally:
        writer.join()


def test_a_wait_on_an_absent_record_returns_once_it_is_written(store: FileSystemDriver) -> None:
    writer = threading.Timer(0.2, store.record_put, ("job:new", b"waiting", 60, None))
    writer.start()
    try:
        assert store.record_wait("job:new", None, timeout_s=30) == b"waiting"
    finally:
        writer.join()


def test_a_wait_that_sees_no_change_returns_the_same_value_at_its_timeout(
    store: FileSystemDriver,
) -> None:
    assert store.record_put("job:1", b"running", 60, None)
    assert store.record_wait("job:1", b"running", timeout_s=0.2) == b"running"
    assert store.record_wait("job:absent", None, timeout_s=0.1) is None


def test_a_wait_returns_none_once_the_record_expires(store: FileSystemDriver) -> None:
    assert store.record_put("job:1", b"running", 0.3, None)
    assert store.record_wait("job:1", b"running", timeout_s=30) is None


def test_a_scan_lists_the_newest_first_skips_expired_and_stops_at_its_limit(
    store: FileSystemDriver,
) -> None:
    assert store.record_scan(10) == []  # nothing was ever written
    assert store.record_put("job:gone", b"gone", 0.05, None)
    for n in range(4):
        assert store.record_put(f"job:{n}", b"%d" % n, 60, None)
        time.sleep(0.05)  # apart by more than the filesystem clock's tick
    assert store.record_put("job:1", b"1 again", 60, b"1")  # a rewrite keeps its place
    assert eventually(lambda: store.record_get("job:gone") is None, "job:gone to expire")
    assert store.record_put("job:gone", b"gone", 0.05, None)
    assert eventually(lambda: b"gone" not in store.record_scan(10), "job:gone to expire again")

    assert store.record_scan(10) == [b"3", b"2", b"1 again", b"0"]
    assert store.record_scan(2) == [b"3", b"2"]
    assert store.record_scan(0) == []


def test_a_scan_reads_only_as_many_files_as_its_limit_needs(
    store: FileSystemDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(50):
        assert store.record_put(f"job:{n}", b"v", 60, None)
    reads: list[str] = []
    read = _records._read

    def counting(directory: str, name: str) -> tuple[float, bytes] | None:
        reads.append(name)
        return read(directory, name)

    monkeypatch.setattr(_records, "_read", counting)
    assert len(store.record_scan(3)) == 3
    assert len(reads) == 3


def test_pages_list_each_record_once_by_creation_while_records_are_written(
    store: FileSystemDriver,
) -> None:
    for n in range(25):
        assert store.record_put(f"job:{n:02d}", b"%d" % n, 60, None)
    for oldest_first in (False, True):
        listed: list[str] = []
        after: str | None = None
        while True:
            page = store.record_page(after, 4, 1 << 20, oldest_first=oldest_first)
            assert len(page.entries) <= 4
            listed += [str(key) for key, _ in page.entries]
            if page.next is None:
                break
            after = page.next
            assert store.record_put(f"job:new-{len(listed)}-{oldest_first}", b"n", 60, None)
            for key in ("job:00", "job:24"):
                assert store.record_put(key, b"x", 60, store.record_get(key))
        old = [key for key in listed if "new" not in key]
        assert sorted(old) == [f"job:{n:02d}" for n in range(25)], listed
        assert len(set(listed)) == len(listed), listed
    assert sum("new" in key for key in listed) >= 6  # the oldest-first walk reached them


def test_a_rewrite_keeps_the_file_s_mtime_and_a_page_reads_only_the_files_it_shows(
    store: FileSystemDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(50):
        assert store.record_put(f"job:{n}", b"v", 60, None)
    path = Path(store.path) / "records" / "k=job:7"
    created = path.stat().st_mtime_ns
    assert store.record_put("job:7", b"w", 60, b"v")
    assert path.stat().st_mtime_ns == created
    reads: list[str] = []
    read = _records._read

    def counting(directory: str, name: str) -> tuple[float, bytes] | None:
        reads.append(name)
        return read(directory, name)

    monkeypatch.setattr(_records, "_read", counting)
    page = store.record_page(None, 3, 1 << 20)
    assert len(page.entries) == 3 and len(reads) == 3 and page.next is not None
    assert len(store.record_page(None, 10, 1).entries) == 1
    with pytest.raises(ValueError, match="not a page of this store's job records"):
        store.record_page("nope", 10, 1 << 20)


@pytest.mark.parametrize(
    "key", ["job:a/b c", "job:../../etc/passwd", ".", "..", ".hidden", "", "job:" + "x" * 1000]
)
def test_keys_unsafe_as_file_names_get_a_file_of_their_own_in_records(
    store: FileSystemDriver, key: str
) -> None:
    assert store.record_put(key, b"value", 60, None)
    assert store.record_get(key) == b"value"
    assert store.record_scan(10) == [b"value"]
    (name,) = record_files(store)
    assert "/" not in name and not name.startswith(".") and len(name) <= 200
    assert store.record_get(key + "x") is None


def test_a_key_of_a_simple_id_is_readable_in_its_file_name(store: FileSystemDriver) -> None:
    assert store.record_put("job:4f1c-9a", b"v", 60, None)
    assert store.record_put("job:with space/slash", b"v", 60, None)
    assert record_files(store) == ["k=job:4f1c-9a", "k=job:with%20space%2Fslash"]


def test_a_sweep_removes_expired_records_and_keeps_live_ones(store: FileSystemDriver) -> None:
    assert store.record_put("job:short", b"v", 0.05, None)
    assert store.record_put("job:long", b"v", 600, None)
    time.sleep(0.1)
    _records.sweep(store.path)
    assert record_files(store) == ["k=job:long"]


def test_writers_sweep_out_expired_records_nobody_reads_again(
    store: FileSystemDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_records, "SWEEP_INTERVAL_S", 0.0)  # a sweep is due at every write
    assert store.record_put("job:short", b"v", 0.05, None)
    writes = iter(range(1_000_000))

    def written_and_swept() -> bool:
        assert store.record_put(f"job:{next(writes)}", b"v", 60, None)
        return "k=job:short" not in record_files(store)

    assert eventually(written_and_swept, "a write to sweep job:short out")


def test_teardown_deletes_the_records(store: FileSystemDriver) -> None:
    assert store.record_put("job:1", b"v", 60, None)
    store.teardown()
    assert not os.path.exists(store.path)
    assert store.record_get("job:1") is None


def test_a_job_result_round_trips_through_records_in_a_directory(tmp_path: Path) -> None:
    broker = FileSystemDriver(tmp_path / "queue", fsync=False)
    jobs = Jobs(f"file://{tmp_path / 'records'}")
    message = Message("total")
    Emitter(broker, records=jobs).emit(message)
    assert jobs.job(message).state is JobState.WAITING
    dispatcher = Dispatcher(broker, records=jobs).register_handler("total", lambda m: Result(0))
    worker = threading.Thread(
        target=Worker(broker, dispatcher, max_items=1, handle_signals=False).run
    )
    worker.start()
    try:
        assert jobs.job(message).result(timeout=30) == 0
    finally:
        worker.join(30)
    done = jobs.get(message.id)
    assert done is not None and done.state is JobState.SUCCEEDED
    assert [a.outcome for a in done.attempts] == ["succeeded"]
    assert [r.id for r in jobs.scan()] == [message.id]
    jobs.close()


HANDLERS_MODULE = """
from hermes.core import Result


class Total:
    def handle(self, message):
        return Result(0)


HANDLERS = {"total": Total}
"""


@pytest.mark.skipif(HERMES is None, reason="the hermes console script is not installed")
def test_hermes_job_reads_the_record_a_worker_on_the_command_line_kept(tmp_path: Path) -> None:
    assert HERMES is not None
    (tmp_path / "jobs.py").write_text(HANDLERS_MODULE)
    queue_url = f"file://{tmp_path / 'queue'}"
    results_url = f"file://{tmp_path / 'records'}"
    message = Message("total")
    jobs = Jobs(results_url)
    Emitter(FileSystemDriver(tmp_path / "queue"), records=jobs).emit(message)
    jobs.close()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}

    def hermes(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [HERMES, *args], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=60
        )

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:HANDLERS", "--max-items", "1",
        "--results-url", results_url,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stdout + worker.stderr

    shown = hermes("job", message.id, "--results-url", results_url)
    assert shown.returncode == 0, shown.stderr
    assert f"Job #{message.id} (total)" in shown.stdout
    assert "state      succeeded" in shown.stdout
    assert "result     0" in shown.stdout

    listed = hermes("jobs", "--results-url", results_url)
    assert listed.returncode == 0, listed.stderr
    assert "succeeded" in listed.stdout and message.id in listed.stdout


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_cancelling_a_running_job_stops_its_handler_and_it_ends_cancelled(
    store: FileSystemDriver, tmp_path: Path, kind: str
) -> None:
    # The filesystem waits on one record and reads the others it watches every
    # second: the cancelled job is watched beside one that nobody cancels.
    jobs = Jobs(store)
    queue = FileSystemDriver(tmp_path / "queue", fsync=False)
    started = threading.Event()
    stopped: list[str] = []
    dispatcher = Dispatcher(queue, records=jobs)

    class Sleeper:
        max_retry = 5

        async def handle(self, message: Message) -> bool:
            started.set()
            try:
                await asyncio.sleep(300)
            finally:
                stopped.append(message.id)
            return True

    @dispatcher.handler("sync", max_retry=5)
    def checks(message: Message) -> None:
        job = current_job()
        started.set()
        while not job.cancelled.wait(0.05):
            pass
        stopped.append(message.id)
        job.raise_if_cancelled()

    dispatcher.register_handler("async", Sleeper())
    other = Message("other")
    jobs.start(other, 100)
    message = Message(kind)
    Emitter(queue, records=jobs).emit(message)
    worker = threading.Thread(
        target=Worker(queue, dispatcher, max_items=1, handle_signals=False).run
    )
    worker.start()
    assert started.wait(30)
    jobs.job(message).cancel()
    worker.join(30)

    assert not worker.is_alive(), "the cancel did not stop the handler"
    assert stopped == [message.id]
    record = jobs.get(message.id)
    assert record is not None and record.state is JobState.CANCELLED and record.cancel_requested
    assert [a.outcome for a in record.attempts] == ["cancelled"]
    assert [(q.ready, q.scheduled) for q in queue.queue_stats()] == [(0, 0)], "a retry was sent"
    untouched = jobs.get(other.id)
    assert untouched is not None and untouched.state is JobState.RUNNING
