"""Helpers of the dashboard tests: subprocesses, HTTP, polling to a deadline, screenshots.

Every session gets Redis keys of its own (a prefix), so these tests share
the server with any other suite. The worker reads priority 100 only; the
dashboard also shows priorities 50 and 60, where messages wait untouched
for the tests that count and purge them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
HERMES = shutil.which("hermes", path=os.path.dirname(sys.executable)) or "hermes"
#: How long a test waits for a page, a worker or a server to get somewhere.
DEADLINE_S = 30.0
#: How soon after a click on Pause (or Resume) every worker reading the priority must
#: skip it (or take it again): what an operator is promised.
PAUSE_HOLDS_S = 5.0
#: Where the READMEs' screenshots are (docs/img/dashboard links here): with
#: ``HERMES_SCREENSHOTS=1`` the browser tests write theirs there, to commit;
#: ``HERMES_SCREENSHOTS_DIR=DIR`` into DIR instead; else none.
README_SCREENSHOTS = HERE.parent / "docs" / "screenshots"
SCREENSHOTS: Path | None = (
    Path(os.environ["HERMES_SCREENSHOTS_DIR"])
    if os.environ.get("HERMES_SCREENSHOTS_DIR")
    else README_SCREENSHOTS
    if os.environ.get("HERMES_SCREENSHOTS") == "1"
    else None
)


def eventually(predicate: Callable[[], Any], timeout_s: float = DEADLINE_S) -> Any:
    """Poll ``predicate`` until it returns something true; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout_s:g} s waiting for {predicate.__doc__ or predicate}"
            )
        time.sleep(0.1)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def post(url: str, fields: dict[str, str]) -> int:
    data = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in fields.items()).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@contextlib.contextmanager
