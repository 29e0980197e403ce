"""Every command output the documentation shows is what Hermes prints.

A ```sh block whose first line is ``$ hermes ...`` shows a command and its
output. The test for each such block sets up what the page describes, runs the
command (the installed ``hermes``, as a reader would), and compares its output
with the block after masking only what differs between runs: the clock, the
queue's directory, the widths of columns, and the host, pids, counts and
times of live workers.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from hermes.core import Message, connect

DOCS = Path(__file__).parent
HERMES = [sys.executable, "-m", "hermes.core.cli"]
_CLOCK = re.compile(r"\b\d\d:\d\d:\d\d\b")
_ID = re.compile(r"#[0-9a-f]{8}-[0-9a-f-]{27}")
_SPAN = re.compile(r"\b(\d+[dhms])+\b")
_NUMBER = re.compile(r"\d[\d,]*")
#: A worker subprocess imports, connects and publishes its first heartbeat within this.
START_S = 60.0


def shown(page: str, command: str) -> tuple[str, list[str]]:
    """The command line and output lines of the block on ``page`` that runs ``command``."""
    lines = (DOCS / page).read_text().splitlines()
    for at, line in enumerate(lines):
        if line.startswith(f"$ {command}"):
            end = lines.index("```", at)
            return line[2:], lines[at + 1 : end]
    raise AssertionError(f"{page} shows no `$ {command}` block")


def cells(lines: list[str], mask: Callable[[str], str] = lambda s: s) -> list[list[str]]:
    """Each line split into its cells (the column widths depend on the data), masked."""
    return [mask(line).split() for line in lines if line.strip()]


def run(argv: list[str]) -> list[str]:
    done = subprocess.run([*HERMES, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_stats_table_of_operating_md_is_what_hermes_stats_prints(tmp_path: Path) -> None:
    command, output = shown("operating.md", "hermes stats")
    shown_url = command.split()[3]  # hermes stats --url URL ...
    directory = tmp_path / "jobs"
    url = f"file://{directory}"
    driver = connect(url)
    try:
        driver.send_batch([Message("job", {"n": n}) for n in range(13)])
        later = time.time() + 3600
        driver.send_batch([Message("job", {"n": n}, execute_at=later) for n in range(5)])
        consumer = driver.consumer([])
        held = consumer.receive(5.0)  # taken by a worker, not yet acknowledged: in flight
        assert held is not None

        printed = run(["stats", "--url", url, *command.split()[4:]])
    finally:
        driver.close()
    shown_dir = shown_url.removeprefix("file://")

    def mask(line: str) -> str:
        return _CLOCK.sub("HH:MM:SS", line.replace(str(directory), shown_dir))

    assert cells(printed, mask) == cells(output, mask)


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The local Redis under a prefix of this test's own, deleted afterwards."""
    prefix = f"docs-{uuid.uuid4().hex[:8]}:"
    yield f"redis://127.0.0.1:6379/0?prefix={prefix}"
    client = redis.Redis()
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_the_workers_table_of_dashboard_md_is_what_hermes_workers_prints(
    tmp_path: Path, redis_url: str
) -> None:
    command, output = shown("dashboard.md", "hermes workers")
    (tmp_path / "docs_jobs.py").write_text(
        textwrap.dedent(
            """
            import time
            from pathlib import Path
            from hermes.core import HandlerRegistry

            handlers = HandlerRegistry()

            @handlers.handler("invoice.send")
            def send(message):
                while not Path("release").exists():
                    time.sleep(0.05)

            handlers.every(hours=1, type="report.nightly")
            """
        )
    )
    common = ["--url", redis_url, "--handlers", "docs_jobs:handlers", "-q"]
    started = [
        subprocess.Popen([*HERMES, "scheduler", *common], cwd=tmp_path),
        subprocess.Popen(
            [*HERMES, "worker", *common, "--processes", "2", "--concurrency", "4"], cwd=tmp_path
        ),
    ]
    try:
        run(["emit", "--url", redis_url, "invoice.send", "{}", "-q"])
        deadline = time.monotonic() + START_S
        printed = run(["workers", "--url", redis_url])
        while len(printed) < 4 or "invoice.send #" not in "\n".join(printed):
            assert time.monotonic() < deadline, f"never three workers, one busy: {printed}"
            time.sleep(0.2)
            printed = run(["workers", "--url", redis_url])
    finally:
        (tmp_path / "release").touch()
        for process in started:
            process.terminate()
        for process in started:
            process.wait(timeout=60)

    def mask(line: str) -> str:
        line = _NUMBER.sub("N", _SPAN.sub("SPAN", _ID.sub("#ID", line)))
        return line if line.startswith("host ") else "HOST " + line.split(None, 1)[1]

    assert command.split()[:2] == ["hermes", "workers"]
    # Which child takes the job varies: the rows are compared as a set.
    assert sorted(map(tuple, cells(printed, mask))) == sorted(map(tuple, cells(output, mask)))
