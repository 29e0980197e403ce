"""Quieting one worker: it finishes what it runs, takes no more, and stays alive until stopped."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hermes.core import Emitter, Message, Worker
from hermes.core.drivertools import MemoryDriver
from hermes.core.heartbeat import HeartbeatPublisher, live_workers, pause
from hermes.core.run._heartbeat import request_quiet

HIGH = 300
HERMES = shutil.which("hermes", path=os.path.dirname(sys.executable))


def first_worker(driver: MemoryDriver) -> dict[str, Any]:
    """The one worker's heartbeat record; {} until its first beat is published."""
    found = live_workers(driver)
    return found[0] if found else {}


def wait_for(predicate: Any, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


class Running:
    """A Worker on its own thread, beating every 50 ms; what its handlers ran, in order."""

    def __init__(self, driver: MemoryDriver, **kwargs: Any) -> None:
        self.ran: list[str] = []
        self.hold = threading.Event()
        self.hold.set()

        def job(message: Message) -> None:
            self.hold.wait(30)
            self.ran.append(message.id)

        self.publisher = HeartbeatPublisher(driver, url="memory://x", interval_s=0.05)
        self.worker = Worker(
            driver, {"job": job}, handle_signals=False, heartbeat=self.publisher, **kwargs
        )
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hold.set()
        self.worker.stop()
        self.thread.join(15)
        assert not self.thread.is_alive()


@pytest.fixture
def two_queues(driver: MemoryDriver) -> MemoryDriver:
    driver.setup_priority_queue("high", HIGH)
    return driver


def send(driver: MemoryDriver, job_id: str, priority: int) -> None:
    Emitter(driver).emit(Message("job", {}, id=job_id), priority=priority)


@pytest.mark.parametrize("priorities", [(), (HIGH, 100)], ids=["every priority", "--priority"])
def test_a_quieted_worker_finishes_its_job_takes_no_more_and_stays_alive(
    two_queues: MemoryDriver, caplog: pytest.LogCaptureFixture, priorities: tuple[int, ...]
) -> None:
    caplog.set_level(logging.INFO, logger="hermes")
    with Running(two_queues, priorities=priorities) as run:
        run.hold.clear()
        send(two_queues, "running", 100)
        assert wait_for(lambda: first_worker(two_queues).get("in_flight"))

        request_quiet(two_queues, run.publisher.id, "from a test")

        # Said at once; the priorities are skipped from the run's next take on.
        assert wait_for(lambda: first_worker(two_queues).get("quiet") == "from a test")
        send(two_queues, "later-low", 100)
        send(two_queues, "later-high", HIGH)
        run.hold.set()
        assert wait_for(lambda: "running" in run.ran)
        assert wait_for(lambda: first_worker(two_queues).get("paused") == [100, HIGH]), (
            live_workers(two_queues)
        )
        time.sleep(0.3)  # six beats: a worker still taking would have taken both by now
        assert run.ran == ["running"]
        assert run.thread.is_alive() and len(live_workers(two_queues)) == 1
    assert f"Heartbeat {run.publisher.id}: quieted from a test: taking no more jobs" in caplog.text
    # Stopped (by the block's end), it leaves both waiting for another worker.
    assert {row.priority: row.ready for row in two_queues.queue_stats()} == {HIGH: 1, 100: 1}


def test_a_quiet_worker_stays_quiet_when_a_fleet_pause_of_its_priority_ends(
    two_queues: MemoryDriver,
) -> None:
    from hermes.core.heartbeat import resume

    assert pause(two_queues, HIGH, "by the test")
    with Running(two_queues, priorities=(HIGH, 100)) as run:
        assert wait_for(lambda: first_worker(two_queues).get("paused") == [HIGH])
        request_quiet(two_queues, run.publisher.id, "from a test")
        assert wait_for(lambda: first_worker(two_queues).get("paused") == [100, HIGH])
        assert resume(two_queues, HIGH, "by the test")
        send(two_queues, "after-resume", HIGH)
        time.sleep(0.3)  # three polls of the pauses
        assert run.ran == [] and live_workers(two_queues)[0]["paused"] == [100, HIGH]


def test_hermes_workers_quiet_worker_leaves_the_worker_alive_and_refuses_an_unknown_id(
    tmp_path: Path,
) -> None:
    (tmp_path / "jobs.py").write_text(
        "import pathlib\n"
        "def job(message):\n"
        "    pathlib.Path('handled').open('a').write(message.id + '\\n')\n"
        "HANDLERS = {'job': job}\n"
    )
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

        def records() -> list[dict[str, Any]]:
            run = _hermes("workers", "--url", url, "--json", cwd=tmp_path)
            return list(json.loads(run.stdout)["workers"]) if run.returncode == 0 else []

        assert wait_for(lambda: len(records()) == 1, 30)
        unknown = _hermes("workers", "--url", url, "--quiet-worker", "nobody:1:x", cwd=tmp_path)
        assert unknown.returncode == 2 and len(unknown.stderr.splitlines()) == 1
        assert "no live worker 'nobody:1:x'" in unknown.stderr
        (record,) = records()
        asked = _hermes("workers", "--url", url, "--quiet-worker", record["id"], cwd=tmp_path)
        assert asked.returncode == 0, asked.stderr
        assert f"Asked worker {record['id']}" in asked.stdout
        assert wait_for(lambda: [r.get("paused") for r in records()] == [[100]], 30)
        table = _hermes("workers", "--url", url, cwd=tmp_path).stdout
        assert "worker (quiet)" in table, table
        emit_to(url, "after-quiet")
        time.sleep(1.0)  # five beats: a worker still taking would have handled it
        assert not (tmp_path / "handled").exists()
        assert worker.poll() is None, "a quiet worker exited"
    finally:
        worker.terminate()
        worker.wait(30)
        said = worker.stderr.read() if worker.stderr is not None else ""
        if worker.stderr is not None:
            worker.stderr.close()
    assert "quieted with hermes workers --quiet-worker" in said, said[-2000:]


def emit_to(url: str, job_id: str) -> None:
    from hermes.core import connect

    with connect(url) as driver:
        Emitter(driver).emit(Message("job", {}, id=job_id))


def _hermes(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert HERMES is not None
    return subprocess.run(
        [HERMES, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
