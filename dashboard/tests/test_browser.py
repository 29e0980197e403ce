"""The dashboard in headless Chromium, against a real worker and a real dashboard on Redis."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dash_support import (
    HERE,
    HERMES,
    Deployment,
    eventually,
    get,
    pause_and_resume,
    post,
    screenshot,
    serve_dashboard,
)
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By


def cell(browser: Any, priority: int, column: str) -> str:
    return str(
        browser.find_element(By.CSS_SELECTOR, f'tr[data-priority="{priority}"] td.{column}').text
    )


def open_page(browser: Any, url: str) -> str:
    browser.get(url)
    return str(browser.find_element(By.TAG_NAME, "main").text)


def main_text(browser: Any) -> str:
    """The page's main text; "" while a click's navigation is replacing the page.

    A click on a link or a form's button returns before the next page has
    loaded: what it leads to is polled for, never read at once.
    """
    try:
        return str(browser.find_element(By.TAG_NAME, "main").text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


@contextlib.contextmanager
def own_worker(
    deployment: Deployment, priority: int, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``hermes worker`` of the test's own on ``priority`` (no other test's), its output in
    ``log``, beating every half second; killed at the end."""
    env = {k: v for k, v in os.environ.items() if k != "HERMES_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env["DASH_TEST_DIR"] = str(deployment.work)
    args = [HERMES, "worker", "--url", deployment.url, "--handlers", "dash_jobs:handlers"]
    args += ["--priority", str(priority), "--heartbeat-interval", "0.5"]
    with log.open("wb") as out:
        worker = subprocess.Popen(args, cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield worker
    finally:
        worker.kill()
        worker.wait()


def test_the_overview_counts_change_as_messages_are_emitted(
    browser: Any, deployment: Deployment
) -> None:
    open_page(browser, deployment.base + "/")
    before = int(cell(browser, 50, "ready").replace(",", ""))
    for n in range(3):
        deployment.emit("ok", {"n": n}, priority=50)

    def counted() -> bool:
        """the overview to count the three new messages"""
        open_page(browser, deployment.base + "/")
        return int(cell(browser, 50, "ready").replace(",", "")) == before + 3

    eventually(counted)
    held = cell(browser, 100, "in-flight")
    assert held.isdigit(), f"Redis holds nothing in flight: the heartbeats count it, not {held}"
    eventually(lambda: len(browser.find_elements(By.CSS_SELECTOR, "svg.chart polyline")) > 0)
    screenshot(browser, "overview")


def test_a_failed_message_is_retried_from_the_page_and_then_handled_by_the_worker(
    browser: Any, deployment: Deployment
) -> None:
    failing = deployment.emit("flaky", {"order": 7})

    def listed() -> bool:
        """the failed message to be listed on the Failed page"""
        open_page(browser, deployment.base + "/failed")
        return bool(browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{failing}"]'))

    eventually(listed)
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-id="{failing}"]')
    assert "flaky" in row.text and "order" in row.text
    screenshot(browser, "failed")
    (deployment.work / "fixed").touch()
    row.find_element(By.CSS_SELECTOR, "button.retry").click()
    eventually(lambda: "Sent 1 failed message(s) back" in main_text(browser))
    eventually(lambda: failing in deployment.handled_ids())
    open_page(browser, deployment.base + "/failed")
    assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{failing}"]')


def test_a_failed_job_s_exception_class_and_message_show_with_a_folded_traceback(
    browser: Any, deployment: Deployment
) -> None:
    failing = deployment.emit("card.charge", {"order": 42})

    def listed() -> bool:
        """the failed card.charge message to be listed on the Failed page"""
        open_page(browser, deployment.base + "/failed")
        return bool(browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{failing}"]'))

    eventually(listed)
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-id="{failing}"]')
    shown = row.find_element(By.CSS_SELECTOR, "td.exception .raised").text
    assert shown == "dash_jobs.CardDeclined: card declined for order 42"
    folded = row.find_element(By.CSS_SELECTOR, "details.traceback")
    trace = folded.find_element(By.TAG_NAME, "pre")
    assert folded.get_attribute("open") is None and not trace.is_displayed(), "folded at first"
    folded.find_element(By.TAG_NAME, "summary").click()
    eventually(trace.is_displayed)
    assert "in charge" in trace.text
    assert trace.text.rstrip().endswith("dash_jobs.CardDeclined: card declined for order 42")


def test_a_job_found_by_id_from_the_header_shows_its_state_and_exception(
    browser: Any, deployment: Deployment
) -> None:
    failing = deployment.emit("card.charge", {"order": 7})
    open_page(browser, deployment.base + "/")

    def given_up() -> bool:
        """the card.charge job's page to say given_up, found through the header's search"""
        box = browser.find_element(By.CSS_SELECTOR, "header form.search input[name=id]")
        box.clear()
        box.send_keys(failing)
        box.submit()
        state = browser.find_elements(By.ID, "state")  # none while no worker has taken it
        return bool(state) and state[0].text == "given_up"

    eventually(given_up)
    assert browser.current_url == f"{deployment.base}/jobs/{failing}"
    error = browser.find_element(By.CSS_SELECTOR, "#error .raised").text
    assert error == "dash_jobs.CardDeclined: card declined for order 7"
    attempt = browser.find_element(By.CSS_SELECTOR, "table.attempts tbody tr").text
    assert "not_retryable" in attempt and "CardDeclined" in attempt  # its outcome
    screenshot(browser, "job")
    browser.find_element(By.LINK_TEXT, "All jobs").click()
    eventually(lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{failing}"]'))


def test_a_purge_asks_first_then_empties_only_the_queue_it_named(
    browser: Any, deployment: Deployment
) -> None:
    deployment.emit("ok", {"purge": "me"}, priority=60)
    deployment.emit("ok", {"purge": "me too"}, priority=60)
    deployment.emit("ok", {"keep": "me"}, priority=50)
    open_page(browser, deployment.base + "/queues")
    kept = int(cell(browser, 50, "ready"))
    name = browser.find_element(By.CSS_SELECTOR, 'tr[data-priority="60"] td:nth-child(2)').text
    browser.find_element(By.CSS_SELECTOR, 'tr[data-priority="60"] a.danger').click()
    eventually(lambda: "cannot be undone" in main_text(browser))
    question = browser.find_element(By.ID, "purge-question").text
    assert name in question and "cannot be undone" in question
    assert int(cell_from_stats(deployment, 60)) >= 2, "asking must not purge anything yet"
    screenshot(browser, "purge")
    browser.find_element(By.ID, "purge-confirm").click()
    purged = rf"Purged [2-9]\d* message\(s\) from {re.escape(name)}"
    eventually(lambda: re.search(purged, main_text(browser)))
    assert cell(browser, 60, "ready") == "0"
    assert int(cell(browser, 50, "ready")) == kept, "a purge of one queue touched another"
    screenshot(browser, "queues")


def cell_from_stats(deployment: Deployment, priority: int) -> int:
    from hermes.core import connect
    from hermes.core._cli._common import setup_priorities

    with connect(deployment.url) as driver:
        setup_priorities(driver, [50, 60])
        rows = {r.priority: r for r in driver.queue_stats()}  # type: ignore[attr-defined]
    return int(rows[priority].ready or 0)


def test_a_script_payload_renders_as_text(browser: Any, deployment: Deployment) -> None:
    attack = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"
    # No handler for the type: the worker gives up on it, and the Failed page shows it.
    shown = deployment.emit("nobody.handles", {"note": attack})

    def listed() -> bool:
        """the message with the script payload on the Failed page"""
        open_page(browser, deployment.base + "/failed")
        return bool(browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{shown}"]'))

    eventually(listed)
    text = browser.find_element(By.TAG_NAME, "main").text
    assert "<script>document.title='pwned'</script>" in text
    assert browser.title != "pwned"
    assert browser.find_elements(By.TAG_NAME, "script") == []
    assert not browser.find_elements(By.CSS_SELECTOR, "main img")


def test_a_post_without_the_csrf_token_is_refused_with_403(deployment: Deployment) -> None:
    deployment.emit("ok", {"stay": True}, priority=50)
    waiting = cell_from_stats(deployment, 50)
    assert post(deployment.base + "/queues/purge", {"priority": "50"}) == 403
    assert post(deployment.base + "/queues/purge", {"priority": "50", "csrf": "guess"}) == 403
    assert post(deployment.base + "/failed/retry", {"id": "x"}) == 403
    assert cell_from_stats(deployment, 50) == waiting, "a refused purge purged"
    status, page = get(deployment.base + "/")
    assert status == 200 and 'name="csrf"' not in page, "the overview changes nothing"


def test_a_non_loopback_bind_without_auth_is_refused(deployment: Deployment) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HERMES_DASHBOARD_AUTH"}
    run = subprocess.run(
        [HERMES, "dashboard", "--url", deployment.url, "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "not a loopback address" in run.stderr
    assert "Traceback" not in run.stderr


def test_the_workers_page_shows_a_worker_s_job_in_flight(
    browser: Any, deployment: Deployment
) -> None:
    slow = deployment.emit("slow", {"takes": "a while"})
    try:

        def shown() -> bool:
            """the Workers page to show the slow job in flight"""
            open_page(browser, deployment.base + "/workers")
            rows = browser.find_elements(By.CSS_SELECTOR, f'tr[data-pid="{deployment.worker_pid}"]')
            return bool(rows) and slow in rows[0].find_element(By.CSS_SELECTOR, "td.in-flight").text

        eventually(shown)
        assert "slow" in browser.find_element(By.CSS_SELECTOR, "td.in-flight").text
        screenshot(browser, "workers")
    finally:
        (deployment.work / "release").touch()
    eventually(lambda: slow in deployment.handled_ids())


def test_the_periodic_page_shows_each_entry_s_next_fire(
    browser: Any, deployment: Deployment
) -> None:
    text = open_page(browser, deployment.base + "/periodic")
    assert "hourly-report" in text and "every" in text
    assert "unknown" in text, "no scheduler runs: the last fire is unknown"
    screenshot(browser, "periodic")


# Requests from other sites, sent raw: a browser sets Host itself -------------------


def raw(
    base: str, method: str, path: str, headers: dict[str, str], body: str = ""
) -> tuple[int, str]:
    """One request with exactly these headers (``Host`` included), as a rebinding page sends."""
    parts = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        sent = dict(headers)
        if body:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        connection.request(method, path, body=body.encode() or None, headers=sent)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_a_page_asked_for_under_another_host_name_is_refused_with_400(
    deployment: Deployment,
) -> None:
    port = urllib.parse.urlsplit(deployment.base).port
    for path in ("/", "/queues", "/failed", "/workers", "/periodic"):
        status, body = raw(deployment.base, "GET", path, {"Host": f"rebind.test:{port}"})
        assert status == 400, path
        assert "csrf" not in body and len(body) < 200, body
        status, body = raw(deployment.base, "GET", path, {"Host": f"localhost:{port}"})
        assert status == 200, path


def test_a_post_from_a_rebound_name_or_another_origin_deletes_nothing(
    deployment: Deployment,
) -> None:
    from hermes.core import FailedStore, Message

    port = urllib.parse.urlsplit(deployment.base).port
    with FailedStore.connect(deployment.failed_url) as store:
        kept = store.keep(Message("rebind.victim", {"n": 1}), "kept for the test")
        _, page = get(deployment.base + "/failed")
        token = re.search(r'name="csrf" value="([^"]+)"', page)
        assert token is not None
        form = f"csrf={urllib.parse.quote(token.group(1))}&id={kept.id}"
        attacker = f"http://rebind.test:{port}"
        attempts = [
            ({"Host": f"rebind.test:{port}", "Origin": attacker}, 400),
            ({"Host": f"127.0.0.1:{port}", "Origin": attacker}, 403),
            ({"Host": f"127.0.0.1:{port}", "Sec-Fetch-Site": "cross-site"}, 403),
        ]
        for headers, refused in attempts:
            status, _ = raw(deployment.base, "POST", "/failed/delete", headers, form)
            assert status == refused, headers
        assert kept.id in {m.id for m in store.messages()}, "a refused POST deleted"
        own = {"Host": f"127.0.0.1:{port}", "Origin": deployment.base}
        status, _ = raw(deployment.base, "POST", "/failed/delete", own, form)
        assert status == 303
        assert kept.id not in {m.id for m in store.messages()}


# Records another program wrote, on a dashboard of their own ------------------------


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A dashboard on a filesystem broker no worker reads: ``(base, url, failed_url)``."""
    url = f"file://{tmp_path / 'queue'}"
    failed_url = f"file://{tmp_path / 'failed'}"
    env = {k: v for k, v in os.environ.items() if k not in ("HERMES_URL", "HERMES_DASHBOARD_AUTH")}
    log = tmp_path / "dashboard.log"
    with serve_dashboard(url, HERE, env, log, "--failed-url", failed_url) as base:
        yield base, url, failed_url


def test_records_with_times_in_the_wrong_unit_show_as_invalid_on_every_page(
    browser: Any, spool: tuple[str, str, str]
) -> None:
    from hermes.core import FailedStore, Message, connect

    base, url, failed_url = spool
    millis = time.time() * 1000
    with connect(url) as driver:
        driver.send(Message("legacy.job", {"from": "php"}, created=millis))
        record = {
            "id": "web-9:77:bad",
            "kind": "worker",
            "host": "web-9",
            "pid": 77,
            "started": "2025-01-01T10:00:00Z",
            "last_seen": time.time(),
            "handled": "lots",
            "in_flight": "nothing",
        }
        driver.beat(record, 300)  # type: ignore[attr-defined]
    with FailedStore.connect(failed_url) as store:
        failed = store.keep(Message("legacy.failed", {"n": 1}), "it broke", failed_at=millis)

    def invalid_cells(path: str) -> list[str]:
        text = open_page(browser, base + path)
        assert "Internal error" not in browser.page_source, path
        assert text, f"{path} shows nothing"
        return [e.text for e in browser.find_elements(By.CSS_SELECTOR, "main .invalid")]

    queued = invalid_cells("/queues")
    assert "legacy.job" in main_text(browser)
    assert queued and all("invalid" in t for t in queued), queued
    assert invalid_cells("/failed") and failed.id in main_text(browser)
    workers = invalid_cells("/workers")
    assert any("2025-01-01T10:00:00Z" in t for t in workers), workers
    assert browser.find_elements(By.CSS_SELECTOR, 'tr[data-pid="77"]')
    open_page(browser, base + "/")
    assert browser.find_element(By.ID, "live-workers").text == "1"
    invalid_cells("/periodic")


def _page_width(browser: Any) -> tuple[int, int]:
    """How wide the page is laid out, and how wide the window shows it."""
    return (
        int(browser.execute_script("return document.documentElement.scrollWidth")),
        int(browser.execute_script("return document.documentElement.clientWidth")),
    )


def test_no_page_scrolls_sideways_with_a_400_character_type_and_a_long_broker_url(
    browser: Any, hostile: Deployment
) -> None:
    from dash_jobs import LONG_TYPE

    from hermes.core import connect
    from hermes.core.heartbeat import pause, resume
    from hermes.core.jobs import Jobs
    from hermes.core.workflows import Workflows, chain, group, job

    failing = hostile.emit(LONG_TYPE, {"order": 1, "note": "y" * 500})
    held = hostile.emit(LONG_TYPE, {"hold": True})
    hostile.emit(LONG_TYPE, {"waiting": "z" * 300}, priority=50)

    def shown() -> bool:
        """the failed job on the Failed page and the held one on the Workers page"""
        failed = open_page(browser, hostile.base + "/failed")
        workers = open_page(browser, hostile.base + "/workers")
        return failing in failed and held in workers

    eventually(shown)
    assert len(hostile.url) >= 150 and len(LONG_TYPE) == 400
    # A workflow of steps of that type (they fail: its tree says so), and a paused queue.
    with connect(hostile.url) as driver, contextlib.closing(Jobs(hostile.results_url)) as jobs:
        steps = group(job(LONG_TYPE, {"order": n}) for n in (3, 4))
        flow = Workflows(driver, jobs).start(chain(steps, job(LONG_TYPE, {"order": 5})))
        eventually(lambda: flow.state == "failed")
        pause(driver, 50, "from the test " + "with a long name " * 10)
    pages = ["/", "/queues", "/failed", "/jobs", f"/jobs/{failing}", "/workers", "/periodic"]
    pages += [f"/failed/delete?id={failing}", f"/jobs/{flow.id}", f"/failed?job={failing}"]
    pages += ["/queues?" + urllib.parse.urlencode({"type": LONG_TYPE, "priority": 50})]
    too_wide = []
    try:
        for width in (1280, 390):
            browser.set_window_size(width, 860)
            for path in pages:
                open_page(browser, hostile.base + path)
                laid_out, window = _page_width(browser)
                if laid_out > window:
                    too_wide.append(f"{path} at {width} px: {laid_out} px wide in {window}")
            if width == 1280:
                nav = browser.find_element(By.CSS_SELECTOR, "header nav")
                assert nav.size["height"] < 30, "the navigation wrapped onto two lines"
    finally:
        browser.set_window_size(1280, 860)
        (hostile.work / "release").touch()
        with connect(hostile.url) as driver:
            resume(driver, 50, "by the test")
    assert not too_wide, "; ".join(too_wide)
    # Cut in lists, whole on hover; whole on the job's own page.
    open_page(browser, hostile.base + "/jobs")
    clipped = browser.find_element(By.CSS_SELECTOR, f'tr[data-id="{failing}"] td.type .clipped')
    assert clipped.get_attribute("title") == LONG_TYPE and len(clipped.text) < 100
    open_page(browser, hostile.base + f"/jobs/{failing}")
    assert browser.find_element(By.CSS_SELECTOR, "td.type").text == LONG_TYPE


def _colors(browser: Any, selector: str) -> tuple[str, str]:
    """The computed background and text colours of the first ``selector``."""
    script = (
        "const s = getComputedStyle(document.querySelector(arguments[0]));"
        "return [s.backgroundColor, s.color]"
    )
    background, color = browser.execute_script(script, selector)
    return str(background), str(color)


def _lightness(css_color: str) -> float:
    """0 (black) to 1 (white): the mean of an ``rgb(r, g, b)``'s channels."""
    channels = [int(c) for c in re.findall(r"\d+", css_color)[:3]]
    return sum(channels) / (3 * 255)


def test_every_page_follows_the_browser_s_dark_mode(browser: Any, deployment: Deployment) -> None:
    pages = ["/", "/queues", "/failed", "/jobs", "/workers", "/periodic"]
    dark = {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
    light = {"features": [{"name": "prefers-color-scheme", "value": "light"}]}
    try:
        for scheme in (light, dark):
            browser.execute_cdp_cmd("Emulation.setEmulatedMedia", scheme)
            for path in pages:
                open_page(browser, deployment.base + path)
                background, color = _colors(browser, "body")
                table = _colors(browser, "table")[0] if "<table" in browser.page_source else None
                if scheme is dark:
                    assert _lightness(background) < 0.2 and _lightness(color) > 0.7, path
                    assert table is None or _lightness(table) < 0.2, f"{path}: a light table"
                else:
                    assert _lightness(background) > 0.8 and _lightness(color) < 0.3, path
            if scheme is dark:
                open_page(browser, deployment.base + "/")
                screenshot(browser, "overview-dark")
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_delete_all_on_the_failed_page_names_how_many_and_deletes_only_when_confirmed(
    browser: Any, hostile: Deployment
) -> None:
    from dash_jobs import LONG_TYPE

    failing = hostile.emit(LONG_TYPE, {"order": 2})

    def listed() -> bool:
        """the failed job on the Failed page"""
        open_page(browser, hostile.base + "/failed")
        return bool(browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{failing}"]'))

    eventually(listed)
    n = len(browser.find_elements(By.CSS_SELECTOR, "table.messages tbody tr"))
    what = f"{n} failed message{'s' if n != 1 else ''}"
    browser.find_element(By.ID, "delete-all").click()
    eventually(lambda: f"Delete {what}?" in main_text(browser))
    assert failing in main_text(browser) and "It cannot be undone." in main_text(browser)
    browser.find_element(By.ID, "confirm-cancel").click()
    eventually(lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{failing}"]'))

    browser.find_element(By.ID, "delete-all").click()
    eventually(lambda: browser.find_elements(By.ID, "confirm"))
    browser.find_element(By.ID, "confirm").click()
    eventually(lambda: f"Deleted {n} failed message(s)." in main_text(browser))
    assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{failing}"]')


def test_the_queues_page_lists_every_priority_and_the_schedule_and_deletes_a_scheduled_one(
    browser: Any, deployment: Deployment
) -> None:
    later = deployment.emit("ok", {"later": True}, execute_at=time.time() + 3600)
    low = deployment.emit("ok", {"low": True}, priority=60)

    def listed() -> bool:
        """both messages on the Queues page"""
        text = open_page(browser, deployment.base + "/queues")
        return later in text and low in text

    eventually(listed)  # one page: the tests leave fewer than 200 waiting
    rows = {
        row.find_element(By.CSS_SELECTOR, "td.id").text: row
        for row in browser.find_elements(By.CSS_SELECTOR, "table.messages tbody tr")
    }
    assert rows[low].find_element(By.CSS_SELECTOR, "td.priority").text == "60"
    assert rows[later].find_element(By.CSS_SELECTOR, "td.priority").text == "100"
    assert "UTC" in rows[later].find_elements(By.TAG_NAME, "td")[4].text  # its due time
    rows[later].find_element(By.CSS_SELECTOR, "a.delete").click()
    eventually(lambda: "Delete a waiting message?" in main_text(browser))
    assert later in main_text(browser) and "scheduled" in main_text(browser)
    browser.find_element(By.ID, "confirm").click()
    eventually(lambda: "Deleted 1 waiting message(s)." in main_text(browser))
    assert later not in main_text(browser) and low in main_text(browser)


def test_a_worker_stopped_from_the_workers_page_exits(
    browser: Any, deployment: Deployment, tmp_path: Path
) -> None:
    # A worker of its own, on a priority no other test uses: the session's worker runs on.
    with own_worker(deployment, 70, tmp_path / "worker.log") as worker:
        row = f'tr[data-pid="{worker.pid}"]'

        def listed() -> bool:
            """the new worker on the Workers page"""
            open_page(browser, deployment.base + "/workers")
            return bool(browser.find_elements(By.CSS_SELECTOR, row))

        eventually(listed)
        browser.find_element(By.CSS_SELECTOR, f"{row} a.stop").click()
        eventually(lambda: "Stop a worker?" in main_text(browser))
        assert f"pid {worker.pid}" in main_text(browser)
        browser.find_element(By.ID, "confirm").click()
        eventually(lambda: "Stop requested" in main_text(browser))
        assert worker.wait(30) == 0
        said = (tmp_path / "worker.log").read_text()
        assert "a stop was requested from the dashboard" in said, said[-2000:]
        eventually(
            lambda: not open_page(browser, deployment.base + "/workers").count(str(worker.pid))
        )


def test_a_worker_quieted_from_the_workers_page_takes_no_more_jobs_and_stays_alive(
    browser: Any, deployment: Deployment, tmp_path: Path
) -> None:
    # A worker of its own, on a priority no other test uses: the session's worker runs on.
    with own_worker(deployment, 75, tmp_path / "worker.log") as worker:
        row = f'tr[data-pid="{worker.pid}"]'
        first = deployment.emit("ok", {"before": "quiet"}, priority=75)
        eventually(lambda: first in deployment.handled_ids())
        open_page(browser, deployment.base + "/workers")
        browser.find_element(By.CSS_SELECTOR, f"{row} a.quiet").click()
        eventually(lambda: "Quiet a worker?" in main_text(browser))
        assert f"pid {worker.pid}" in main_text(browser)
        browser.find_element(By.ID, "confirm").click()
        eventually(lambda: "Quiet requested" in main_text(browser))

        def quiet() -> bool:
            """the Workers page to say the worker is quiet"""
            open_page(browser, deployment.base + "/workers")
            cells = browser.find_elements(By.CSS_SELECTOR, f"{row} .quiet")
            return bool(cells) and cells[0].text == "quiet: takes no more jobs"

        eventually(quiet)
        assert not browser.find_elements(By.CSS_SELECTOR, f"{row} a.quiet")
        held = deployment.emit("ok", {"while": "quiet"}, priority=75)
        time.sleep(1.5)  # three of the worker's beats: a worker still taking would have
        assert held not in deployment.handled_ids()
        assert worker.poll() is None, "a quiet worker exited"
        said = (tmp_path / "worker.log").read_text()
        assert "quieted from the dashboard: taking no more jobs" in said, said[-2000:]
        # Stopped from the same page, it exits and leaves the message waiting.
        browser.find_element(By.CSS_SELECTOR, f"{row} a.stop").click()
        eventually(lambda: browser.find_elements(By.ID, "confirm"))
        browser.find_element(By.ID, "confirm").click()
        assert worker.wait(30) == 0
    assert held not in deployment.handled_ids()
    from hermes.core import connect
    from hermes.core._cli._common import setup_priorities

    with connect(deployment.url) as driver:  # no other test reads 75: empty it for the teardown
        setup_priorities(driver, [75])
        assert driver.purge(75) == 1  # type: ignore[attr-defined]


def test_a_priority_paused_from_the_queues_page_is_not_taken_until_resumed(
    browser: Any, deployment: Deployment, tmp_path: Path
) -> None:
    # A worker of its own, on a priority only this test sends to (the dashboard shows it).
    with own_worker(deployment, 80, tmp_path / "worker.log") as worker:
        first = deployment.emit("ok", {"before": "pause"}, priority=80)
        eventually(lambda: first in deployment.handled_ids())
        pause_and_resume(browser, deployment, 80, worker.pid)
        said = (tmp_path / "worker.log").read_text()
        assert "Priority 80 paused from the dashboard" in said, said[-2000:]
        assert "Priority 80 resumed: taking it again" in said, said[-2000:]


def test_a_workflow_s_page_shows_its_tree_and_leads_to_each_step(
    browser: Any, deployment: Deployment
) -> None:
    from hermes.core import connect
    from hermes.core.jobs import Jobs
    from hermes.core.workflows import Workflows, chain, group, job

    with connect(deployment.url) as driver:
        jobs = Jobs(deployment.results_url)
        flow = chain(group(job("ok", {"n": n}) for n in range(3)), job("ok", {"last": True}))
        handle = Workflows(driver, jobs).start(flow)
        eventually(lambda: handle.state == "succeeded")
        jobs.close()

    open_page(browser, f"{deployment.base}/jobs/{handle.id}")
    assert browser.find_element(By.ID, "state").text == "succeeded"
    steps = browser.find_elements(By.CSS_SELECTOR, "#workflow-tree li.node-job")
    assert [s.find_element(By.CSS_SELECTOR, ".state").text for s in steps] == ["succeeded"] * 4
    screenshot(browser, "workflow")
    steps[1].find_element(By.CSS_SELECTOR, "a.id").click()
    eventually(lambda: f"Job {handle.id}.0.1" in main_text(browser))
    browser.find_element(By.CSS_SELECTOR, "#in-workflow a").click()
    eventually(lambda: f"Workflow {handle.id}" in main_text(browser))
