"""Heartbeats: the publisher's thread, the Worker's in-flight table, and ``hermes workers``."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hermes.core import BrokerUnavailableError, Emitter, Message, NotSupportedError, Worker
from hermes.core._cli._workers import duration, table
from hermes.core.drivertools import MemoryDriver
from hermes.core.heartbeat import (
    HeartbeatPublisher,
    live_workers,
    pause,
    paused_priorities,
    request_stop,
)

HERMES = shutil.which("hermes", path=os.path.dirname(sys.executable))


def wait_for(predicate: Any, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def test_a_running_worker_shows_the_job_in_its_handler_and_forgets_its_record_when_it_stops(
    driver: MemoryDriver,
) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(message: Message) -> None:
        started.set()
        release.wait(10)

    Emitter(driver).emit(Message("slow", {"n": 1}, id="job-1"))
    worker = Worker(
        driver,
        {"slow": slow},
        max_items=1,
        handle_signals=False,
        heartbeat=HeartbeatPublisher(driver, url="memory://x", interval_s=0.05),
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(10)
    assert wait_for(lambda: any(r["in_flight"] for r in live_workers(driver)))
    (record,) = live_workers(driver)
    assert record["in_flight"][0]["type"] == "slow"
    assert record["in_flight"][0]["id"] == "job-1"
    assert record["pid"] == os.getpid() and record["concurrency"] == 1
    assert record["url"] == "memory://x"
    release.set()
    thread.join(10)
    assert live_workers(driver) == [], "a stopped worker's record is still listed"
    assert worker.in_flight() == []


def test_the_record_counts_what_the_handlers_did(driver: MemoryDriver) -> None:
    emitter = Emitter(driver)
    for n in range(3):
        emitter.emit(Message("job", {"n": n}))
    publisher = HeartbeatPublisher(driver, interval_s=60)
    worker = Worker(driver, {"job": lambda m: m.payload["n"] != 1}, max_items=3)
    worker.run()
    from hermes.core.heartbeat import worker_fields

    record = publisher.record(lambda: worker_fields(worker))
    assert (record["handled"], record["failed"]) == (2, 1)
    assert record["version"] and record["host"] and ":" in record["id"]


def test_the_url_in_a_record_has_no_password(driver: MemoryDriver) -> None:
    publisher = HeartbeatPublisher(driver, url="redis://user:s3cret@host:6379/0")
    assert "s3cret" not in json.dumps(publisher.record(dict))


def test_only_a_pool_child_s_record_names_a_supervisor_and_a_slot(driver: MemoryDriver) -> None:
    child = HeartbeatPublisher(driver, supervisor_pid=4242, slot=2).record(dict)
    assert (child["supervisor_pid"], child["slot"], child["pid"]) == (4242, 2, os.getpid())
    alone = HeartbeatPublisher(driver).record(dict)
    assert "supervisor_pid" not in alone and "slot" not in alone


class _Unreachable(MemoryDriver):
    def beat(self, record: Mapping[str, Any], ttl_s: float) -> None:
        raise BrokerUnavailableError("the registry is down")


def test_a_registry_that_fails_is_logged_once_and_the_worker_goes_on(
    broker_name: str, hermes_log: pytest.LogCaptureFixture
) -> None:
    registry = _Unreachable(broker_name)
    publisher = HeartbeatPublisher(registry, interval_s=0.01)
    for _ in range(5):
        assert not publisher.beat(dict)
    warnings = [r for r in hermes_log.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "the registry is down" in warnings[0].getMessage()


def test_the_table_shows_uptime_in_flight_jobs_and_last_seen() -> None:
    now = 1_000_000.0
    record = {
        "host": "web-1",
        "pid": 42,
        "kind": "worker",
        "started": now - 3700,
        "last_seen": now - 2,
        "concurrency": 4,
        "handled": 10,
        "failed": 1,
        "in_flight": [{"type": "invoice.send", "id": "7", "since": now - 12}],
    }
    text = table([record], now)
    assert "web-1" in text and "1h01m" in text and "2s ago" in text
    assert "invoice.send #7 (12s)" in text
    assert duration(59) == "59s" and duration(3 * 86400 + 7200) == "3d02h"


def test_hermes_workers_shows_times_that_are_not_numbers_as_invalid() -> None:
    now = 1_767_225_600.0
    record = {
        "host": "web-1",
        "pid": 42,
        "started": "yesterday",
        "last_seen": None,
        "supervisor_pid": 900,
        "slot": "two",
        "in_flight": [{"type": "invoice.send", "id": "7", "since": "soon"}],
    }
    [row] = table(
        [
            record,
        ],
        now,
    ).splitlines()[1:]
    cells = row.split()
    assert "invalid" in cells[cells.index("worker") + 1]
    assert "invoice.send #7 (invalid)" in row


def test_hermes_workers_lists_a_pools_children_together_under_their_supervisor() -> None:
    now = 1_767_225_600.0

    def record(pid: int, started: float, **pool: int) -> dict[str, object]:
        return {"host": "web-1", "pid": pid, "started": started, "last_seen": now, **pool}

    # live_workers orders by start: a replaced child (slot 1) started last.
    records = [
        record(901, now - 60, supervisor_pid=900, slot=2),
        record(950, now - 50),
        record(903, now - 5, supervisor_pid=900, slot=1),
    ]
    rows = table(records, now).splitlines()[1:]
    assert [row.split()[1] for row in rows] == ["903", "901", "950"]
    assert "supervisor 900, worker-1" in rows[0] and "supervisor 900, worker-2" in rows[1]
    assert rows[2].split()[2] == "-"  # a worker on its own is in no pool


def _hermes(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert HERMES is not None
    env = {k: v for k, v in os.environ.items() if k != "HERMES_URL"}
    return subprocess.run(
        [HERMES, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_sigkilled_worker_disappears_from_hermes_workers_within_three_periods(
    tmp_path: Path,
) -> None:
    (tmp_path / "jobs.py").write_text("HANDLERS = {'job': lambda message: None}\n")
    url = (tmp_path / "queue").as_uri()
    assert HERMES is not None
    worker = subprocess.Popen(
        [
            HERMES,
            "worker",
            "--url",
            url,
            "--handlers",
            "jobs:HANDLERS",
            "--heartbeat-interval",
            "0.5",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def listed() -> list[dict[str, Any]]:
            run = _hermes("workers", "--url", url, "--json", cwd=tmp_path)
            assert run.returncode == 0, run.stderr
            return list(json.loads(run.stdout)["workers"])

        assert wait_for(lambda: [r["pid"] for r in listed()] == [worker.pid], 30)
        text = _hermes("workers", "--url", url, cwd=tmp_path).stdout
        assert str(worker.pid) in text and "in flight now" in text
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
        from hermes.core import connect

        with connect(url) as driver:
            # Three periods of 0.5 s, plus the expiry precision the kit allows (1 s).
            assert wait_for(lambda: live_workers(driver) == [], 1.5 + 1.0)
        assert listed() == []
    finally:
        worker.kill()
        worker.wait()


def test_hermes_workers_on_a_broker_without_heartbeats_is_one_line_and_exit_2(
    tmp_path: Path,
) -> None:
    run = _hermes("workers", "--url", "memory://x", "--registry-url", "nope://x", cwd=tmp_path)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr


def test_a_record_whose_start_is_not_a_number_is_listed_first_not_fatal(
    driver: MemoryDriver,
) -> None:
    now = time.time()
    driver.beat({"id": "b", "started": now - 5, "last_seen": now}, 60)
    driver.beat({"id": "a", "started": "2025-01-01T10:00:00Z", "last_seen": now}, 60)
    driver.beat({"id": "c", "started": None, "last_seen": now}, 60)
    assert [r["id"] for r in live_workers(driver)] == ["a", "c", "b"]


def test_a_stop_requested_on_the_registry_stops_the_worker_after_the_job_it_runs(
    driver: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hermes")
    started, release = threading.Event(), threading.Event()
    handled: list[str] = []

    def slow(message: Message) -> None:
        started.set()
        release.wait(10)
        handled.append(message.id)

    Emitter(driver).emit(Message("slow", id="job-1"))
    publisher = HeartbeatPublisher(driver, url="memory://x", interval_s=0.05)
    worker = Worker(driver, {"slow": slow}, handle_signals=False, heartbeat=publisher)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert started.wait(10)

    request_stop(driver, publisher.id, "from a test")

    assert wait_for(lambda: any(r.get("stopping") for r in live_workers(driver)))
    (record,) = live_workers(driver)
    assert record["stopping"] == "from a test" and thread.is_alive()
    Emitter(driver).emit(Message("slow", id="job-2"))  # taken by no one: the run is stopping
    release.set()
    thread.join(10)
    assert not thread.is_alive()
    assert handled == ["job-1"]
    assert worker.stats.stopped_by == "stop requested from a test"
    assert f"Heartbeat {publisher.id}: a stop was requested from a test" in caplog.text
    assert live_workers(driver) == []


def test_a_stop_or_a_pause_cannot_be_requested_on_a_registry_that_keeps_no_records() -> None:
    class HeartbeatsOnly:
        def beat(self, record: Mapping[str, Any], ttl_s: float) -> None: ...
        def forget(self, worker_id: str) -> None: ...
        def heartbeats(self) -> list[dict[str, Any]]:
            return []

    with pytest.raises(NotSupportedError, match="keeps heartbeats but no records"):
        request_stop(HeartbeatsOnly(), "web-1:1:abc", "from a test")
    with pytest.raises(NotSupportedError, match="keeps heartbeats but no records"):
        pause(HeartbeatsOnly(), 100, "from a test")
    assert paused_priorities(HeartbeatsOnly()) == {}  # nothing paused where nothing is kept


def test_hermes_workers_stop_asks_a_live_worker_and_refuses_an_unknown_id(
    tmp_path: Path,
) -> None:
    (tmp_path / "jobs.py").write_text("HANDLERS = {'job': lambda message: None}\n")
    url = (tmp_path / "queue").as_uri()
    assert HERMES is not None
    args = [HERMES, "worker", "--url", url, "--handlers", "jobs:HANDLERS"]
    worker = subprocess.Popen(
        [*args, "--heartbeat-interval", "0.2"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def live_ids() -> list[str]:
            run = _hermes("workers", "--url", url, "--json", cwd=tmp_path)
            return (
                [r["id"] for r in json.loads(run.stdout)["workers"]] if run.returncode == 0 else []
            )

        assert wait_for(lambda: len(live_ids()) == 1, 30)
        unknown = _hermes("workers", "--url", url, "--stop", "nobody:1:x", cwd=tmp_path)
        assert unknown.returncode == 2 and len(unknown.stderr.splitlines()) == 1
        assert "no live worker 'nobody:1:x'" in unknown.stderr
        (worker_id,) = live_ids()
        asked = _hermes("workers", "--url", url, "--stop", worker_id, cwd=tmp_path)
        assert asked.returncode == 0, asked.stderr
        assert f"Asked worker {worker_id}" in asked.stdout
        assert worker.wait(30) == 0
        assert worker.stderr is not None
        said = worker.stderr.read()
        assert "a stop was requested with hermes workers --stop" in said
    finally:
        worker.kill()
        worker.wait()
        if worker.stderr is not None:
            worker.stderr.close()


def test_a_pool_child_stopped_on_request_is_replaced_and_counted(tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text("HANDLERS = {'job': lambda message: None}\n")
    url = (tmp_path / "queue").as_uri()
    assert HERMES is not None
    args = [HERMES, "worker", "--url", url, "--handlers", "jobs:HANDLERS", "--processes", "2"]
    with (tmp_path / "pool.log").open("wb") as log:
        pool = subprocess.Popen(
            [*args, "--heartbeat-interval", "0.2"], cwd=tmp_path, stdout=log, stderr=log
        )
    try:

        def children() -> dict[int, dict[str, Any]]:
            run = _hermes("workers", "--url", url, "--json", cwd=tmp_path)
            records = json.loads(run.stdout)["workers"] if run.returncode == 0 else []
            return {r["slot"]: r for r in records}

        assert wait_for(lambda: len(children()) == 2, 30)
        first = children()[1]
        asked = _hermes("workers", "--url", url, "--stop", first["id"], cwd=tmp_path)
        assert asked.returncode == 0, asked.stderr
        assert wait_for(lambda: children().get(1, first)["pid"] != first["pid"], 30)
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(30) == 0
        said = (tmp_path / "pool.log").read_text()
        assert "stopped on a request (stop requested with hermes workers --stop)" in said
        assert "3 worker processes started, 1 replaced on a stop request" in said, said[-2000:]
    finally:
        pool.kill()
        pool.wait()
