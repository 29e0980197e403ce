"""The dashboard in Chromium over a real backlog, on Redis and on PostgreSQL.

10,000 messages wait (half on priority 100, half on 300), 1,000 are
scheduled a day ahead and 1,000 failed on priority 200 (half of them of
type ``ok``), each with a job record; a ``hermes worker`` reads priority
200 only, so the backlog stays put while what is retried there is handled.
The Queues and the Jobs lists are paged to their last entry.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import hermes_test_services
import pytest
from dash_support import Deployment, deploy, eventually, pause_and_resume, screenshot
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By

from hermes.core import Emitter, FailedStore, Message, connect
from hermes.core._cli._common import setup_priorities
from hermes.core.driver import SupportsStats
from hermes.core.drivertools import isolated_url
from hermes.core.jobs import Jobs

WAITING = 10_000
SCHEDULED = 1_000
FAILED = 1_000
#: Where the failed messages ran, and the only priority the worker reads.
FAILED_PRIORITY = 200


def fill(url: str, failed_url: str, results_url: str) -> list[str]:
    """The backlog; the ids of every waiting and scheduled message."""
    jobs = Jobs(results_url)
    try:
        with connect(url) as driver:
            setup_priorities(driver, [300, FAILED_PRIORITY])
            emitter = Emitter(driver, records=jobs)
            waiting = [Message("ok", {"n": n, "pad": "x" * 200}) for n in range(WAITING)]
            emitter.emit_batch(waiting[: WAITING // 2])
            emitter.emit_batch(waiting[WAITING // 2 :], priority=300)
            later = time.time() + 86_400
            scheduled = [Message("ok", {"later": n}, execute_at=later) for n in range(SCHEDULED)]
            emitter.emit_batch(scheduled)
    finally:
        jobs.close()
    with FailedStore.connect(failed_url) as store:
        for n in range(FAILED):  # every other one a type no handler of the worker takes
            failed = Message("ok" if n % 2 else "mail", {"failed": n})
            store.keep(failed, "gave up", priority=FAILED_PRIORITY)
    return [m.id for m in waiting + scheduled]


@pytest.fixture(scope="module", params=["redis", "postgres"])
def backlog(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Deployment, list[str]]]:
    with hermes_test_services.service_url(request.param) as service:
        ns = f"dash-scale-{uuid.uuid4().hex[:8]}"
        urls = [isolated_url(service, ns + part) for part in ("", "-failed", "-records")]
        queued = fill(*urls)
        work = tmp_path_factory.mktemp(f"scale-{request.param}")
        with deploy(
            *urls,
            work,
            "dash_jobs:handlers",
            worker_priority=FAILED_PRIORITY,
            shown=(100, 300),
        ) as deployment:
            yield deployment, queued


def ids_on_page(browser: Any) -> list[str]:
    """The ids of the page's listed messages, read in one script call."""
    script = "return [...document.querySelectorAll('table.messages td.id')].map(e => e.textContent)"
    return [str(i).strip() for i in browser.execute_script(script)]


