"""The Workers page: a pool's children together under their supervisor, each with its jobs.

The grouping and the page are checked on records made here; then a real
``hermes worker --processes 2`` on Redis, its children holding blocking jobs,
is looked at in headless Chromium.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dash_support import HERE, HERMES, eventually, running, screenshot, serve_dashboard
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By

from hermes.core import Message, connect
from hermes.core.drivertools import MemoryDriver
from hermes.dashboard._app import _environment
from hermes.dashboard._state import Dashboard, worker_groups


def record(pid: int, host: str = "web-1", **fields: Any) -> dict[str, Any]:
    return {
        "id": f"{host}:{pid}:abc",
        "kind": "worker",
        "host": host,
        "pid": pid,
        "started": 1_000.0 + pid,
        "last_seen": time.time(),
        "url": "redis://127.0.0.1:6379/0",
        "version": "6.0.0",
        "in_flight": [],
        **fields,
    }


def test_a_pool_s_children_are_grouped_by_slot_under_their_supervisor_on_their_host() -> None:
    alone = record(10)
    second = record(22, supervisor_pid=20, slot=2)
    first = record(31, supervisor_pid=20, slot=1)  # a replacement: started later, slot 1
    elsewhere = record(41, host="web-2", supervisor_pid=20, slot=1)
    groups = worker_groups([alone, second, first, elsewhere])
    assert [(g.host, g.supervisor_pid) for g in groups] == [
        ("web-1", None),
        ("web-1", 20),
        ("web-2", 20),
    ], "the same supervisor pid on another host is another pool"
    assert groups[0].records == [alone]
    assert groups[1].records == [first, second], "a pool's children are listed by slot"
    assert groups[2].records == [elsewhere]


def test_two_lone_workers_are_two_groups_without_a_pool_row() -> None:
    groups = worker_groups([record(10), record(11)])
    assert [(g.supervisor_pid, len(g.records)) for g in groups] == [(None, 1), (None, 1)]
    html = render_workers(groups)
    assert 'class="pool"' not in html and "pool-child" not in html
    assert html.count("<tr data-pid=") == 2


def test_the_page_names_the_supervisor_above_its_children_and_each_child_s_slot() -> None:
    job = {"type": "invoice.send", "id": "42", "since": time.time() - 3}
    records = [
        record(21, supervisor_pid=20, slot=1, in_flight=[job]),
        record(22, supervisor_pid=20, slot=2),
    ]
    html = render_workers(worker_groups(records))
    header = html.index('<tr class="pool" data-supervisor="20">')
    assert "Pool on web-1: supervisor pid 20, 2 worker processes live" in html
    first = html.index('<tr data-pid="21" class="pool-child" data-supervisor="20" data-slot="1">')
    second = html.index('<tr data-pid="22" class="pool-child" data-supervisor="20" data-slot="2">')
    assert header < first < second
    assert "worker-1" in html[first:second] and "worker-2" in html[second:]
    job_html = '<span class="type">invoice.send</span> <span class="id">#42</span>'
    assert job_html in html[first:second]
    assert "idle" in html[second:]


def render_workers(groups: list[Any]) -> str:
    dashboard = Dashboard(MemoryDriver(f"workers-page-{uuid.uuid4().hex[:6]}"), "memory://x")
    try:
        template = _environment().get_template("workers.html")
        return template.render(
            d=dashboard,
            csrf="",
            page="workers",
            notice=None,
            now=time.time(),
            workers=[r for g in groups for r in g.records],
            groups=groups,
        )
    finally:
        dashboard.close()


# A real pool, in the browser -------------------------------------------------

#: The pool: two children, each running two handlers at once.
PROCESSES, CONCURRENCY = 2, 2


def parent_pid(pid: int) -> int:
    """``pid``'s parent, from /proc (the command name may hold spaces: split after it)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])


