"""Shutdown requests and SIGTERM/SIGINT end ``handle()`` after the message in progress."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from hermes.core import Emitter, Message, SharedFileShutdown, Shutdown, compat
from hermes.core.compat import Dispatcher
from hermes.core.drivertools import MemoryDriver
from hermes.core.run._worker import NOTICE

# SharedFileShutdown --------------------------------------------------------------------


def test_shared_file_shutdown_is_a_shutdown(tmp_path: Path) -> None:
    assert isinstance(SharedFileShutdown(tmp_path / "stop"), Shutdown)


def test_no_file_means_no_shutdown(tmp_path: Path) -> None:
    assert SharedFileShutdown(tmp_path / "stop").should_shutdown(0.0) is False


def test_a_request_at_or_after_the_start_stops_the_worker(tmp_path: Path) -> None:
    shutdown = SharedFileShutdown(tmp_path / "stop")

    assert shutdown.shutdown(at=1_000_000.0) is True

    assert shutdown.should_shutdown(999_999.0) is True
    assert shutdown.should_shutdown(1_000_000.0) is True


def test_a_request_before_the_start_is_ignored(tmp_path: Path) -> None:
    shutdown = SharedFileShutdown(tmp_path / "stop")

    shutdown.shutdown(at=1_000_000.0)

    assert shutdown.should_shutdown(1_000_001.0) is False


def test_shutdown_without_a_time_asks_every_worker_started_until_now(tmp_path: Path) -> None:
    shutdown = SharedFileShutdown(tmp_path / "stop")
    started = time.time() - 1

    shutdown.shutdown()

    assert shutdown.should_shutdown(started) is True
    assert shutdown.should_shutdown(time.time() + 60) is False


def test_shutdown_creates_the_missing_directories_of_its_file(tmp_path: Path) -> None:
    shutdown = SharedFileShutdown(tmp_path / "a" / "b" / "stop")

    shutdown.shutdown()

    assert (tmp_path / "a" / "b" / "stop").is_file()


def test_a_request_from_elsewhere_is_seen_within_the_check_interval(
    tmp_path: Path, eventually: Any
) -> None:
    watched = SharedFileShutdown(tmp_path / "stop")
    started = time.time() - 1
    assert watched.should_shutdown(started) is False

    SharedFileShutdown(tmp_path / "stop").shutdown()

    eventually(lambda: watched.should_shutdown(started), "the request", timeout_s=2.0)


def test_between_looks_the_file_is_not_read_again(tmp_path: Path) -> None:
    watched = SharedFileShutdown(tmp_path / "stop", check_interval_s=3600)
    started = time.time() - 1
    assert watched.should_shutdown(started) is False

    SharedFileShutdown(tmp_path / "stop").shutdown()

    assert watched.should_shutdown(started) is False


def test_a_check_interval_of_zero_looks_at_every_check(tmp_path: Path) -> None:
    watched = SharedFileShutdown(tmp_path / "stop", check_interval_s=0)
    started = time.time() - 1
    assert watched.should_shutdown(started) is False

    SharedFileShutdown(tmp_path / "stop").shutdown()

    assert watched.should_shutdown(started) is True


def test_its_own_request_is_seen_at_once_whatever_the_interval(tmp_path: Path) -> None:
    shutdown = SharedFileShutdown(tmp_path / "stop", check_interval_s=3600)
    started = time.time() - 1
    assert shutdown.should_shutdown(started) is False

    shutdown.shutdown()

    assert shutdown.should_shutdown(started) is True


@pytest.mark.parametrize("interval", [-1, True, float("nan")])
def test_a_check_interval_that_is_not_seconds_is_refused(tmp_path: Path, interval: Any) -> None:
    with pytest.raises(ValueError, match="check_interval_s must be a number of seconds"):
        SharedFileShutdown(tmp_path / "stop", check_interval_s=interval)


def test_a_request_older_than_the_worker_does_not_stop_handle(
    driver: MemoryDriver, tmp_path: Path
) -> None:
    shutdown = SharedFileShutdown(tmp_path / "stop")
    shutdown.shutdown(at=time.time() - 60)
    Emitter(driver).emit(Message("job"))
    compat.set_max_process_items(driver, 1)
    handled: list[str] = []

    class Handler:
        def handle(self, message: Message) -> bool:
            handled.append(message.id)
            return True

    Dispatcher(driver, shutdown=shutdown).register_handler("job", Handler()).handle()

    assert len(handled) == 1


# Signals, in this process ----------------------------------------------------------------


@pytest.fixture
def safety_handlers() -> Iterator[list[int]]:
    """Handlers that record SIGTERM/SIGINT, so a Dispatcher that forgot to install its own
    fails the test instead of killing or interrupting pytest."""
    caught: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield caught
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_handler_ends_handle_after_that_message(
    signum: signal.Signals,
    driver: MemoryDriver,
    safety_handlers: list[int],
    hermes_log: pytest.LogCaptureFixture,
    peek: Any,
) -> None:
    handled: list[str] = []

    class SignalsItself:
        def handle(self, message: Message) -> bool:
            os.kill(os.getpid(), signum)
            handled.append(message.id)
            return True

    first, second = Message("job"), Message("job")
    Emitter(driver).emit(first).emit(second)

    try:
        Dispatcher(driver, shutdown=_Deadline()).register_handler("job", SignalsItself()).handle()
    except KeyboardInterrupt:  # would end the whole pytest run, not just fail this test
        pytest.fail(f"one {signum.name} interrupted the handler instead of stopping after it")

    assert handled == [first.id]
    assert [m.id for m in peek.queued(driver)] == [second.id]
    assert safety_handlers == []
    assert (NOTICE, "Exiting hermes dispatcher - shutdown") in [
        (r.levelno, r.getMessage()) for r in hermes_log.records
    ]
    assert any(signum.name in r.getMessage() for r in hermes_log.records if r.levelno == NOTICE)


@pytest.mark.parametrize("attached", ["before the signal", "after the signal"])
def test_a_signal_while_the_worker_command_starts_stops_its_run_before_any_message(
    attached: str, driver: MemoryDriver, safety_handlers: list[int], peek: Any
) -> None:
    from hermes.core import Worker
    from hermes.core._cli._run import _signals_while_starting

    message = Message("job")
    Emitter(driver).emit(message)
    dispatcher = Dispatcher(driver).register_handler("job", _Ok())
    with _signals_while_starting() as early:
        worker = Worker(driver, dispatcher)
        if attached == "before the signal":
            early.stop(worker)
        os.kill(os.getpid(), signal.SIGTERM)
        assert _wait_for(lambda: early.reason == "SIGTERM")
        early.stop(worker)
        stats = worker.run()

    assert stats.stopped_by == "SIGTERM"
    assert [m.id for m in peek.queued(driver)] == [message.id]
    assert safety_handlers == []
    os.kill(os.getpid(), signal.SIGTERM)  # the handlers found are back once the command ends
    assert _wait_for(lambda: safety_handlers == [signal.SIGTERM])


def test_handle_puts_the_previous_signal_handlers_back(
    driver: MemoryDriver, safety_handlers: list[int]
) -> None:
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    compat.set_max_process_items(driver, 1)
    Emitter(driver).emit(Message("job"))

    Dispatcher(driver).register_handler("job", _Ok()).handle()

    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    os.kill(os.getpid(), signal.SIGTERM)
    assert _wait_for(lambda: safety_handlers == [signal.SIGTERM])


def test_a_second_sigint_interrupts_the_handler_in_progress(
    driver: MemoryDriver, safety_handlers: list[int], peek: Any
) -> None:
    class ImpatientUser:
        def handle(self, message: Message) -> bool:
            os.kill(os.getpid(), signal.SIGINT)
            _wait_for(lambda: False, timeout=0.05)  # let the first one be handled
            os.kill(os.getpid(), signal.SIGINT)
            _wait_for(lambda: False, timeout=5)  # interrupted long before this ends
            return True

    message = Message("job")
    Emitter(driver).emit(message)

    with pytest.raises(KeyboardInterrupt):
        Dispatcher(driver).register_handler("job", ImpatientUser()).handle()

    assert [m.id for m in peek.queued(driver)] == [message.id]


class _Deadline:
    """Stops a worker that ignored its signal, so the test fails instead of hanging."""

    def __init__(self, seconds: float = 10.0) -> None:
        self.at = time.time() + seconds

    def should_shutdown(self, start_time: float) -> bool:
        return time.time() >= self.at

    def shutdown(self, at: float | None = None) -> bool:
        return False


class _Ok:
    def handle(self, message: Message) -> bool:
        return True


def _wait_for(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# Signals, to a worker process -----------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import logging, sys, time
    from pathlib import Path

    from hermes.core import Dispatcher, Emitter, Message, Worker
    from hermes.core.drivertools import MemoryDriver

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
    work = Path(sys.argv[1])
    driver = MemoryDriver("worker")
    Emitter(driver).emit(Message("block", {"n": 1})).emit(Message("block", {"n": 2}))


    class Blocks:
        def handle(self, message):
            n = message.payload["n"]
            (work / f"started-{n}").touch()
            deadline = time.monotonic() + 60
            while not (work / "release").exists():
                if time.monotonic() > deadline:
                    raise SystemExit("never released")
                time.sleep(0.01)
            (work / f"finished-{n}").touch()
            return True


    Worker(driver, Dispatcher(driver).register_handler("block", Blocks())).run()
    print("handle returned", flush=True)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_worker_process_finishes_its_message_and_exits_cleanly(
    signum: signal.Signals, tmp_path: Path
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    worker = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert _wait_for(lambda: (tmp_path / "started-1").exists(), timeout=30), worker.poll()

        worker.send_signal(signum)
        (tmp_path / "release").touch()
        output, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()

    assert worker.returncode == 0, output
    assert (tmp_path / "finished-1").exists()
    assert not (tmp_path / "started-2").exists()
    assert f"NOTICE Received {signum.name}, stopping after the message in progress" in output
    assert "NOTICE Exiting hermes dispatcher - shutdown" in output
    assert output.rstrip().endswith("handle returned")


def test_the_notice_level_is_25_and_named_notice() -> None:
    assert NOTICE == 25
    assert logging.getLevelName(NOTICE) == "NOTICE"
