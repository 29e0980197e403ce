"""The message that kills its worker: ``hermes worker --max-deliveries 3`` sets it aside.

A handler SIGKILLs its own process on one message type, as a segfault or the
OOM killer would. The test restarts the worker each time it dies, like a
process supervisor. On every at-least-once driver that counts deliveries,
the killer comes back after each death until its fourth delivery, which the
worker sets aside into the failed-message store without calling the handler;
every other message is handled.

Run by ``nox -s torture``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes.core import FailedStore, Message, connect
from hermes.core.driver import DriverUrl, SupportsTeardown
from hermes.core.drivertools import isolated_url

ROOT = Path(__file__).resolve().parent.parent
#: Service name -> options that bring a dead worker's message back within about a second.
TARGETS = {
    "filesystem": {},
    "redis-at-least-once": {"lease_timeout": "1"},
    "postgres": {"lease_timeout": "1"},
    "sqs": {"visibility_timeout": "1"},
    # RabbitMQ hands a dead consumer's messages out again as its connection closes.
    "rabbitmq-quorum": {},
}
LIMIT = 3
GOOD = 20
#: The whole run's deadline: 3 deaths, each redelivered within a few seconds.
DEADLINE_S = 120.0

JOBS = """
import os, signal

def kill(message):
    os.kill(os.getpid(), signal.SIGKILL)

def good(message):
    with open(os.environ["HERMES_HANDLED_FILE"], "a") as file:
        file.write(message.id + "\\n")

HANDLERS = {"kill": kill, "good": good}
"""


@pytest.fixture(params=list(TARGETS))
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    from hermes_test_services import service_url

    if not (ROOT / "drivers" / request.param.split("-")[0] / "pyproject.toml").exists():
        pytest.skip(f"drivers/{request.param} does not exist yet")
    with service_url(request.param) as base:
        isolated = isolated_url(base, f"deliveries-{uuid.uuid4().hex[:10]}")
        yield DriverUrl.parse(isolated).with_options(**TARGETS[request.param])


def test_a_message_that_kills_its_worker_is_set_aside_after_three_deliveries(
    url: str, tmp_path: Path
) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    failed_url = f"file://{tmp_path / 'failed'}"
    driver = connect(url)
    killer = Message("kill")
    good = [Message("good", {"n": n}) for n in range(GOOD)]
    try:
        driver.send(killer)
        driver.send_batch(good)
        deaths = 0
        runs = 0
        deadline = time.monotonic() + DEADLINE_S
        handled: set[str] = set()
        kept: list[str] = []
        hermes = [str(Path(sys.executable).with_name("hermes"))]
        handled_path = tmp_path / "worker.handled"
        while time.monotonic() < deadline:
            runs += 1
            with open(tmp_path / f"worker-{runs}.log", "w") as log:
                worker = subprocess.Popen(
                    [
                        *hermes,
                        "worker",
                        "--url",
                        url,
                        "--handlers",
                        "jobs:HANDLERS",
                        "--max-deliveries",
                        str(LIMIT),
                        "--failed-url",
                        failed_url,
                    ],
                    cwd=tmp_path,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    env=_env(handled_path),
                )
            while worker.poll() is None and time.monotonic() < deadline:
                handled = _handled(handled_path)
                kept = _kept(failed_url)
                if kept and handled >= {m.id for m in good}:
                    worker.send_signal(signal.SIGTERM)
                    break
                time.sleep(0.2)
            code = worker.wait(30)
            if code == -signal.SIGKILL:
                deaths += 1
                continue
            break
        logs = "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("worker-*.log")))
        assert kept == [killer.id], f"the killer was not set aside; failed store: {kept}\n{logs}"
        assert handled >= {m.id for m in good}, (
            f"{len({m.id for m in good} - handled)} good messages not handled\n{logs}"
        )
        assert deaths == LIMIT, f"the worker died {deaths} times, not {LIMIT}\n{logs}"
        assert "more than max_deliveries=3" in logs, logs
    finally:
        if isinstance(driver, SupportsTeardown):
            driver.teardown()
        driver.close()


def _env(handled_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HERMES_HANDLED_FILE"] = str(handled_path)
    return env


def _handled(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except FileNotFoundError:
        return set()


def _kept(failed_url: str) -> list[str]:
    with FailedStore.connect(failed_url) as store:
        return [message.id for message in store.messages()]
