"""Hermes's pages in Django's admin: job records and the failed store, behind its permissions."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hermes_test_services as services
import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from hermes_django_tests.harness import HERE, WORKER_S, Queue, Worker
from hermes_django_tests.settings import tasks_setting
from hermes_django_tests.shop.tasks import add, fail
from hermes_test_support import eventually

from hermes.core import FailedStore
from hermes.django import admin as hermes_admin
from hermes.django import close_connections
from hermes.django._compat import TaskResult

PASSWORD = "a-test-password-only"


def failed_url(queue: Queue) -> str:
    return f"{queue.url}&key=failed"


@pytest.fixture
def with_failed_store(queue: Queue) -> Iterator[str]:
    """The ``default`` backend with ``OPTIONS["failed_url"]`` on the test's Redis prefix."""
    url = failed_url(queue)
    with override_settings(TASKS=tasks_setting(queue.url, queue.url, failed_url=url)):
        yield url
    close_connections()


def user(name: str, *permissions: str, superuser: bool = False) -> Client:
    """A logged-in client of a staff user with ``permissions`` (codenames of hermes_django)."""
    User.objects.filter(username=name).delete()
    if superuser:
        account = User.objects.create_superuser(name, f"{name}@example.com", PASSWORD)
    else:
        account = User.objects.create_user(name, f"{name}@example.com", PASSWORD, is_staff=True)
        for codename in permissions:
            account.user_permissions.add(
                Permission.objects.get(content_type__app_label="hermes_django", codename=codename)
            )
    client = Client()
    assert client.login(username=name, password=PASSWORD)
    return client


def ran(results: list[TaskResult], worker: Worker) -> None:
    def finished() -> bool:
        for result in results:
            result.refresh()
        return all(result.is_finished for result in results)

    eventually(finished, "the tasks to finish", WORKER_S, 0.05, worker.log)


