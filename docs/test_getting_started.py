"""The Getting started page, followed as a newcomer would: its shell blocks, run as written.

The page's three ``sh`` blocks are read from the page and run by bash in
order, in a project directory of the test's own:

1. build the wheels in the clone, make a virtual environment and install
   hermes-core and hermes-filesystem from them (``./run`` and ``dist`` in the
   project directory stand for the clone's, where the page's reader stands);
2. start ``hermes worker`` on the page's ``myapp/jobs.py``, in the background;
3. emit two jobs and print the queue's stats.

Then the worker must have handled the first job (the second waits ten
seconds) and stop on Ctrl-C (SIGINT) with exit 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

DOCS = Path(__file__).parent
ROOT = DOCS.parent
PAGE = DOCS / "getting-started.md"
#: Wheels built and a venv installed from them (with the dependencies from the index).
INSTALL_S = 600
#: A worker starts and handles its first job within this.
WORKER_S = 60.0


def sh_blocks() -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", PAGE.read_text(), re.M | re.S)


def titled_block(title: str) -> str:
    found = re.search(
        rf'^```python title="{re.escape(title)}"\n(.*?)^```$', PAGE.read_text(), re.M | re.S
    )
    assert found is not None, f"{PAGE.name} shows no {title}"
    return found.group(1)


def bash(script: str, cwd: Path, env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{script}\nfailed ({done.returncode}):\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_getting_started_commands_install_run_a_worker_and_emit(tmp_path: Path) -> None:
    install, start_worker, emit = sh_blocks()
    project = tmp_path / "project"
    (project / "myapp").mkdir(parents=True)
    (project / "myapp" / "__init__.py").write_text("")
    (project / "myapp" / "jobs.py").write_text(titled_block("myapp/jobs.py"))
    # The reader runs the first block in the clone; here ./run is the clone's and
    # dist/ the wheels it builds there.
    (project / "run").write_text(f'#!/bin/sh\nexec "{ROOT / "run"}" "$@"\n')
    (project / "run").chmod(0o755)
    (project / "dist").symlink_to(ROOT / "dist")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env["PYTHONUNBUFFERED"] = "1"  # print as in a terminal, line by line
    env.pop("VIRTUAL_ENV", None)
    env.pop("HERMES_URL", None)  # the page relies on the default queue, ./hermes-queue

    bash(install, project, env, INSTALL_S)
    activate = ". .venv/bin/activate\n"
    log = project / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            ["bash", "-c", activate + "exec " + start_worker.strip()],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        printed = bash(activate + emit, project, env, 60)
        deadline = time.monotonic() + WORKER_S
        while "sending to ana@example.com" not in log.read_text():
            assert worker.poll() is None, f"the worker ended:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the first job was not handled:\n{log.read_text()}"
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGINT)
        code = worker.wait(30)

    assert code == 0, log.read_text()
    shown = log.read_text()
    assert "sending to bob@example.com" not in shown  # not before ten seconds
    ids = [line for line in printed.splitlines() if re.fullmatch(r"[0-9a-f-]{36}", line)]
    assert len(ids) == 2, printed  # hermes emit prints the id alone on stdout
    print(printed)
