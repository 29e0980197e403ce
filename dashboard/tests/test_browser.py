"""The dashboard in headless Chromium, against a real worker and a real dashboard on Redis."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

from dash_support import HERMES, Deployment, eventually, get, post, screenshot
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
    assert cell(browser, 100, "in-flight") == "?", "Redis cannot count in flight: ? it is"
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