def test_the_admin_lists_job_records_and_shows_a_failed_one_with_its_traceback(
    start_worker: Callable[..., Worker],
) -> None:
    worker = start_worker()
    succeeded, failed = add.enqueue(2, 3), fail.enqueue("the printer is on fire")
    ran([succeeded, failed], worker)
    admin = user("hermes-admin", superuser=True)

    index = admin.get("/admin/").content.decode()
    assert "/admin/hermes_django/job/" in index and "/admin/hermes_django/failedjob/" in index

    listing = admin.get("/admin/hermes_django/job/").content.decode()
    assert succeeded.id in listing and failed.id in listing
    only_failed = admin.get("/admin/hermes_django/job/?state=given_up").content.decode()
    assert failed.id in only_failed and succeeded.id not in only_failed
    by_task = admin.get(f"/admin/hermes_django/job/?task={add.module_path}").content.decode()
    assert succeeded.id in by_task and failed.id not in by_task

    page = admin.get(f"/admin/hermes_django/job/{failed.id}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "given_up" in text and "Failed" in text
    assert "ValueError: the printer is on fire" in text
    assert ", in fail" in text, "the traceback's frames are shown"
    result_page = admin.get(f"/admin/hermes_django/job/{succeeded.id}/change/").content.decode()
    assert re.search(r'<pre id="hermes-result">\s*5\s*</pre>', result_page), result_page
    assert admin.get("/admin/hermes_django/job/no-such-job/change/").status_code == 404


def test_the_admin_s_job_list_pages_newest_or_oldest_first_to_its_last_record(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hermes_admin, "JOBS_SHOWN", 2)
    sent: list[str] = []
    for n in range(5):  # no worker: each stays waiting
        sent.append(add.enqueue(n, n).id)
        time.sleep(0.005)  # Redis orders by the millisecond (and by key within one)
    admin = user("hermes-admin", superuser=True)

    def walk(query: str) -> list[str]:
        listed: list[str] = []
        path: str | None = "/admin/hermes_django/job/" + query
        while path is not None:
            page = admin.get(path).content.decode()
            listed += re.findall(r"/admin/hermes_django/job/([^/]+)/change/", page)
            link = re.search(r'<a href="(\?[^"]+)" id="next-page">', page)
            path = None if link is None else "/admin/hermes_django/job/" + html.unescape(link[1])
        return listed

    assert walk("") == sent[::-1]
    assert walk("?order=oldest") == sent
    refused = admin.get("/admin/hermes_django/job/?after=not-a-page").content.decode()
    assert "That page is not one of this store" in refused


def test_a_failed_task_is_listed_shown_and_retried_from_the_admin(
    queue: Queue, start_worker: Callable[..., Worker], with_failed_store: str
) -> None:
    worker = start_worker("--failed-url", with_failed_store, "--max-items", "1")
    failed = fail.enqueue("out of paper")
    ran([failed], worker)
    eventually(lambda: worker.process.poll() is not None, "the worker to stop", WORKER_S)
    admin = user("hermes-admin", superuser=True)

    listing = admin.get("/admin/hermes_django/failedjob/").content.decode()
    assert failed.id in listing and fail.module_path in listing
    page = admin.get(f"/admin/hermes_django/failedjob/{failed.id}/change/").content.decode()
    assert "out of paper" in page and "ValueError" in page and ", in fail" in page
    assert 'name="retry"' in page

    response = admin.post(f"/admin/hermes_django/failedjob/{failed.id}/change/", {"retry": "1"})

    assert response.status_code == 302
    assert "was sent again" in admin.get(response["Location"]).content.decode()
    with FailedStore.connect(with_failed_store) as store:
        assert store.messages() == []
    assert queue.client.scard(f"{queue.prefix}hermes") == 1, "the task waits on its queue again"


def test_the_pages_need_django_s_permissions(
    with_failed_store: str, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker("--failed-url", with_failed_store)
    failed = fail.enqueue("no toner")
    ran([failed], worker)
    detail = f"/admin/hermes_django/failedjob/{failed.id}/change/"
    eventually(lambda: user("watcher", "view_failedjob").get(detail).status_code == 200,
               "the failed job to be kept", WORKER_S)  # fmt: skip

    assert Client().get("/admin/hermes_django/job/").status_code == 302, "to the login page"
    nobody = user("nobody")
    for path in ("/admin/hermes_django/job/", "/admin/hermes_django/failedjob/", detail):
        assert nobody.get(path).status_code == 403, path
    watcher = user("watcher", "view_failedjob", "view_job")
    assert watcher.get("/admin/hermes_django/job/").status_code == 200
    page = watcher.get(detail).content.decode()
    assert "no toner" in page and 'name="retry"' not in page
    assert watcher.post(detail, {"retry": "1"}).status_code == 403
    with FailedStore.connect(with_failed_store) as store:
        assert [m.id for m in store.messages()] == [failed.id], "nothing was retried"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with services.chromium_browser() as driver:
        yield driver


@pytest.fixture
def admin_server(queue: Queue, with_failed_store: str, tmp_path: Path) -> Iterator[str]:
    """``http://127.0.0.1:PORT``: ``manage.py runserver`` on the test's queue and stores."""
    port = services.free_port()
    env = {
        **os.environ,
        "HERMES_DJANGO_URL": queue.url,
        "HERMES_DJANGO_RESULTS_URL": queue.url,
        "HERMES_DJANGO_FAILED_URL": with_failed_store,
    }
    log = tmp_path / "runserver.out"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", "--insecure",
             f"127.0.0.1:{port}"],
            cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        services.wait_for_port(port, WORKER_S, "manage.py runserver", server)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def test_in_chromium_an_operator_reads_a_failed_job_s_traceback_and_retries_it(
    queue: Queue,
    start_worker: Callable[..., Worker],
    with_failed_store: str,
    admin_server: str,
    browser: Any,
) -> None:
    from selenium.webdriver.common.by import By

    worker = start_worker("--failed-url", with_failed_store, "--max-items", "1")
    failed = fail.enqueue("paper jam in tray 2")
    ran([failed], worker)
    eventually(lambda: worker.process.poll() is not None, "the worker to stop", WORKER_S)
    user("operator", superuser=True)

    browser.get(f"{admin_server}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    browser.find_element(By.LINK_TEXT, "Jobs").click()
    browser.find_element(By.LINK_TEXT, failed.id).click()
    tracebacks = browser.find_elements(By.CSS_SELECTOR, "pre.hermes-traceback")
    assert any("ValueError: paper jam in tray 2" in pre.text for pre in tracebacks)

    browser.get(f"{admin_server}/admin/")
    browser.find_element(By.LINK_TEXT, "Failed jobs").click()
    browser.find_element(By.LINK_TEXT, failed.id).click()
    assert "paper jam in tray 2" in browser.find_element(By.ID, "hermes-payload").text
    browser.find_element(By.NAME, "retry").click()

    assert "was sent again" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert failed.id not in browser.find_element(By.ID, "result_list").text
    assert queue.client.scard(f"{queue.prefix}hermes") == 1, "the task waits on its queue again"