@pytest.fixture
def pool(redis_url: str, tmp_path: Path) -> Iterator[tuple[str, str, int, Path]]:
    """A ``hermes worker --processes 2`` and a dashboard on a Redis prefix of their own."""
    url = f"{redis_url}?prefix=dash-pool-{uuid.uuid4().hex[:8]}:"
    unset = ("HERMES_URL", "HERMES_DASHBOARD_AUTH", "HERMES_REGISTRY_URL")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["DASH_TEST_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    worker_args = [
        HERMES,
        "worker",
        "--url",
        url,
        "--handlers",
        "dash_jobs:handlers",
        "--processes",
        str(PROCESSES),
        "--concurrency",
        str(CONCURRENCY),
        "--heartbeat-interval",
        "1",
    ]
    with (
        running(worker_args, HERE, env, tmp_path / "worker.log") as supervisor,
        serve_dashboard(url, HERE, env, tmp_path / "dashboard.log") as base,
    ):
        try:
            yield url, base, supervisor.pid, tmp_path
        finally:
            # Whatever the test did, the slow jobs end: the pool stops within its grace.
            (tmp_path / "release").touch()
    with connect(url) as driver:
        driver.teardown()  # type: ignore[attr-defined]


def children_shown(browser: Any, base: str, supervisor: int) -> dict[str, list[tuple[str, str]]]:
    """pid -> (type, id) of each job in flight, for each row of the pool on the Workers page."""
    browser.get(base + "/workers")
    rows = browser.find_elements(By.CSS_SELECTOR, f'tr.pool-child[data-supervisor="{supervisor}"]')
    shown: dict[str, list[tuple[str, str]]] = {}
    for row in rows:
        jobs = row.find_elements(By.CSS_SELECTOR, "td.in-flight div")
        shown[str(row.get_attribute("data-pid"))] = [
            (
                job.find_element(By.CSS_SELECTOR, "span.type").text,
                job.find_element(By.CSS_SELECTOR, "span.id").text.removeprefix("#"),
            )
            for job in jobs
        ]
    return shown


def test_the_workers_page_lists_each_child_of_a_pool_with_its_jobs_until_they_finish(
    browser: Any, pool: tuple[str, str, int, Path]
) -> None:
    url, base, supervisor, work = pool
    # As many blocking jobs as the pool runs at once: each child ends up holding two.
    messages = [Message("slow", {"n": n}) for n in range(PROCESSES * CONCURRENCY)]
    with connect(url) as driver:
        for message in messages:
            driver.send(message)
    emitted = {message.id for message in messages}

    def busy() -> dict[str, list[tuple[str, str]]] | None:
        """both children listed, each with two slow jobs in flight"""
        try:
            shown = children_shown(browser, base, supervisor)
        except StaleElementReferenceException:
            return None  # the page refreshed itself while being read: look again
        full = len(shown) == PROCESSES and all(len(j) == CONCURRENCY for j in shown.values())
        return shown if full else None

    shown = eventually(busy)
    pids = [int(pid) for pid in shown]
    assert len(set(pids)) == PROCESSES and supervisor not in pids
    assert all(parent_pid(pid) == supervisor for pid in pids), "a row that is not a child"
    jobs = [job for each in shown.values() for job in each]
    assert {type_ for type_, _ in jobs} == {"slow"}
    assert sorted(id_ for _, id_ in jobs) == sorted(emitted), "each job once, on one child"
    header = browser.find_element(By.CSS_SELECTOR, f'tr.pool[data-supervisor="{supervisor}"]')
    assert f"supervisor pid {supervisor}, {PROCESSES} worker processes live" in header.text
    slots = {
        row.get_attribute("data-slot")
        for row in browser.find_elements(By.CSS_SELECTOR, "tr.pool-child")
    }
    assert slots == {"1", "2"}
    screenshot(browser, "workers-pool")

    (work / "release").touch()

    def idle() -> bool:
        """both children still listed, with no job in flight"""
        try:
            shown = children_shown(browser, base, supervisor)
        except StaleElementReferenceException:
            return False
        return sorted(int(pid) for pid in shown) == sorted(pids) and not any(shown.values())

    eventually(idle)
    handled = (work / "handled.jsonl").read_text()
    assert all(id_ in handled for id_ in emitted), "a released job was not handled"