def running(
    args: list[str], cwd: Path, env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_dashboard(
    url: str, cwd: Path, env: dict[str, str], log: Path, *extra: str
) -> contextlib.AbstractContextManager[str]:
    """``hermes dashboard`` on a free port until the block ends; yields its base URL."""

    @contextlib.contextmanager
    def serve() -> Iterator[str]:
        port = free_port()
        args = [HERMES, "dashboard", "--url", url, "--port", str(port), *extra]
        with running(args, cwd, env, log) as proc:
            base = f"http://127.0.0.1:{port}"

            def up() -> bool:
                """the dashboard to answer"""
                if proc.poll() is not None:
                    pytest.fail(
                        f"hermes dashboard exited {proc.returncode}: {log.read_text()[-2000:]}"
                    )
                try:
                    return get(base + "/")[0] in (200, 401, 503)
                except OSError:
                    return False

            eventually(up, 60)
            yield base

    return serve()


@dataclass
class Deployment:
    """The Redis URLs, the worker's directory, the dashboard's base URL."""

    url: str
    failed_url: str
    base: str
    work: Path
    worker_pid: int
    results_url: str = ""

    def emit(
        self,
        type_: str,
        payload: Any = None,
        priority: int = 100,
        execute_at: float | None = None,
    ) -> str:
        from hermes.core import Message, connect
        from hermes.core._cli._common import setup_priorities

        message = Message(type_, payload, execute_at=execute_at)
        with connect(self.url) as driver:
            setup_priorities(driver, [priority])
            driver.send(message, priority)
        return message.id

    def handled_ids(self) -> list[str]:
        path = self.work / "handled.jsonl"
        if not path.exists():
            return []
        return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def screenshot(browser: Any, name: str) -> None:
    """The page as the browser shows it, as ``<name>.png`` where the docs show it."""
    if SCREENSHOTS is not None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


@contextlib.contextmanager
def deploy(
    url: str,
    failed_url: str,
    results_url: str,
    work: Path,
    handlers: str,
    *,
    worker_priority: int = 100,
    shown: tuple[int, ...] = (50, 60, 80),
) -> Iterator[Deployment]:
    """A ``hermes worker`` reading ``worker_priority`` and a ``hermes dashboard`` also
    showing the priorities ``shown``, both running ``handlers`` (MODULE:OBJECT), with a
    failed-message store and a records store; every queue torn down afterwards."""
    env = {k: v for k, v in os.environ.items() if k not in ("HERMES_URL", "HERMES_DASHBOARD_AUTH")}
    env["DASH_TEST_DIR"] = str(work)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    stores = ["--failed-url", failed_url, "--results-url", results_url, "--handlers", handlers]
    worker_args = [HERMES, "worker", "--url", url, *stores, "--priority", str(worker_priority)]
    worker_args += ["--concurrency", "2", "--heartbeat-interval", "1"]
    dashboard_priorities = [p for p in dict.fromkeys((worker_priority, *shown)) if p != 100]
    extra = [arg for p in dashboard_priorities for arg in ("--priority", str(p))]
    try:
        with (
            running(worker_args, HERE, env, work / "worker.log") as worker,
            serve_dashboard(
                url,
                HERE,
                env,
                work / "dashboard.log",
                *stores,
                *extra,
                "--sample-interval",
                "1",
            ) as base,
        ):
            yield Deployment(url, failed_url, base, work, worker.pid, results_url)
    finally:
        from hermes.core import connect
        from hermes.core._cli._common import setup_priorities

        for each in (url, failed_url, results_url):
            with connect(each) as driver:
                setup_priorities(driver, [worker_priority, *shown])
                driver.teardown()  # type: ignore[attr-defined]


def pause_and_resume(browser: Any, deployment: Deployment, priority: int, worker_pid: int) -> None:
    """Pause ``priority`` on the Queues page, see the worker ``worker_pid`` (which reads it)
    say it skips it and a message sent there wait, then Resume and see that message handled."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def main_text() -> str:
        try:
            return str(browser.find_element(By.TAG_NAME, "main").text)
        except (NoSuchElementException, StaleElementReferenceException):
            return ""  # a click's navigation is replacing the page

    row = f'tr[data-priority="{priority}"]'
    browser.get(deployment.base + "/queues")
    clicked = time.monotonic()
    browser.find_element(By.CSS_SELECTOR, f"{row} button.pause").click()
    eventually(lambda: f"Paused priority {priority}" in main_text())
    assert browser.find_element(By.CSS_SELECTOR, f"{row} span.paused").text == "paused"

    def skips() -> bool:
        """the worker to say on the Workers page that it skips the paused priority"""
        browser.get(deployment.base + "/workers")
        cells = browser.find_elements(By.CSS_SELECTOR, f'tr[data-pid="{worker_pid}"] .skips')
        return bool(cells) and cells[0].text == f"skips {priority} (paused)"

    # The worker has switched to a consumer without the priority once its record says so.
    eventually(skips, PAUSE_HOLDS_S - (time.monotonic() - clicked))
    held = deployment.emit("ok", {"while": "paused"}, priority=priority)
    time.sleep(1.5)  # three of the worker's polls of the pause
    assert held not in deployment.handled_ids()
    browser.get(deployment.base + "/queues")
    ready = browser.find_element(By.CSS_SELECTOR, f"{row} td.ready").text
    assert int(ready.replace(",", "")) >= 1
    screenshot(browser, "queues-paused")

    clicked = time.monotonic()
    browser.find_element(By.CSS_SELECTOR, f"{row} button.resume").click()
    eventually(lambda: f"Resumed priority {priority}" in main_text())

    def takes() -> bool:
        """the worker's record on the Workers page to skip nothing any more"""
        browser.get(deployment.base + "/workers")
        rows = browser.find_elements(By.CSS_SELECTOR, f'tr[data-pid="{worker_pid}"]')
        return bool(rows) and not rows[0].find_elements(By.CSS_SELECTOR, ".skips")

    eventually(takes, PAUSE_HOLDS_S - (time.monotonic() - clicked))
    eventually(lambda: held in deployment.handled_ids())
    assert not browser.find_elements(By.CSS_SELECTOR, f"{row} span.paused")