def main_text(browser: Any) -> str:
    """The page's main text; "" while a click's navigation is replacing the page."""
    try:
        return str(browser.find_element(By.TAG_NAME, "main").text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def _moved_on(browser: Any, left: str) -> bool:
    """the next page to load"""
    return bool(browser.current_url != left)


def test_paging_reaches_every_waiting_and_scheduled_message(
    browser: Any, backlog: tuple[Deployment, list[str]]
) -> None:
    deployment, queued = backlog
    browser.get(deployment.base + "/queues")
    seen: set[str] = set()
    pages = 0
    while True:
        pages += 1
        seen.update(ids_on_page(browser))
        following = browser.find_elements(By.ID, "next-page")
        if not following:
            break
        left = browser.current_url
        following[0].click()
        eventually(functools.partial(_moved_on, browser, left))
        assert pages < 200, "the pages go round"
    assert pages >= 40, f"{pages} pages of about 200: paging was not what was exercised"
    assert set(queued) <= seen, f"{len(set(queued) - seen)} messages on no page"


def test_the_queues_page_filtered_by_priority_pages_to_its_last_message(
    browser: Any, backlog: tuple[Deployment, list[str]]
) -> None:
    deployment, queued = backlog
    browser.get(deployment.base + "/queues")
    browser.find_element(By.CSS_SELECTOR, "form.filters input[name=priority]").send_keys("300")
    browser.find_element(By.ID, "filter").click()
    eventually(lambda: "priority=300" in browser.current_url)
    script = (
        "return [...document.querySelectorAll('table.messages td.priority')]"
        ".map(e => e.textContent)"
    )
    seen: set[str] = set()
    pages = 0
    while True:
        pages += 1
        assert set(browser.execute_script(script)) <= {"300"}, "another priority listed"
        seen.update(ids_on_page(browser))
        following = browser.find_elements(By.ID, "next-page")
        if not following:
            break
        left = browser.current_url
        following[0].click()
        eventually(functools.partial(_moved_on, browser, left))
        assert "priority=300" in browser.current_url, "the next page lost the filter"
        assert pages < 200, "the pages go round"
    assert seen == set(queued[WAITING // 2 : WAITING]), "not the 5,000 of priority 300"


def _walk_jobs(browser: Any, start: str) -> tuple[list[str], int]:
    """The ids every page of the Jobs list from ``start`` shows, in order; and how many pages."""
    browser.get(start)
    listed: list[str] = []
    pages = 0
    while True:
        pages += 1
        listed += ids_on_page(browser)
        following = browser.find_elements(By.ID, "next-page")
        if not following:
            return listed, pages
        left = browser.current_url
        following[0].click()
        eventually(functools.partial(_moved_on, browser, left))
        assert pages < 200, "the pages go round"


def test_the_jobs_list_pages_to_its_last_record_newest_and_oldest_first(
    browser: Any, backlog: tuple[Deployment, list[str]]
) -> None:
    deployment, queued = backlog
    browser.get(deployment.base + "/jobs")
    screenshot(browser, "jobs")
    newest, pages = _walk_jobs(browser, deployment.base + "/jobs")
    assert pages >= 50, f"{pages} pages of 200: paging was not what was exercised"
    assert len(newest) == len(set(newest)), "a job listed on two pages"
    assert set(queued) <= set(newest), f"{len(set(queued) - set(newest))} jobs on no page"
    assert newest.index(queued[-1]) < newest.index(queued[0]), "newest first lists older first"

    browser.get(deployment.base + "/jobs")
    browser.find_element(By.ID, "oldest-first").click()
    eventually(lambda: "order=oldest" in browser.current_url)
    oldest, _ = _walk_jobs(browser, browser.current_url)
    assert len(oldest) == len(set(oldest)) and set(queued) <= set(oldest)
    assert oldest.index(queued[0]) < oldest.index(queued[-1]), "oldest first lists newer first"


def test_the_search_finds_a_job_among_ten_thousand(
    browser: Any, backlog: tuple[Deployment, list[str]]
) -> None:
    deployment, queued = backlog
    wanted = queued[WAITING // 2 + 7]  # one on priority 300
    browser.get(deployment.base + "/")
    box = browser.find_element(By.CSS_SELECTOR, "header form.search input[name=id]")
    box.send_keys(wanted)
    box.submit()
    eventually(lambda: browser.current_url.endswith(f"/jobs/{wanted}"))
    state = browser.find_element(By.ID, "state").text
    priority = browser.find_element(By.XPATH, "//th[text()='priority']/../td").text
    assert (state, priority) == ("waiting", "300")


def test_retry_all_of_a_filtered_failed_page_sends_its_500_back_to_be_handled(
    browser: Any, backlog: tuple[Deployment, list[str]]
) -> None:
    deployment, _ = backlog
    browser.get(deployment.base + "/failed")
    browser.find_element(By.CSS_SELECTOR, "form.filters input[name=type]").send_keys("ok")
    browser.find_element(By.ID, "filter").click()
    eventually(lambda: "type=ok" in browser.current_url)
    listed = set(ids_on_page(browser))
    assert len(listed) == FAILED // 2  # read from the two store pages of 500 they are on
    browser.find_element(By.ID, "retry-all").click()
    eventually(
        lambda: "Retry 500 failed messages?" in browser.find_element(By.TAG_NAME, "main").text
    )
    browser.find_element(By.ID, "confirm").click()
    eventually(lambda: "Sent 500 failed message(s) back" in browser.page_source)

    def handled() -> bool:
        """the worker on priority 200 to handle the 500 retried messages"""
        return listed <= set(deployment.handled_ids())

    eventually(handled, 120)
    with FailedStore.connect(deployment.failed_url) as store:
        assert {m.type for m in store.messages()} == {"mail"}
        assert len(store.messages()) == FAILED // 2
    with connect(deployment.url) as driver:
        setup_priorities(driver, [300, FAILED_PRIORITY])
        assert isinstance(driver, SupportsStats)
        rows = {row.priority: row.ready for row in driver.queue_stats()}
    assert rows[100] == rows[300] == WAITING // 2, "a retry went to another priority"


def test_a_given_up_job_is_retried_from_its_page_to_its_priority_and_handled(
    browser: Any, backlog: tuple[Deployment, list[str]]
) -> None:
    deployment, _ = backlog
    message = Message("mend", {"order": 1})
    jobs = Jobs(deployment.results_url)
    try:
        with connect(deployment.url) as driver:
            setup_priorities(driver, [FAILED_PRIORITY])
            Emitter(driver, records=jobs).emit(message, priority=FAILED_PRIORITY)
    finally:
        jobs.close()

    def given_up() -> bool:
        """the job's page, found through the header's search, to say given_up"""
        browser.get(deployment.base + "/")
        box = browser.find_element(By.CSS_SELECTOR, "header form.search input[name=id]")
        box.send_keys(message.id)
        box.submit()
        eventually(lambda: browser.current_url.endswith(f"/jobs/{message.id}"))
        state = browser.find_elements(By.ID, "state")
        return bool(state) and state[0].text == "given_up"

    eventually(given_up, 60)
    link = browser.find_element(By.ID, "in-failed")
    assert f"Retry to priority {FAILED_PRIORITY}" in link.text
    link.click()
    eventually(lambda: "/failed?job=" in browser.current_url)
    # Found among the 1,000 failed messages the store holds beside it.
    assert ids_on_page(browser) == [message.id]
    (deployment.work / f"fixed-{message.id}").touch()
    browser.find_element(By.CSS_SELECTOR, f'tr[data-id="{message.id}"] button.retry').click()
    eventually(lambda: "Sent 1 failed message(s) back" in browser.page_source)
    # The worker reads priority 200 only: handled, it was sent back there.
    eventually(lambda: message.id in deployment.handled_ids(), 60)

    def succeeded() -> bool:
        """the job's page to say succeeded"""
        browser.get(f"{deployment.base}/jobs/{message.id}")
        state = browser.find_elements(By.ID, "state")
        return bool(state) and state[0].text == "succeeded"

    eventually(succeeded)


def test_the_priority_the_worker_reads_paused_from_the_queues_page_waits_until_resumed(
    browser: Any, backlog: tuple[Deployment, list[str]]
) -> None:
    deployment, _ = backlog
    pause_and_resume(browser, deployment, FAILED_PRIORITY, deployment.worker_pid)


def ready_by_priority(deployment: Deployment) -> dict[int, int | None]:
    with connect(deployment.url) as driver:
        setup_priorities(driver, [300, FAILED_PRIORITY])
        assert isinstance(driver, SupportsStats)
        return {row.priority: row.ready for row in driver.queue_stats()}


def test_a_waiting_job_and_a_failed_message_are_deleted_after_a_page_that_names_them(
    browser: Any, backlog: tuple[Deployment, list[str]]
) -> None:
    deployment, _ = backlog
    # One the Queues page lists first: a job's link to where it waits reads up to 10
    # pages of the broker from the start (in Redis's set order, not the order sent).
    browser.get(deployment.base + "/queues")
    chosen = browser.find_elements(By.CSS_SELECTOR, "table.messages tbody tr")[11]
    wanted = chosen.find_element(By.CSS_SELECTOR, "td.id").text
    priority = int(chosen.find_element(By.CSS_SELECTOR, "td.priority").text)
    before = ready_by_priority(deployment)
    browser.get(f"{deployment.base}/jobs/{wanted}")
    browser.find_element(By.ID, "in-queue").click()
    eventually(lambda: "/queues?job=" in browser.current_url)
    assert ids_on_page(browser) == [wanted]
    browser.find_element(By.CSS_SELECTOR, "table.messages a.delete").click()
    eventually(lambda: "Delete a waiting message?" in main_text(browser))
    assert wanted in main_text(browser)
    browser.find_element(By.ID, "confirm").click()
    eventually(lambda: "Deleted 1 waiting message(s)." in browser.page_source)
    assert "/queues?job=" in browser.current_url and ids_on_page(browser) == []
    after = ready_by_priority(deployment)
    assert after == {**before, priority: (before[priority] or 0) - 1}, (before, after)

    with FailedStore.connect(deployment.failed_url) as store:
        kept = {m.id for m in store.messages()}
    browser.get(deployment.base + "/failed?type=mail")
    row = browser.find_elements(By.CSS_SELECTOR, "table.messages tbody tr")[3]
    dropped = str(row.get_attribute("data-id"))
    row.find_element(By.CSS_SELECTOR, "a.delete").click()
    eventually(lambda: "Delete 1 failed message?" in main_text(browser))
    assert dropped in main_text(browser)
    browser.find_element(By.ID, "confirm").click()
    eventually(lambda: "Deleted 1 failed message(s)." in browser.page_source)
    with FailedStore.connect(deployment.failed_url) as store:
        assert {m.id for m in store.messages()} == kept - {dropped}


def test_the_worker_quieted_then_stopped_from_the_workers_page_leaves_what_waits(
    browser: Any, backlog: tuple[Deployment, list[str]]
) -> None:
    deployment, _ = backlog
    row = f'tr[data-pid="{deployment.worker_pid}"]'
    browser.get(deployment.base + "/workers")
    browser.find_element(By.CSS_SELECTOR, f"{row} a.quiet").click()
    eventually(lambda: "Quiet a worker?" in main_text(browser))
    browser.find_element(By.ID, "confirm").click()
    eventually(lambda: "Quiet requested" in main_text(browser))

    def quiet() -> bool:
        """the Workers page to say the worker is quiet"""
        browser.get(deployment.base + "/workers")
        cells = browser.find_elements(By.CSS_SELECTOR, f"{row} .quiet")
        return bool(cells) and cells[0].text == "quiet: takes no more jobs"

    eventually(quiet)
    held = deployment.emit("ok", {"while": "quiet"}, priority=FAILED_PRIORITY)
    time.sleep(1.5)  # a worker still taking priority 200 would have handled it by now
    assert held not in deployment.handled_ids()
    assert browser.find_elements(By.CSS_SELECTOR, row), "a quiet worker left"

    browser.find_element(By.CSS_SELECTOR, f"{row} a.stop").click()
    eventually(lambda: "Stop a worker?" in main_text(browser))
    browser.find_element(By.ID, "confirm").click()
    eventually(lambda: "Stop requested" in main_text(browser))

    def gone() -> bool:
        """the stopped worker to leave the Workers page"""
        browser.get(deployment.base + "/workers")
        return not browser.find_elements(By.CSS_SELECTOR, row)

    eventually(gone)
    assert held not in deployment.handled_ids()
