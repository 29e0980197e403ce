"""``hermes scheduler`` and unique emits on the CLI: their output, and each mistake in one line."""

from __future__ import annotations

import itertools
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from hermes.core import Message, connect, hookimpl
from hermes.core.cli import main
from hermes.core.driver import DriverPlugin
from hermes.core.spi._memory import MemoryDriver
from hermes.core.spi._registry import plugin_manager

_modules = itertools.count()


class _NoClaims(MemoryDriver):
    claim = None  # type: ignore[assignment]


class _NoClaimsPlugin:
    @hookimpl
    def hermes_drivers(self) -> list[DriverPlugin]:
        return [
            DriverPlugin(
                name="noclaims",
                schemes=("noclaims",),
                factory=lambda url: _NoClaims(url.host or "noclaims"),
                capabilities=MemoryDriver.capabilities,
                isolate=lambda url, namespace: f"noclaims://{namespace}",
            )
        ]


@pytest.fixture
def noclaims() -> Iterator[None]:
    plugin = _NoClaimsPlugin()
    plugin_manager().register(plugin)
    yield
    plugin_manager().unregister(plugin)


@pytest.fixture
def jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Writes a handlers module to the current directory; returns its name."""
    monkeypatch.chdir(tmp_path)
    name = f"periodic_jobs_{next(_modules)}"
    yield name
    sys.modules.pop(name, None)


def write(module: str, body: str) -> None:
    Path(f"{module}.py").write_text(
        "from hermes.core import HandlerRegistry\nhandlers = HandlerRegistry()\n"
        + textwrap.dedent(body)
    )


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert (code, len(err.splitlines())) == (2, 1), err
    assert "Traceback" not in err
    return err


def test_list_prints_each_entry_with_its_next_three_fire_times(
    jobs: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        jobs,
        """
        handlers.every(minutes=5, type="ping")
        handlers.cron("30 2 * * *", type="report", name="nightly", timezone="Europe/Bratislava")
        """,
    )
    assert main(["scheduler", "--handlers", f"{jobs}:handlers", "--list"]) == 0
    ping, nightly = capsys.readouterr().out.splitlines()
    assert ping.startswith("ping: every 300 s -> ping priority:100 catch_up:once; next ")
    assert nightly.startswith("nightly: cron '30 2 * * *' Europe/Bratislava -> report")
    assert nightly.count("T02:30:00+0") + nightly.count("T03:00:00+02:00") == 3


@pytest.mark.parametrize(
    ("declaration", "says"),
    [
        ('handlers.cron("61 * * * *", type="t")', "bad cron expression '61 * * * *'"),
        ('handlers.cron("0 3 * * *", type="t", timezone="Mars/Olympus")', "unknown timezone"),
    ],
)
def test_a_bad_declaration_is_one_line_and_exit_2(
    jobs: str, capsys: pytest.CaptureFixture[str], declaration: str, says: str
) -> None:
    write(jobs, declaration + "\n")
    err = one_line_error(capsys, ["scheduler", "--handlers", f"{jobs}:handlers", "--list"])
    assert says in err and f"handlers module {jobs!r}" in err


def test_a_registry_without_entries_is_one_line_and_exit_2(
    jobs: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write(jobs, "")
    err = one_line_error(capsys, ["scheduler", "--handlers", f"{jobs}:handlers", "--list"])
    assert "declares no periodic entries" in err


def test_a_broker_without_claims_and_no_lock_url_is_refused_in_one_line(
    jobs: str, capsys: pytest.CaptureFixture[str], noclaims: None
) -> None:
    write(jobs, 'handlers.every(seconds=1, type="ping")\n')
    argv = ["scheduler", "--url", "noclaims://q", "--handlers", f"{jobs}:handlers"]
    err = one_line_error(capsys, argv)
    assert "cannot claim ticks" in err and "--lock-url" in err and "--single" in err
    err = one_line_error(capsys, [*argv, "--lock-url", "noclaims://other"])
    assert "cannot claim ticks either" in err


def stop_soon(after_s: float) -> None:
    threading.Timer(after_s, os.kill, (os.getpid(), signal.SIGTERM)).start()


def test_a_scheduler_emits_ticks_until_sigterm_and_prints_its_counts(
    jobs: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write(jobs, 'handlers.every(seconds=1, type="ping", catch_up="none")\n')
    stop_soon(2.5)
    url = f"memory://{jobs}"
    assert main(["scheduler", "--url", url, "--handlers", f"{jobs}:handlers"]) == 0
    captured = capsys.readouterr()
    ticks = [line for line in captured.err.splitlines() if "emitted message #" in line]
    assert 2 <= len(ticks) <= 4, captured.err
    assert captured.out.startswith(f"Scheduler stopped: emitted {len(ticks)}, skipped ")


def test_single_runs_a_scheduler_on_a_broker_without_claims(
    jobs: str, capsys: pytest.CaptureFixture[str], noclaims: None
) -> None:
    write(jobs, 'handlers.every(seconds=1, type="ping")\n')
    stop_soon(1.5)
    argv = ["scheduler", "--url", "noclaims://q", "--handlers", f"{jobs}:handlers", "--single"]
    assert main(argv) == 0
    assert "Scheduler stopped: emitted " in capsys.readouterr().out


def test_emit_unique_for_emits_the_first_and_skips_the_duplicate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["emit", "--url", "memory://cli-unique", "sync", "--unique-for", "60"]
    assert main([*argv, "--unique-key", "user-7"]) == 0
    first = capsys.readouterr()
    assert first.err.startswith("Emitted message #")
    assert first.out.strip() in first.err  # the id alone on stdout
    assert main([*argv, "--unique-key", "user-7"]) == 0
    second = capsys.readouterr()
    assert "Skipped message #" in second.err
    assert second.out == ""


def test_unique_key_without_unique_for_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = one_line_error(capsys, ["emit", "--url", "memory://x", "sync", "--unique-key", "k"])
    assert "--unique-key needs --unique-for" in err


def test_emit_unique_for_on_a_broker_without_claims_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], noclaims: None
) -> None:
    err = one_line_error(capsys, ["emit", "--url", "noclaims://x", "sync", "--unique-for", "5"])
    assert "--unique-for needs a broker that can claim" in err


def test_a_worker_s_scheduler_thread_that_dies_says_so_at_error(
    jobs: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse
    import logging
    import time

    from hermes.core._cli import _scheduler
    from hermes.core._cli._loading import load_object
    from hermes.core.schedule import Scheduler

    def broken(self: Scheduler, now: float) -> float:
        raise RuntimeError("the clock is gone")

    monkeypatch.setattr(Scheduler, "next_fire_time", broken)
    write(jobs, 'handlers.every(seconds=1, type="ping", catch_up="none")\n')
    target = load_object(f"{jobs}:handlers")
    args = argparse.Namespace(handlers=f"{jobs}:handlers", scheduler=True, lock_url=None)
    driver = MemoryDriver(jobs)
    caplog.set_level(logging.INFO, logger="hermes")
    try:
        with _scheduler.running_in_worker(args, target, driver, f"memory://{jobs}"):
            deadline = time.monotonic() + 10
            while not [r for r in caplog.records if r.levelno == logging.ERROR]:
                assert time.monotonic() < deadline, "no ERROR line from the scheduler thread"
                time.sleep(0.01)
    finally:
        driver.teardown()
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "scheduler" in error.getMessage() and "the clock is gone" in error.getMessage()
    assert error.exc_info is not None


class _TrackedLock(MemoryDriver):
    """A claims broker that records, as it is closed, which scheduler threads still run."""

    closed_with: ClassVar[list[list[str]]] = []

    def close(self) -> None:
        running = [t.name for t in threading.enumerate() if t.name == "hermes-scheduler"]
        _TrackedLock.closed_with.append(running)
        super().close()


class _TrackedLockPlugin:
    @hookimpl
    def hermes_drivers(self) -> list[DriverPlugin]:
        return [
            DriverPlugin(
                name="trackedlock",
                schemes=("trackedlock",),
                factory=lambda url: _TrackedLock(url.host or "trackedlock"),
                capabilities=MemoryDriver.capabilities,
                isolate=lambda url, namespace: f"trackedlock://{namespace}",
            )
        ]


def test_a_worker_s_scheduler_thread_ends_and_its_lock_url_closes_with_the_worker(
    jobs: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write(jobs, 'handlers.every(seconds=1, type="ping", catch_up="none")\n'
                'handlers.register_handler("ping", lambda message: None)\n')  # fmt: skip
    plugin = _TrackedLockPlugin()
    plugin_manager().register(plugin)
    _TrackedLock.closed_with = []
    url = f"memory://{jobs}"
    broker = connect(url)
    try:
        broker.send(Message("ping"))
        code = main(
            ["worker", "--url", url, "--handlers", f"{jobs}:handlers", "--scheduler",
             "--lock-url", f"trackedlock://{jobs}", "--max-items", "1"]
        )  # fmt: skip
    finally:
        plugin_manager().unregister(plugin)
        broker.teardown()
    assert code == 0, capsys.readouterr().err
    # Closed once, after the scheduler thread that claimed on it had ended.
    assert _TrackedLock.closed_with == [[]]
