"""Real worker processes on one directory, some of them killed with SIGKILL."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hermes_test_support import eventually

from hermes.core import Message
from hermes.drivers.filesystem import FileSystemDriver

WORKER = Path(__file__).with_name("fs_worker.py")
#: Long enough for a loaded 2-core machine; every wait below ends as soon as it succeeds.
DEADLINE_S = 30.0


def ids_in(out_dir: Path, prefix: str) -> list[str]:
    """Every id the workers wrote to ``<prefix>-<pid>`` files, duplicates kept."""
    ids: list[str] = []
    for path in sorted(out_dir.glob(f"{prefix}-*")):
        ids.extend(line for line in path.read_text().splitlines() if line)
    return ids


#: ``poll(condition, what)``: waits up to DEADLINE_S, then fails the test naming ``what``.
poll = functools.partial(eventually, timeout_s=DEADLINE_S, interval_s=0.02)


@pytest.fixture
def url(queue_dir: Path) -> str:
    # Short recovery interval: dead workers are noticed within ~0.1 s.
    return f"file://{queue_dir}?fsync=false&recovery_interval_s=0.1"


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


@pytest.fixture
def start_worker(
    url: str, out_dir: Path, tmp_path: Path
) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """``start_worker(mode)``: a worker process on the queue; all are killed after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(mode: str) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"worker-{len(started)}.log", "wb")
        process = subprocess.Popen(
            [sys.executable, str(WORKER), url, mode, str(out_dir)], stdout=log, stderr=log
        )
        log.close()
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def kill(process: subprocess.Popen[bytes]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


def test_a_message_claimed_by_a_killed_worker_is_handled_by_another_running_worker(
    queue_dir, out_dir, start_worker
):
    driver = FileSystemDriver(queue_dir, fsync=False)
    message = Message("job")
    driver.send(message)
    doomed = start_worker("block")
    poll(lambda: ids_in(out_dir, "started") == [message.id], "the first worker to start it")
    survivor = start_worker("record")
    driver.send(Message("job", id="proof-the-survivor-runs"))
    poll(lambda: "proof-the-survivor-runs" in ids_in(out_dir, "handled"), "the second worker")
    assert message.id not in ids_in(out_dir, "handled")  # a live worker's claim is not taken

    kill(doomed)
    poll(lambda: message.id in ids_in(out_dir, "handled"), "the message to come back")
    assert survivor.poll() is None
    assert Counter(ids_in(out_dir, "handled"))[message.id] == 1


def test_a_message_claimed_by_a_killed_worker_is_handled_when_the_worker_restarts(
    queue_dir, out_dir, start_worker, files
):
    driver = FileSystemDriver(queue_dir, fsync=False)
    message = Message("job")
    driver.send(message)
    kill_me = start_worker("block")
    poll(lambda: ids_in(out_dir, "started") == [message.id], "the worker to start it")
    [dead_dir] = files(queue_dir / "processing")
    kill(kill_me)
    assert files(queue_dir / "new") == []  # it is still claimed by the dead worker
    assert len(files(queue_dir / "processing" / dead_dir)) == 2

    start_worker("record")  # the restart
    poll(lambda: ids_in(out_dir, "handled") == [message.id], "the restarted worker to handle it")
    assert dead_dir not in files(queue_dir / "processing")


def test_a_live_workers_claimed_file_is_never_taken(queue_dir, out_dir, start_worker, files):
    driver = FileSystemDriver(queue_dir, fsync=False)
    message = Message("job")
    driver.send(message)
    busy = start_worker("block")
    poll(lambda: ids_in(out_dir, "started") == [message.id], "the busy worker to claim it")
    [busy_dir] = files(queue_dir / "processing")

    # Other workers start (each checks for dead workers at start) and keep
    # checking every 0.1 s while they handle a stream of other messages.
    start_worker("record")
    start_worker("record")
    others = [Message("job") for _ in range(30)]
    for other in others:
        driver.send(other)
    poll(
        lambda: set(ids_in(out_dir, "handled")) == {m.id for m in others},
        "the other workers to handle the rest",
    )
    assert message.id not in ids_in(out_dir, "handled")
    claimed = files(queue_dir / "processing" / busy_dir)
    assert len(claimed) == 2 and ".lock" in claimed  # still there, still the busy worker's
    assert busy.poll() is None


def test_several_worker_processes_on_one_directory_never_receive_the_same_message(
    queue_dir, out_dir, start_worker
):
    workers = [start_worker("record") for _ in range(4)]
    poll(lambda: len(list(out_dir.glob("ready-*"))) == 4, "the workers to start waiting")
    driver = FileSystemDriver(queue_dir, fsync=False)
    sent = [Message("job", {"n": n}) for n in range(800)]
    for message in sent:
        driver.send(message)
    poll(lambda: len(ids_in(out_dir, "handled")) >= len(sent), "every message to be handled")
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(DEADLINE_S) == 0
    handled = ids_in(out_dir, "handled")
    duplicates = [i for i, count in Counter(handled).items() if count > 1]
    assert duplicates == []
    assert sorted(handled) == sorted(m.id for m in sent)
    assert len(list(out_dir.glob("handled-*"))) >= 2  # they really competed


def test_nothing_is_lost_or_doubled_when_workers_are_killed_at_random_points(
    queue_dir, out_dir, start_worker
):
    driver = FileSystemDriver(queue_dir, fsync=False)
    sent = [Message("job", {"n": n}) for n in range(600)]
    workers = [start_worker("record") for _ in range(3)]
    for index, message in enumerate(sent):
        driver.send(message)
        if index % 150 == 75:  # kill one mid-stream, start a replacement
            kill(workers.pop(0))
            workers.append(start_worker("record"))
    poll(
        lambda: set(ids_in(out_dir, "handled")) >= {m.id for m in sent},
        "every message to be handled despite the kills",
    )
    handled = Counter(ids_in(out_dir, "handled"))
    # At-least-once: a message being handled when its worker died may run
    # twice (at most once per kill), never zero times.
    assert sum(count - 1 for count in handled.values()) <= 4


def test_a_message_whose_handler_outlives_the_grace_period_stays_claimed_until_its_process_exits(
    queue_dir, out_dir, start_worker, files, receive
):
    driver = FileSystemDriver(queue_dir, fsync=False, recovery_interval_s=0.1)
    message = Message("job")
    driver.send(message)
    stuck = start_worker("outlive")
    poll(lambda: list(out_dir.glob("closed-*")), "the worker to close with its handler running")
    [worker_dir] = files(queue_dir / "processing")
    claimed = files(queue_dir / "processing" / worker_dir)
    assert len(claimed) == 2 and ".lock" in claimed  # not given back by close
    assert files(queue_dir / "new") == []

    # Another worker, looking for dead workers as it goes, leaves it alone.
    with driver.consumer(()) as consumer:
        assert consumer.receive(0.5) is None
    assert message.id not in ids_in(out_dir, "handled")

    (out_dir / "exit").touch()
    assert stuck.wait(DEADLINE_S) == 0
    # The process is gone, and its lock with it: the recovery returns the file.
    assert [m.id for m in receive(driver, 1, deadline_s=DEADLINE_S).messages] == [message.id]
    assert files(queue_dir / "processing") == []
