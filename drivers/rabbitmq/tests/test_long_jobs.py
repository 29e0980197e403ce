"""Jobs that outlast the heartbeat timeout, run by ``hermes worker`` on the real broker.

pika sends heartbeats only while it is called: a worker whose every handler
thread is in a long job must still service its connection, or RabbitMQ drops
it, delivers the job again and the acknowledgement never arrives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hermes_test_support import eventually

from hermes.core import Message
from hermes.drivers.rabbitmq import LazyRabbitMqDriver

MakeDriver = Callable[..., LazyRabbitMqDriver]

#: The broker drops a connection it heard nothing from for about two of these.
HEARTBEAT_S = 2
#: How long each job runs: several heartbeat timeouts.
JOB_S = 12.0
#: Worker start (imports Hermes), the jobs, and a slow shared machine.
WORKERS_S = 120.0

HANDLERS = textwrap.dedent(
    """
    import os
    import time

    OUT = os.environ["HERMES_TEST_OUT"]
    JOB_S = float(os.environ["HERMES_TEST_JOB_S"])


    def append(name, message):
        with open(os.path.join(OUT, name), "a") as file:
            file.write(message.id + "\\n")


    def long_job(message):
        append("started", message)
        time.sleep(JOB_S)
        append("finished", message)
        return True


    handlers = {"long": long_job}
    """
)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def ready(channel: Any, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


@pytest.mark.parametrize(
    ("options", "jobs"),
    [
        pytest.param(["--concurrency", "1"], 1, id="concurrency 1"),
        pytest.param(["--concurrency", "4"], 4, id="concurrency 4, every thread busy"),
        pytest.param(["--processes", "2"], 2, id="2 processes"),
    ],
)
def test_a_job_longer_than_the_heartbeat_timeout_runs_once_and_is_acknowledged(
    make_driver: MakeDriver,
    url: str,
    queue: str,
    raw_channel: Any,
    tmp_path: Path,
    options: list[str],
    jobs: int,
) -> None:
    (tmp_path / "jobs.py").write_text(HANDLERS)
    out = tmp_path / "out"
    out.mkdir()
    driver = make_driver()
    messages = [Message("long", {"n": n}) for n in range(jobs)]
    for message in messages:
        driver.send(message)
    ids = sorted(message.id for message in messages)

    log = tmp_path / "worker.log"
    command = [sys.executable, "-m", "hermes.core.cli", "worker",
               "--url", f"{url}&heartbeat={HEARTBEAT_S}", "--handlers", "jobs:handlers",
               *options]  # fmt: skip
    env = {**os.environ, "HERMES_TEST_OUT": str(out), "HERMES_TEST_JOB_S": str(JOB_S)}
    with log.open("wb") as sink:
        worker = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        eventually(
            lambda: sorted(lines(out / "finished")) == ids,
            f"{jobs} job(s) of {JOB_S:g} s finished",
            timeout_s=WORKERS_S,
            interval_s=0.2,
            details=lambda: f"finished {lines(out / 'finished')}; log:\n{log.read_text()}",
        )
        # Acknowledged: nothing waits in the queue once the worker let go of its
        # connection (RabbitMQ requeues what a closed connection did not acknowledge).
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(WORKERS_S) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
    output = log.read_text()
    assert ready(raw_channel, queue) == 0, output
    assert sorted(lines(out / "started")) == ids, output
    assert "could not acknowledge" not in output
    assert "skipped acknowledging" not in output  # a tag of a connection since lost
