"""The application in process, on a memory broker: which requests it answers, and how it shows
records it cannot read. Requests go straight to the ASGI application (:class:`Client`), with
the Host header a browser at 127.0.0.1:8900 sends unless a test plays a rebinding page.
"""

from __future__ import annotations

import asyncio
import base64
import html
import json
import logging
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
from dash_support import eventually

from hermes.core import ExceptionRecord, FailedMessage, FailedStore, Message
from hermes.core.driver import QueueStats
from hermes.core.drivertools import MemoryDriver
from hermes.core.jobs import JobError, Jobs, JobState
from hermes.core.limits import Limit, Limiter
from hermes.core.spi._registry import driver_for_url
from hermes.dashboard import Auth, Hosts, create_app
from hermes.dashboard._app import (
    MAX_BODY_BYTES,
    SECURITY_HEADERS,
    TRACEBACK_PREVIEW_BYTES,
    _when,
)
from hermes.dashboard._state import JOBS_LIMIT, Dashboard

PORT = 8900
BASE = f"http://127.0.0.1:{PORT}"


@pytest.fixture
def dashboard() -> Iterator[Dashboard]:
    name = f"dash-app-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}"
    plugin, _ = driver_for_url(url)
    driver = MemoryDriver(name)
    dashboard = Dashboard(driver, url)
    assert plugin.browse is not None
    dashboard.browser = plugin.browse(driver)
    dashboard.failed = FailedStore.connect(f"memory://{name}-failed")
    dashboard.failed_url = f"memory://{name}-failed"
    dashboard.registry = driver
    try:
        yield dashboard
    finally:
        dashboard.close()


@dataclass
class Response:
    status_code: int
    headers: dict[str, str]
    content: bytes = b""

    @property
    def text(self) -> str:
        return self.content.decode()


@dataclass
class Client:
    """Requests straight to an ASGI application: nothing listens, nothing is followed."""

    app: Any
    host: str = f"127.0.0.1:{PORT}"

    def get(self, path: str, **kwargs: Any) -> Response:
        return self.request("GET", path, **kwargs)

    def post(
        self,
        path: str,
        data: Mapping[str, str | list[str]] | None = None,
        content: bytes | Iterable[bytes] = b"",
        **kwargs: Any,
    ) -> Response:
        if data is not None:
            content = urlencode(data, doseq=True).encode()
        return self.request("POST", path, body=content, **kwargs)

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        body: bytes | Iterable[bytes] = b"",
        auth: tuple[str, str] | None = None,
    ) -> Response:
        sent = {"host": self.host}
        if method == "POST":
            sent["content-type"] = "application/x-www-form-urlencoded"
        if isinstance(body, bytes):
            sent["content-length"] = str(len(body))
            chunks = [body]
        else:
            chunks = list(body)  # no length: as a chunked upload arrives
        if auth is not None:
            sent["authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
        sent.update({k.lower(): v for k, v in (headers or {}).items()})
        path, _, query = path.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.encode(), v.encode()) for k, v in sent.items()],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", PORT),
        }
        response = Response(0, {})
        pending = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
        pending[-1]["more_body"] = False

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop(0)
            await asyncio.sleep(3600)  # the client waits for the answer, sending nothing more
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                response.status_code = message["status"]
                response.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
            elif message["type"] == "http.response.body":
                response.content += message.get("body", b"")

        try:
            asyncio.run(self.app(scope, receive, send))
        except Exception:
            # Starlette answers 500 and then raises to the server: the answer is what counts.
            if not response.status_code:
                raise
        return response


def client_of(dashboard: Dashboard, hosts: Hosts | None = None, **kwargs: Any) -> Client:
    hosts = hosts if hosts is not None else Hosts.bound("127.0.0.1", PORT)
    return Client(create_app(dashboard, hosts=hosts, **kwargs))


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def a_failed_message(dashboard: Dashboard, **fields: Any) -> FailedMessage:
    assert dashboard.failed is not None
    return dashboard.failed.keep(Message("report.build", {"n": 1}), "it broke", **fields)


def stored_failed_ids(dashboard: Dashboard) -> set[str]:
    assert dashboard.failed is not None
    return {m.id for m in dashboard.failed.messages()}


def heartbeat(dashboard: Dashboard, **fields: Any) -> dict[str, Any]:
    record = {
        "id": f"web-1:{uuid.uuid4().hex[:6]}",
        "kind": "worker",
        "host": "web-1",
        "pid": 4242,
        "started": time.time() - 60,
        "last_seen": time.time(),
        "url": "memory://x",
        "version": "6.0.0",
        "in_flight": [],
        "handled": 3,
        "failed": 0,
        **fields,
    }
    assert dashboard.registry is not None
    dashboard.registry.beat(record, 60)
    return record


# The Host header ---------------------------------------------------------------


def test_a_request_naming_another_host_is_refused_with_400_and_no_page(
    dashboard: Dashboard,
) -> None:
    a_failed_message(dashboard)
    client = client_of(dashboard)
    for path in ("/", "/queues", "/failed", "/workers", "/periodic", "/static/style.css"):
        response = client.get(path, headers={"Host": f"rebind.test:{PORT}"})
        assert response.status_code == 400, path
        assert response.headers["content-type"].startswith("text/plain")
        assert "csrf" not in response.text and len(response.text) < 200
        assert response.headers["x-frame-options"] == "DENY"


def test_loopback_names_are_answered_on_the_bound_port_only(dashboard: Dashboard) -> None:
    client = client_of(dashboard)
    for host in (f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"[::1]:{PORT}", f"LocalHost:{PORT}"):
        assert client.get("/", headers={"Host": host}).status_code == 200, host
    for host in ("127.0.0.1:9999", "localhost", "127.0.0.1", "", f"evil@127.0.0.1:{PORT}"):
        assert client.get("/", headers={"Host": host}).status_code == 400, host


def test_an_allowed_host_is_answered_on_any_port_and_others_still_are_not(
    dashboard: Dashboard,
) -> None:
    hosts = Hosts.bound("127.0.0.1", PORT, ["Dash.Example.com"])
    client = client_of(dashboard, hosts)
    assert client.get("/", headers={"Host": "dash.example.com"}).status_code == 200
    assert client.get("/", headers={"Host": "dash.example.com:8443"}).status_code == 200
    assert client.get("/", headers={"Host": "example.com"}).status_code == 400


def test_a_non_loopback_bind_answers_its_own_address_and_port() -> None:
    hosts = Hosts.bound("10.0.0.5", PORT)
    assert hosts.allows(f"10.0.0.5:{PORT}")
    assert not hosts.allows(f"localhost:{PORT}"), "10.0.0.5 does not listen on loopback"
    assert not hosts.allows("10.0.0.5:80")
    v6 = Hosts.bound("fd00::5", PORT)
    assert v6.allows(f"[fd00::5]:{PORT}")
    wildcard = Hosts.bound("0.0.0.0", PORT)
    assert wildcard.allows(f"127.0.0.1:{PORT}"), "a wildcard bind listens on loopback too"
    assert not wildcard.allows(f"rebind.test:{PORT}")


def test_a_post_from_another_origin_is_refused_with_403_even_with_the_token(
    dashboard: Dashboard,
) -> None:
    failed = a_failed_message(dashboard)
    client = client_of(dashboard)
    csrf = csrf_of(client.get("/failed").text)
    form = {"csrf": csrf, "id": failed.id}
    for origin in ("http://rebind.test:8900", "null", f"http://127.0.0.1:{PORT + 1}"):
        response = client.post("/failed/delete", data=form, headers={"Origin": origin})
        assert response.status_code == 403, origin
    for site in ("cross-site", "same-site"):
        response = client.post("/failed/delete", data=form, headers={"Sec-Fetch-Site": site})
        assert response.status_code == 403, site
    assert stored_failed_ids(dashboard) == {failed.id}, "a refused POST deleted"
    same = client.post(
        "/failed/delete",
        data=form,
        headers={"Origin": BASE, "Sec-Fetch-Site": "same-origin"},
    )
    assert same.status_code == 303
    assert stored_failed_ids(dashboard) == set()


def test_a_post_from_an_allowed_host_s_origin_is_accepted(dashboard: Dashboard) -> None:
    failed = a_failed_message(dashboard)
    # A proxy that forwards its own upstream as the Host: the Origin names the public name.
    client = client_of(dashboard, Hosts.bound("127.0.0.1", PORT, ["dash.example.com"]))
    csrf = csrf_of(client.get("/failed").text)
    response = client.post(
        "/failed/delete",
        data={"csrf": csrf, "id": failed.id},
        headers={"Origin": "https://dash.example.com"},
    )
    assert response.status_code == 303
    assert stored_failed_ids(dashboard) == set()


# Bounds -------------------------------------------------------------------------


def test_a_body_over_the_cap_is_refused_with_413_before_the_csrf_check(
    dashboard: Dashboard,
) -> None:
    failed = a_failed_message(dashboard)
    client = client_of(dashboard)
    csrf = csrf_of(client.get("/failed").text)
    big = b"csrf=" + csrf.encode() + b"&id=" + failed.id.encode() + b"&x=" + b"a" * MAX_BODY_BYTES
    response = client.post("/failed/delete", content=big)
    assert response.status_code == 413
    # Without a length: streamed in chunks, refused once the cap is passed.
    chunks = iter([big[:1000], big[1000:]])
    response = client.post("/failed/delete", content=chunks)
    assert response.status_code == 413
    assert stored_failed_ids(dashboard) == {failed.id}
    assert client.post("/queues/purge", content=b"x" * (MAX_BODY_BYTES + 1)).status_code == 413


def test_large_payloads_are_shown_as_a_bounded_preview(dashboard: Dashboard) -> None:
    megabyte = "x" * 1_000_000
    for n in range(10):
        dashboard.driver.send(Message("big", {"n": n, "blob": megabyte}))
        a_failed_message(dashboard)
    assert dashboard.failed is not None
    dashboard.failed.keep(Message("big", {"blob": megabyte}), "too big")
    client = client_of(dashboard)
    for path in ("/queues", "/failed"):
        response = client.get(path)
        assert response.status_code == 200
        assert len(response.content) < 200_000, f"{path} is {len(response.content)} bytes"
        assert re.search(r"… [\d,]+ bytes more", response.text), path


def test_wrong_passwords_still_leave_the_right_one_working(dashboard: Dashboard) -> None:

    client = client_of(dashboard, auth=Auth("ops", "s3cret"))
    assert client.get("/", auth=("ops", "wrong")).status_code == 401
    assert client.get("/", auth=("ops", "s3cret")).status_code == 200


# What a handler raised ----------------------------------------------------------


def raised(message: str, handler: str = "Billing") -> ExceptionRecord:
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        return ExceptionRecord.of(exc, handler)


def test_the_failed_page_shows_the_exception_and_folds_its_traceback(
    dashboard: Dashboard,
) -> None:
    failed = a_failed_message(dashboard, exceptions=[raised("card declined")])
    plain = a_failed_message(dashboard)

    page = client_of(dashboard).get("/failed").text

    row = page[page.index(f'data-id="{failed.id}"') :].split("</tr>", 1)[0]
    assert '<span class="exception-class">builtins.RuntimeError</span>' in row
    assert '<span class="exception-message">card declined</span>' in row
    folded = re.search(
        r'<details class="traceback"><summary>traceback in Billing</summary><pre>(.*?)</pre>',
        row,
        re.DOTALL,
    )
    assert folded is not None
    assert "Traceback (most recent call last):" in folded.group(1)
    assert "in raised" in folded.group(1)
    other = page[page.index(f'data-id="{plain.id}"') :].split("</tr>", 1)[0]
    assert "none raised" in other and "<details" not in other


def test_markup_in_an_exception_is_shown_as_text(dashboard: Dashboard) -> None:
    a_failed_message(dashboard, exceptions=[raised("<script>alert(1)</script>", "<b>H</b>")])

    page = client_of(dashboard).get("/failed").text

    assert "<script>" not in page and "<b>H</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "traceback in &lt;b&gt;H&lt;/b&gt;" in page


def test_a_long_traceback_from_another_writer_shows_its_innermost_end_only(
    dashboard: Dashboard,
) -> None:
    frames = "".join(f'  File "app.py", line {n}, in step_{n}\n' for n in range(5000))
    record = ExceptionRecord("app.Boom", "boom", frames + "app.Boom: boom\n")
    a_failed_message(dashboard, exceptions=[record])

    page = client_of(dashboard).get("/failed").text

    shown = re.search(r"<pre>(… [\d,]+ bytes of outer frames before.*?)</pre>", page, re.DOTALL)
    assert shown is not None
    assert "step_4999" in shown.group(1) and "app.Boom: boom" in shown.group(1)
    _, second, *_ = shown.group(1).splitlines()
    assert second.startswith("  File "), "the shown end starts at a whole line"
    assert "step_1\n" not in shown.group(1)
    assert len(html.unescape(shown.group(1)).encode()) < TRACEBACK_PREVIEW_BYTES + 200


# Records the dashboard cannot read ----------------------------------------------


def test_a_waiting_message_created_in_milliseconds_shows_as_invalid(dashboard: Dashboard) -> None:
    millis = time.time() * 1000
    dashboard.driver.send(Message("legacy.job", {"from": "php"}, created=millis))
    response = client_of(dashboard).get("/queues")
    assert response.status_code == 200
    assert "legacy.job" in response.text
    assert re.search(r'class="invalid"[^>]*>[^<]*invalid', response.text)


def test_a_failed_message_failed_in_milliseconds_shows_as_invalid(dashboard: Dashboard) -> None:
    failed = a_failed_message(dashboard, failed_at=time.time() * 1000)
    response = client_of(dashboard).get("/failed")
    assert response.status_code == 200
    assert failed.id in response.text and 'class="invalid"' in response.text


def test_a_heartbeat_with_a_text_start_shows_as_invalid_on_every_page_that_reads_it(
    dashboard: Dashboard,
) -> None:
    heartbeat(dashboard, started="2025-01-01T10:00:00Z", handled="lots")
    heartbeat(dashboard, pid=4343, in_flight="not a list", version=None)
    del_fields = heartbeat(dashboard, pid=4444)
    del del_fields["url"]
    client = client_of(dashboard)
    for path in ("/", "/workers", "/periodic"):
        response = client.get(path)
        assert response.status_code == 200, f"{path}: {response.text[:300]}"
    workers = client.get("/workers").text
    assert "2025-01-01T10:00:00Z" in workers and 'class="invalid"' in workers
    assert 'data-pid="4242"' in workers and 'data-pid="4343"' in workers


def test_the_sampler_keeps_sampling_past_a_record_it_cannot_read(dashboard: Dashboard) -> None:
    heartbeat(dashboard, handled="lots", failed={"a": 1})
    dashboard.sample()
    assert len(dashboard.history) == 1
    assert dashboard.history[0].handled == 0


def test_the_sampling_thread_logs_an_error_and_goes_on(
    dashboard: Dashboard, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def sample() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in sampling")

    dashboard.sample = sample  # type: ignore[method-assign]
    dashboard.sample_interval_s = 0.01
    with caplog.at_level(logging.ERROR, logger="hermes.dashboard"):
        dashboard.start_sampling()
        eventually(lambda: len(calls) >= 2, 10)
    dashboard.stop()
    assert "a bug in sampling" in caplog.text


def test_an_unexpected_error_is_a_500_with_the_security_headers(dashboard: Dashboard) -> None:
    def broken() -> None:
        raise RuntimeError("unexpected")

    dashboard.queue_stats = broken  # type: ignore[method-assign,assignment]
    client = client_of(dashboard)
    response = client.get("/")
    assert response.status_code == 500
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name.lower()) == value, name
    assert "unexpected" not in response.text, "the error's text stays in the log"


# Times ----------------------------------------------------------------------------


def test_times_are_shown_in_utc_with_the_zone_named() -> None:
    assert _when(0) == (
        '<time datetime="1970-01-01T00:00:00Z"><span>1970-01-01</span> <span>00:00:00 UTC</span>'
        "</time>"
    )
    assert "invalid" in str(_when(1e15))
    assert "invalid" in str(_when("2025-01-01"))
    assert "invalid" in str(_when(True))


# Jobs ---------------------------------------------------------------------------


@pytest.fixture
def with_records(dashboard: Dashboard) -> Iterator[Jobs]:
    url = f"memory://records-{uuid.uuid4().hex[:8]}"
    dashboard.jobs, dashboard.results_url = Jobs(url), url
    yield dashboard.jobs


def a_given_up_job(jobs: Jobs, type_: str = "card.charge") -> Message:
    message = Message(type_, {"order": 42})
    jobs.emitted(message, 100)
    assert jobs.start(message, 100).run
    try:
        raise RuntimeError("card declined for order 42")
    except RuntimeError as exc:
        error = JobError.from_exception(exc)
    jobs.finish(message, "given_up", state=JobState.GIVEN_UP, error=error)
    return message


def test_a_job_s_page_shows_its_state_attempts_and_error(
    dashboard: Dashboard, with_records: Jobs
) -> None:
    message = a_given_up_job(with_records)

    page = client_of(dashboard).get(f"/jobs/{message.id}")

    assert page.status_code == 200
    text = html.unescape(page.text)
    assert '<span class="state state-given_up" id="state">given_up</span>' in text
    assert "builtins.RuntimeError" in text and "card declined for order 42" in text
    assert 'class="traceback"' in text and "raise RuntimeError" in text
    (attempts,) = re.findall(r'<table class="messages attempts">(.*?)</table>', text, re.S)
    assert attempts.count("<tr>") == 2 and "given_up" in attempts  # the header and one attempt
    assert 'id="cancel"' not in text  # a final state cannot be cancelled


def test_an_unknown_id_is_a_404_page_that_says_why(
    dashboard: Dashboard, with_records: Jobs
) -> None:
    page = client_of(dashboard).get("/jobs/no-such-job")
    assert page.status_code == 404
    assert 'id="no-record"' in page.text and "no-such-job" in page.text


def test_without_a_records_store_the_jobs_pages_say_how_to_name_one(dashboard: Dashboard) -> None:
    client = client_of(dashboard)
    for path in ("/jobs", "/jobs/abc"):
        page = client.get(path)
        assert page.status_code == 200 and "--results-url" in page.text, path


def test_the_search_box_goes_to_the_job_s_page(dashboard: Dashboard, with_records: Jobs) -> None:
    client = client_of(dashboard)
    assert 'action="/jobs"' in client.get("/").text  # on every page's header
    found = client.get("/jobs?id=" + "a%2Fb%20c")
    assert found.status_code == 303 and found.headers["location"] == "/jobs/a%2Fb%20c"


def test_the_jobs_list_filters_by_state_and_type(dashboard: Dashboard, with_records: Jobs) -> None:
    failed = a_given_up_job(with_records)
    waiting = Message("report.build", {})
    with_records.emitted(waiting, 100)
    client = client_of(dashboard)

    def listed(query: str) -> set[str]:
        return set(re.findall(r'<tr data-id="([^"]+)"', client.get("/jobs" + query).text))

    assert listed("") == {failed.id, waiting.id}
    assert listed("?state=given_up") == {failed.id}
    assert listed("?state=waiting&type=report.build") == {waiting.id}
    assert listed("?type=nothing.of.that") == set()
    assert listed("?state=not-a-state") == {failed.id, waiting.id}  # an unknown state: any


def test_the_jobs_list_and_its_api_filter_by_priority(
    dashboard: Dashboard, with_records: Jobs
) -> None:
    low, high = Message("report.build", {}), Message("report.build", {})
    with_records.emitted(low, 100)
    with_records.emitted(high, 300)
    client = client_of(dashboard)

    page = client.get("/jobs?priority=300").text

    assert re.findall(r'<tr data-id="([^"]+)"', page) == [high.id]
    assert 'name="priority" value="300"' in page
    answer = json.loads(client.get("/api/jobs?priority=100").content)
    assert [job["id"] for job in answer["jobs"]] == [low.id]


def test_in_flight_the_broker_cannot_count_comes_from_the_heartbeats_of_workers_on_its_url(
    dashboard: Dashboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    uncounted = [QueueStats(p, f"q{p}", ready=0, scheduled=0) for p in (100, 300)]
    monkeypatch.setattr(dashboard.driver, "queue_stats", lambda: uncounted, raising=False)
    job = {"type": "job", "since": time.time()}
    url = dashboard.shown_url

    def in_flight() -> dict[int, int | None]:
        return {row.priority: row.in_flight for row in dashboard.queue_stats() or []}

    assert in_flight() == {100: 0, 300: 0}  # no worker: nothing in flight
    heartbeat(dashboard, url=url, priorities=[300], in_flight=[{**job, "id": "a"}] * 2)
    heartbeat(dashboard, url=url, priorities=[300], in_flight=[{**job, "id": "b"}])
    heartbeat(dashboard, url="memory://another-app", priorities=[100], in_flight=[job])
    assert in_flight() == {100: 0, 300: 3}
    page = client_of(dashboard).get("/").text
    assert re.search(r'<td class="num in-flight">3</td>', page), "the Overview shows it"

    # Reading both with a job in flight: which queue it came from is not said.
    heartbeat(dashboard, url=url, priorities=[], in_flight=[{**job, "id": "c"}])
    assert in_flight() == {100: None, 300: None}


def test_the_jobs_list_pages_newest_or_oldest_first_and_new_jobs_do_not_shift_its_pages(
    dashboard: Dashboard, with_records: Jobs
) -> None:
    emitted = [Message("report.build", {"n": n}) for n in range(2 * JOBS_LIMIT + 50)]
    for message in emitted:
        with_records.emitted(message, 100)
    client = client_of(dashboard)

    def walk(query: str) -> list[str]:
        seen: list[str] = []
        path: str | None = "/jobs" + query
        while path is not None:
            page = client.get(path).text
            seen += re.findall(r'<tr data-id="([^"]+)"', page)
            link = re.search(
                r'id="next-page" href="\?([^"]+)"|href="\?([^"]+)" id="next-page"', page
            )
            path = (
                None if link is None else "/jobs?" + html.unescape(link.group(1) or link.group(2))
            )
            with_records.emitted(Message("report.build", {}), 100)  # newer than every page
        return seen

    assert walk("") == [m.id for m in emitted[::-1]]
    oldest = walk("?order=oldest")
    assert oldest[: len(emitted)] == [m.id for m in emitted] and len(oldest) > len(emitted)
    assert 'id="oldest-first"' in client.get("/jobs").text
    assert 'id="newest-first"' in client.get("/jobs?order=oldest").text

    refused = client.get("/jobs?after=not-a-cursor")
    assert refused.status_code == 400 and 'id="refused"' in refused.text


def test_the_jobs_api_pages_with_next_and_order(dashboard: Dashboard, with_records: Jobs) -> None:
    emitted = [Message("report.build", {"n": n}) for n in range(5)]
    for message in emitted:
        with_records.emitted(message, 100)
    client = client_of(dashboard)

    for order, expected in (("newest", emitted[::-1]), ("oldest", emitted)):
        seen: list[str] = []
        answer = api(client, f"/api/jobs?order={order}")
        seen += [job["id"] for job in answer["jobs"]]
        assert answer["order"] == order and answer["next"] is None
        assert seen == [m.id for m in expected]
    api(client, "/api/jobs?order=sideways", status=400)
    api(client, "/api/jobs?after=not-a-cursor", status=400)


def test_cancelling_a_waiting_job_from_its_page(dashboard: Dashboard, with_records: Jobs) -> None:
    waiting = Message("report.build", {})
    with_records.emitted(waiting, 100)
    client = client_of(dashboard)
    page = client.get(f"/jobs/{waiting.id}")
    assert 'id="cancel"' in page.text and "No handler will start it" in page.text

    done = client.post("/jobs/cancel", {"csrf": csrf_of(page.text), "id": waiting.id})
    assert done.status_code == 303
    assert done.headers["location"] == f"/jobs/{waiting.id}?done=cancelled"
    record = with_records.get(waiting.id)
    assert record is not None and record.state is JobState.CANCELLED
    shown = client.get(done.headers["location"]).text
    assert "Cancel sent" in shown and ">cancelled</span>" in shown and 'id="cancel"' not in shown


def test_a_cancel_without_the_token_or_read_only_changes_nothing(
    dashboard: Dashboard, with_records: Jobs
) -> None:
    waiting = Message("report.build", {})
    with_records.emitted(waiting, 100)
    assert client_of(dashboard).post("/jobs/cancel", {"id": waiting.id}).status_code == 403
    dashboard.read_only = True
    page = client_of(dashboard).get(f"/jobs/{waiting.id}")
    assert 'id="cancel"' not in page.text
    record = with_records.get(waiting.id)
    assert record is not None and record.state is JobState.WAITING


def test_markup_in_a_job_s_type_and_error_is_shown_as_text(
    dashboard: Dashboard, with_records: Jobs
) -> None:
    message = a_given_up_job(with_records, type_="<script>alert(1)</script>")
    page = client_of(dashboard).get(f"/jobs/{message.id}").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_with_records_on_a_failed_message_links_to_its_job_page(
    dashboard: Dashboard, with_records: Jobs
) -> None:
    failed = a_failed_message(dashboard)
    page = client_of(dashboard).get("/failed").text
    assert f'<a href="/jobs/{failed.id}">{failed.id}</a>' in page


# Paging ---------------------------------------------------------------------------


def follow_pages(client: Client, path: str) -> list[list[str]]:
    """The ids listed on each page from ``path``, following "Next page" to the last."""
    pages: list[list[str]] = []
    link: str | None = path
    while link is not None:
        page = client.get(link)
        assert page.status_code == 200, page.text
        pages.append(re.findall(r'<td class="id">(?:<a [^>]*>)?([0-9a-f-]{36})', page.text))
        found = re.search(r'<a href="(\?after=[^"]+)" id="next-page">', page.text)
        link = path + html.unescape(found.group(1)) if found else None
        assert len(pages) < 100, "the pages go round"
    return pages


def test_the_queues_page_pages_through_every_waiting_message(dashboard: Dashboard) -> None:
    sent = [Message("job", {"n": n}) for n in range(450)]
    dashboard.driver.send_batch(sent)

    pages = follow_pages(client_of(dashboard), "/queues")

    assert [len(page) for page in pages] == [200, 200, 50]
    assert [i for page in pages for i in page] == [m.id for m in sent]


def test_the_queues_page_filters_by_type_and_priority_and_deletes_from_what_it_shows(
    dashboard: Dashboard,
) -> None:
    assert isinstance(dashboard.driver, MemoryDriver)
    dashboard.driver.setup_priority_queue("low", 60)
    dashboard.driver.send_batch([Message("job", {"n": n}) for n in range(450)])
    mail = [Message("mail", {"n": n}) for n in range(4)]
    dashboard.driver.send_batch(mail)
    low = [Message("mail", {"low": n}) for n in range(3)]
    dashboard.driver.send_batch(low, 60)
    client = client_of(dashboard)

    def ids(path: str) -> list[str]:
        page = client.get(path).text
        return re.findall(r'<td class="id">([0-9a-f-]{36})', page)

    assert sorted(ids("/queues?type=mail")) == sorted(m.id for m in mail + low)
    assert sorted(ids("/queues?type=mail&priority=60")) == sorted(m.id for m in low)
    assert len(ids("/queues?priority=100")) == 200  # a page, as unfiltered
    page = client.get("/queues?type=mail&priority=60").text
    assert 'name="type" value="mail"' in page and 'name="priority" value="60"' in page
    assert 'id="next-page"' not in page

    link = re.search(r'href="(/queues/delete\?[^"]+)"', page)
    assert link is not None and "type=mail" in html.unescape(link.group(1))
    confirm = client.get(html.unescape(link.group(1))).text
    assert "Delete a waiting message?" in confirm and low[0].id in confirm
    done = client.post("/queues/delete", confirmed_form(confirm))
    assert done.headers["location"] == "/queues?type=mail&priority=60&done=deleted&n=1"
    assert sorted(ids("/queues?type=mail&priority=60")) == sorted(m.id for m in low[1:])

    answer = json.loads(client.get("/api/queues?type=mail").content)
    listed = sorted(w["message"]["id"] for w in answer["waiting"])
    assert listed == sorted(m.id for m in mail + low[1:])
    nothing = client.get("/queues?type=nobody").text
    assert "Nothing waiting of that type." in nothing


def test_a_given_up_job_s_page_leads_to_its_failed_message_to_retry_it_to_its_priority(
    dashboard: Dashboard, with_records: Jobs
) -> None:
    assert dashboard.failed is not None and isinstance(dashboard.driver, MemoryDriver)
    dashboard.driver.setup_priority_queue("high", 300)
    others = [a_failed_message(dashboard) for _ in range(600)]  # a store page and more
    message = Message("card.charge", {"order": 42}, headers={"traceparent": "00-abc-def-01"})
    with_records.emitted(message, 300)
    assert with_records.start(message, 300).run
    with_records.finish(message, "given_up", state=JobState.GIVEN_UP)
    dashboard.failed.keep(message, "gave up", priority=300)
    client = client_of(dashboard)

    page = client.get(f"/jobs/{message.id}").text
    link = re.search(r'id="in-failed" href="([^"]+)"', page)
    assert link is not None and "Retry to priority 300" in page
    failed = client.get(html.unescape(link.group(1))).text
    assert re.findall(r'<tr data-id="([^"]+)"', failed) == [message.id]
    assert "traceparent: 00-abc-def-01" in failed
    assert f'job <span class="id">{message.id}</span>' in failed
    done = client.post(
        "/failed/retry", {"csrf": csrf_of(failed), "job": message.id, "id": message.id}
    )
    assert done.status_code == 303 and "done=retried&n=1" in done.headers["location"]
    assert stored_failed_ids(dashboard) == {m.id for m in others}
    high = {row.priority: row.ready for row in dashboard.driver.queue_stats()}[300]
    assert high == 1, "the retry went to another priority than the one it ran on"
    api = json.loads(client.get(f"/api/failed?job={others[0].id}").content)
    assert [m["id"] for m in api["messages"]] == [others[0].id]


def test_a_waiting_job_s_page_leads_to_where_it_waits(
    dashboard: Dashboard, with_records: Jobs
) -> None:
    dashboard.driver.send_batch([Message("job", {"n": n}) for n in range(450)])
    message = Message("mail", {"to": "ops"}, headers={"emitted-by": "web-1"})
    with_records.emitted(message, 100)
    dashboard.driver.send(message, 100)
    client = client_of(dashboard)

    page = client.get(f"/jobs/{message.id}").text
    link = re.search(r'id="in-queue" href="([^"]+)"', page)
    assert link is not None and 'id="in-failed"' not in page
    queued = client.get(html.unescape(link.group(1))).text
    assert re.findall(r'<td class="id">([0-9a-f-]{36})', queued) == [message.id]
    assert "emitted-by: web-1" in queued and "&#34;to&#34;: &#34;ops&#34;" in queued
    nothing = client.get("/queues?job=nobody").text
    assert "Nothing waiting of that id." in nothing


def test_the_failed_page_pages_through_the_store(dashboard: Dashboard) -> None:
    kept = [a_failed_message(dashboard) for _ in range(1100)]

    pages = follow_pages(client_of(dashboard), "/failed")

    assert [len(page) for page in pages] == [500, 500, 100]
    assert sorted(i for page in pages for i in page) == sorted(m.id for m in kept)


def test_a_page_of_large_payloads_lists_fewer_and_stays_bounded(dashboard: Dashboard) -> None:
    big = "x" * (3 * 1024 * 1024)
    sent = [Message("job", {"blob": big, "n": n}) for n in range(7)]
    dashboard.driver.send_batch(sent)

    first = client_of(dashboard).get("/queues")
    pages = follow_pages(client_of(dashboard), "/queues")

    assert [len(page) for page in pages] == [3, 3, 1]  # 8 MB a page: three bodies of 3 MB
    assert len(first.content) < 64 * 1024  # previews, not payloads


def test_a_filtered_queues_page_reads_no_more_bodies_than_an_unfiltered_one(
    dashboard: Dashboard,
) -> None:
    big = "x" * (3 * 1024 * 1024)
    sent = [Message("job", {"blob": big, "n": n}) for n in range(7)]
    dashboard.driver.send_batch(sent)
    dashboard.driver.send(Message("rare", {}))
    client = client_of(dashboard)

    listed: list[int] = []
    link: str | None = "/queues?type=rare"
    while link is not None:
        page = client.get(link).text
        listed.append(len(re.findall(r'<td class="type">rare</td>', page)))
        found = re.search(r'<a href="\?([^"]+)" id="next-page">', page)
        link = "/queues?" + html.unescape(found.group(1)) if found else None
        assert len(listed) < 10, "the pages go round"

    # Each page reads 8 MB of bodies at most (three of 3 MB), as an unfiltered one does,
    # not ten pages' worth: the rare one is on the third.
    assert listed == [0, 0, 1]
    assert "Nothing waiting of that type on the pages read." in client.get("/queues?type=rare").text


def test_a_filtered_failed_page_reads_about_one_page_of_bodies_and_acts_on_what_it_shows(
    dashboard: Dashboard,
) -> None:
    assert dashboard.failed is not None
    big = "x" * (3 * 1024 * 1024)
    for n in range(7):
        dashboard.failed.keep(Message("report.build", {"blob": big, "n": n}), "it broke")
    rare = dashboard.failed.keep(Message("rare", {}), "it broke")
    client = client_of(dashboard)

    listed: list[int] = []
    link = "/failed?type=rare"
    while True:
        page = client.get(link).text
        listed.append(len(re.findall(r'<tr data-id="([^"]+)"', page)))
        found = re.search(r'<a href="\?([^"]+)" id="next-page">', page)
        if found is None:
            break
        link = "/failed?" + html.unescape(found.group(1))
        assert len(listed) < 10, "the pages go round"

    # About 8 MB of bodies a page, as unfiltered (three of 3 MB): the rare one on the third.
    assert listed == [0, 0, 1]
    done = client.post(
        "/failed/delete",
        {"csrf": csrf_of(page), "type": "rare", "after": link.split("after=")[1], "id": rare.id},
    )
    assert done.status_code == 303 and "done=dropped&n=1" in done.headers["location"]
    assert rare.id not in stored_failed_ids(dashboard)


def test_actions_on_a_later_page_find_their_message_on_that_page(dashboard: Dashboard) -> None:
    sent = [Message("job", {"n": n}) for n in range(450)]
    dashboard.driver.send_batch(sent)
    kept = [a_failed_message(dashboard) for _ in range(700)]
    client = client_of(dashboard)

    def second_page(path: str) -> str:
        first = client.get(path).text
        found = re.search(r'<a href="(\?after=[^"]+)" id="next-page">', first)
        assert found is not None
        return client.get(path + html.unescape(found.group(1))).text

    page = second_page("/queues")
    link = re.search(r'<a class="danger delete" href="(/queues/delete\?[^"]+)"', page)
    assert link is not None
    confirm = client.get(html.unescape(link.group(1))).text
    assert "Delete a waiting message?" in confirm and "It cannot be undone." in confirm
    assert sum(row.ready or 0 for row in dashboard.queue_stats() or []) == 450, "asked only"
    done = client.post("/queues/delete", confirmed_form(confirm))
    assert done.headers["location"] == "/queues?done=deleted&n=1"
    assert sum(row.ready or 0 for row in dashboard.queue_stats() or []) == 449

    page = second_page("/failed")
    (shown, *_) = re.findall(r'<tr data-id="([^"]+)"', page)
    assert shown in {m.id for m in kept[500:]}
    link = re.search(r'id="retry-all" href="(/failed/retry\?[^"]+)"', page)
    assert link is not None
    confirm = client.get(html.unescape(link.group(1))).text
    assert "Retry 200 failed messages?" in confirm and shown in confirm
    done = client.post("/failed/retry", confirmed_form(confirm))
    assert done.headers["location"] == "/failed?done=retried&n=200"
    assert shown not in stored_failed_ids(dashboard)
    assert len(stored_failed_ids(dashboard)) == 500


def confirmed_form(page: str) -> Mapping[str, str | list[str]]:
    """The fields a confirmation page's button posts."""
    found = re.search(
        r'<form method="post" action="[^"]+" class="confirm">(.*?)</form>', page, re.S
    )
    assert found is not None, "no confirmation form on the page"
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(
        r'<input type="hidden" name="([^"]+)" value="([^"]*)">', found[1]
    ):
        fields.setdefault(name, []).append(html.unescape(value))
    return fields


def test_a_delete_on_the_failed_page_names_what_it_deletes_and_deletes_only_when_confirmed(
    dashboard: Dashboard,
) -> None:
    kept = [a_failed_message(dashboard) for _ in range(3)]
    client = client_of(dashboard)
    page = client.get("/failed").text
    one = re.search(rf'href="(/failed/delete\?id={kept[1].id}[^"]*)"', page)
    every = re.search(r'id="delete-all" href="(/failed/delete\?[^"]+)"', page)
    assert one is not None and every is not None

    confirm = client.get(html.unescape(one.group(1))).text
    assert "Delete 1 failed message?" in confirm and kept[1].id in confirm
    assert kept[0].id not in confirm and "It cannot be undone." in confirm
    assert 'href="/failed" id="confirm-cancel">Cancel</a>' in confirm
    assert stored_failed_ids(dashboard) == {m.id for m in kept}, "the question deleted"
    done = client.post("/failed/delete", confirmed_form(confirm))
    assert done.headers["location"] == "/failed?done=dropped&n=1"
    assert stored_failed_ids(dashboard) == {kept[0].id, kept[2].id}

    confirm = client.get(html.unescape(every.group(1))).text
    assert "Delete 2 failed messages?" in confirm
    done = client.post("/failed/delete", confirmed_form(confirm))
    assert done.headers["location"] == "/failed?done=dropped&n=2"
    assert stored_failed_ids(dashboard) == set()

    gone = client.get(html.unescape(one.group(1))).text
    assert 'id="nothing-to-confirm"' in gone and "<form" not in gone.split("<main>")[1]


def test_a_retry_goes_back_to_the_priority_the_message_failed_on(dashboard: Dashboard) -> None:
    assert dashboard.failed is not None
    urgent = dashboard.failed.keep(Message("report.build", {}), "it broke", priority=300)
    client = client_of(dashboard)
    page = client.get("/failed").text
    assert re.search(rf'<tr data-id="{urgent.id}">.*?<td class="num priority">300</td>', page, re.S)

    refused = client.post("/failed/retry", {"csrf": csrf_of(page), "id": urgent.id})
    assert refused.status_code == 503
    assert "start it with --priority 300" in html.unescape(refused.text)
    assert urgent.id in stored_failed_ids(dashboard)  # nothing was retried

    dashboard.driver.setup_priority_queue("urgent", 300)  # as --priority 300 does
    done = client.post("/failed/retry", {"csrf": csrf_of(page), "id": urgent.id})
    assert done.status_code == 303
    ready = {row.priority: row.ready for row in dashboard.queue_stats() or [] if row.ready}
    assert ready == {300: 1}


def test_the_overview_counts_workers_apart_from_schedulers_and_what_runs_and_what_failed(
    dashboard: Dashboard,
) -> None:
    assert dashboard.registry is not None
    heartbeat(dashboard, in_flight=[{"type": "job", "id": "a", "since": time.time()}] * 3)
    heartbeat(dashboard, kind="scheduler")
    a_failed_message(dashboard)
    a_failed_message(dashboard)

    page = client_of(dashboard).get("/").text

    assert 'id="live-workers">1<' in page and "and 1 scheduler" in page
    assert 'id="running-now">3<' in page
    assert 'id="failed-kept">2<' in page


def test_a_fresh_dashboard_s_chart_spans_its_samples_not_an_empty_hour() -> None:
    from hermes.dashboard._chart import LEFT, WIDTH, chart
    from hermes.dashboard._state import Sample

    now = 1_000_000.0
    fresh = chart([Sample(now - 120, {100: 4}), Sample(now, {100: 6})], now)
    first_x = float(fresh.lines[0].points.split()[0].split(",")[0])
    assert fresh.span_min == 5  # five minutes at least
    assert first_x < LEFT + (WIDTH - LEFT) * 0.7  # not squeezed against the right edge

    old = chart([Sample(now - 7200, {100: 1}), Sample(now, {100: 2})], now)
    assert old.span_min == 60


# The JSON API ---------------------------------------------------------------------


def api(client: Client, path: str, status: int = 200) -> Any:
    response = client.get(path)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    return json.loads(response.content)


def test_the_api_answers_with_what_the_pages_show(dashboard: Dashboard, with_records: Jobs) -> None:
    dashboard.driver.send_batch([Message("job", {"n": n}) for n in range(3)])
    kept = a_failed_message(dashboard)
    given_up = a_given_up_job(with_records)
    heartbeat(dashboard, in_flight=[{"type": "job", "id": "m-1", "since": time.time()}])
    client = client_of(dashboard)

    overview = api(client, "/api/overview")
    assert overview["workers"] == 1 and overview["running"] == 1
    assert overview["failed_kept"] == 1
    (queue,) = overview["queues"]
    assert queue["priority"] == 100 and queue["ready"] == 3

    queues = api(client, "/api/queues")
    shown = {json.loads(w["message"]["payload"]["preview"])["n"] for w in queues["waiting"]}
    assert shown == {0, 1, 2}
    assert queues["next"] is None

    (failed,) = api(client, "/api/failed")["messages"]
    assert failed["id"] == kept.id and failed["reason"]["preview"] == kept.failed_reason
    assert failed["priority"] == kept.priority

    (listed,) = api(client, "/api/jobs?state=given_up")["jobs"]
    assert listed["id"] == given_up.id and listed["attempts"] == 1
    assert api(client, "/api/jobs?state=running")["jobs"] == []
    record = api(client, f"/api/jobs/{given_up.id}")
    assert record["state"] == "given_up" and "card declined" in record["error"]["message"]
    assert api(client, "/api/jobs/no-such-job", 404) == {"error": "not found"}
    assert "no job state 'bogus'" in api(client, "/api/jobs?state=bogus", 400)["error"]

    (worker,) = api(client, "/api/workers")["workers"]
    assert worker["in_flight"][0]["id"] == "m-1"
    assert api(client, "/api/periodic") == {"entries": None}  # started without --handlers


def test_the_api_cuts_a_large_payload_to_a_preview_and_says_how_large_it_was(
    dashboard: Dashboard,
) -> None:
    dashboard.driver.send(Message("big", {"blob": "x" * 100_000}))

    (waiting,) = api(client_of(dashboard), "/api/queues")["waiting"]

    payload = waiting["message"]["payload"]
    assert payload["cut"] and payload["bytes"] > 100_000 and len(payload["preview"]) == 2048


def test_the_api_needs_the_same_credentials_as_the_pages(dashboard: Dashboard) -> None:
    client = client_of(dashboard, auth=Auth("ops", "s3cret"))

    assert client.get("/api/overview").status_code == 401
    assert client.get("/api/overview", auth=("ops", "wrong")).status_code == 401
    assert client.get("/api/overview", auth=("ops", "s3cret")).status_code == 200


def test_the_failed_page_filters_by_type_and_priority_and_acts_on_what_it_shows(
    dashboard: Dashboard,
) -> None:
    dashboard.driver.setup_priority_queue("urgent", 300)
    assert dashboard.failed is not None
    mails = [dashboard.failed.keep(Message("mail", {}), "broke", priority=300) for _ in range(3)]
    other = [dashboard.failed.keep(Message("mail", {}), "broke", priority=100)]
    other += [dashboard.failed.keep(Message("report", {}), "broke", priority=300)]
    client = client_of(dashboard)

    page = client.get("/failed?type=mail&priority=300").text
    assert set(re.findall(r'<tr data-id="([^"]+)"', page)) == {m.id for m in mails}
    assert 'name="type" value="mail"' in page and 'name="priority" value="300"' in page
    link = re.search(r'id="retry-all" href="(/failed/retry\?[^"]+)"', page)
    assert link is not None
    confirm = client.get(html.unescape(link.group(1))).text
    assert "Retry 3 failed messages?" in confirm
    done = client.post("/failed/retry", confirmed_form(confirm))
    assert done.headers["location"] == "/failed?type=mail&priority=300&done=retried&n=3"
    assert stored_failed_ids(dashboard) == {m.id for m in other}

    empty = client.get("/failed?type=mail&priority=300").text
    assert "No failed messages of that type and priority." in empty
    assert [
        m["type"] for m in json.loads(client.get("/api/failed?type=report").content)["messages"]
    ] == ["report"]


def test_a_filtered_failed_page_reads_further_pages_of_the_store_to_fill_itself(
    dashboard: Dashboard,
) -> None:
    assert dashboard.failed is not None
    for _ in range(700):
        a_failed_message(dashboard)  # report.build: 500 on the store's first page, 200 after
    rare = [dashboard.failed.keep(Message("rare", {}), "broke") for _ in range(3)]
    client = client_of(dashboard)

    page = client.get("/failed?type=rare").text

    assert set(re.findall(r'<tr data-id="([^"]+)"', page)) == {m.id for m in rare}
    assert 'id="next-page"' not in page  # the store's last page was read


def test_a_worker_is_stopped_from_the_workers_page_after_a_page_that_names_it(
    dashboard: Dashboard,
) -> None:
    record = heartbeat(dashboard, id="web-1:4242:abc123")
    heartbeat(dashboard, id="web-1:4343:def456", kind="scheduler")
    client = client_of(dashboard)

    page = client.get("/workers").text
    links = re.findall(r'<a class="danger stop" href="(/workers/stop\?[^"]+)">Stop…</a>', page)
    assert len(links) == 1, "a Stop for the worker, none for the scheduler"
    confirm = client.get(html.unescape(links[0])).text
    assert "Stop a worker?" in confirm and record["id"] in confirm and "web-1 pid 4242" in confirm
    assert dashboard.registry is not None
    assert dashboard.registry.record_get(f"hermes-stop:{record['id']}") is None  # asked only
    done = client.post("/workers/stop", confirmed_form(confirm))
    assert done.headers["location"] == "/workers?done=stopping"
    request = dashboard.registry.record_get(f"hermes-stop:{record['id']}")
    assert request is not None and json.loads(request)["by"] == "from the dashboard"

    gone = client.get("/workers/stop?id=nobody").text
    assert 'id="nothing-to-confirm"' in gone
    refused = client.post("/workers/stop", {"csrf": csrf_of(confirm), "id": "nobody"})
    assert refused.status_code == 404


def test_a_worker_is_quieted_from_the_workers_page_after_a_page_that_names_it(
    dashboard: Dashboard,
) -> None:
    record = heartbeat(dashboard, id="web-1:4242:abc123")
    heartbeat(dashboard, id="web-1:4343:def456", kind="scheduler")
    client = client_of(dashboard)

    page = client.get("/workers").text
    links = re.findall(r'<a class="quiet" href="(/workers/quiet\?[^"]+)">Quiet…</a>', page)
    assert len(links) == 1, "a Quiet for the worker, none for the scheduler"
    confirm = client.get(html.unescape(links[0])).text
    assert "Quiet a worker?" in confirm and "web-1 pid 4242" in confirm
    assert "stays alive, quiet, until it is stopped" in confirm
    assert dashboard.registry is not None
    assert dashboard.registry.record_get(f"hermes-quiet:{record['id']}") is None  # asked only
    done = client.post("/workers/quiet", confirmed_form(confirm))
    assert done.headers["location"] == "/workers?done=quieting"
    request = dashboard.registry.record_get(f"hermes-quiet:{record['id']}")
    assert request is not None and json.loads(request)["by"] == "from the dashboard"
    assert dashboard.registry.record_get(f"hermes-stop:{record['id']}") is None, "not a stop"

    heartbeat(dashboard, id=record["id"], quiet="from the dashboard", paused=[100])
    page = client.get("/workers").text
    assert "quiet: takes no more jobs" in page
    assert not re.findall(r'<a class="quiet"', page), "no Quiet for a worker already quiet"
    refused = client.post("/workers/quiet", {"csrf": csrf_of(confirm), "id": "nobody"})
    assert refused.status_code == 404


def test_jobs_per_minute_count_each_worker_from_its_last_sample_restarts_included() -> None:
    from hermes.dashboard._chart import activity_chart
    from hermes.dashboard._state import Minute, Sample, WorkerCounts, per_minute

    t = 1_000_020.0  # 20 s into a minute
    history = [
        Sample(t, {}, {"a": WorkerCounts(t - 3600, 100, 5, 2), "old": WorkerCounts(t - 60, 7)}),
        # "a" handled 10 more; "old" was replaced by "new" (started since: counts from 0);
        # "late" was first seen now but started long ago: not counted yet.
        Sample(
            t + 30,
            {},
            {
                "a": WorkerCounts(t - 3600, 110, 6, 2),
                "new": WorkerCounts(t + 10, 3, 0, 1),
                "late": WorkerCounts(t - 600, 500),
            },
        ),
        Sample(
            t + 60, {}, {"a": WorkerCounts(t - 3600, 111, 6, 4), "late": WorkerCounts(t - 600, 504)}
        ),
    ]

    assert per_minute(history) == [
        Minute(1_000_020.0, handled=13, failed=1, retried=1),
        Minute(1_000_080.0, handled=5, failed=0, retried=2),
    ]
    drawn = activity_chart(history, now=t + 60)
    assert [s.label for s in drawn.series] == ["handled", "failed", "retried"]
    # The minute under way (from t + 60) is drawn; the legend says the last whole one.
    assert [s.latest for s in drawn.series] == [13, 1, 1] and drawn.top == 13
    assert len(drawn.series[0].points.split()) == 2


def test_the_overview_shows_jobs_per_minute_from_the_heartbeats(dashboard: Dashboard) -> None:
    record = heartbeat(dashboard, handled=10, failed=1, retried=0)
    dashboard.sample()
    heartbeat(
        dashboard, id=record["id"], started=record["started"], handled=25, failed=3, retried=4
    )
    dashboard.sample()
    client = client_of(dashboard)

    page = client.get("/").text
    assert '<span class="handled-per-minute">15</span>' in page
    assert '<span class="failed-per-minute">2</span>' in page
    assert '<span class="retried-per-minute">4</span>' in page
    assert 'id="failure-rate">11.8 %<' in page  # 2 failed of 17
    (minute,) = json.loads(client.get("/api/overview").content)["per_minute"]
    assert (minute["handled"], minute["failed"], minute["retried"]) == (15, 2, 4)


def test_a_periodic_entry_s_fires_show_in_utc_and_in_its_own_timezone(dashboard: Dashboard) -> None:
    from hermes.core.schedule import Schedule

    schedule = Schedule()
    schedule.cron("30 2 * * *", type="report.nightly", timezone="Europe/Bratislava")
    schedule.every(seconds=60, type="ping")
    dashboard.schedule = schedule

    page = client_of(dashboard).get("/periodic").text

    # 02:30 in Bratislava is 00:30 or 01:30 UTC, whatever the season.
    assert re.search(r"<span>0[01]:30:00 UTC</span>", page), page[-3000:]
    assert '<span class="muted local">02:30:00 Europe/Bratislava</span>' in page
    assert page.count('class="muted local"') == 1  # the UTC entry shows UTC alone


def test_the_queues_page_shows_each_limit_s_use_and_the_api_the_same(
    dashboard: Dashboard,
) -> None:
    dashboard.limits_store = dashboard.driver
    limiter = Limiter(dashboard.driver)
    charge = Limit(concurrency=2, key="customer")
    for _ in range(3):  # two run, the third is told to come back
        limiter.take(charge, Message("charge", {"customer": "<c-7>"}))
    # The hour's first turn runs; the second job is given the next one.
    limiter.take(Limit(rate="1/h"), Message("export", {}))
    limiter.take(Limit(rate="1/h"), Message("export", {}))

    page = client_of(dashboard).get("/queues").text
    listed = api(client_of(dashboard), "/api/queues")["limits"]

    assert "<h2>Limits</h2>" in page
    assert "charge:&lt;c-7&gt;" in page and "<c-7>" not in page
    # (The third charge waits a tenth of a second for a slot: too short to count on here.)
    assert [(u["key"], u["running"]) for u in listed] == [("charge:<c-7>", 2), ("export", 0)]
    assert listed[1]["waiting"] == 1  # the hour's second turn
    limiter.close()


def test_a_dashboard_without_a_limits_store_has_no_limits_section(dashboard: Dashboard) -> None:
    assert "<h2>Limits</h2>" not in client_of(dashboard).get("/queues").text
    assert api(client_of(dashboard), "/api/queues")["limits"] is None


def test_a_priority_is_paused_and_resumed_from_the_queues_page_with_its_token_only(
    dashboard: Dashboard,
) -> None:
    client = client_of(dashboard)
    page = client.get("/queues").text
    assert re.search(
        r'name="priority" value="100"><input type="hidden" name="pause" value="1">', page
    )
    token = csrf_of(page)

    refused = client.post("/queues/pause", {"priority": "100", "pause": "1"})
    assert refused.status_code == 403
    unknown = client.post("/queues/pause", {"csrf": token, "priority": "7", "pause": "1"})
    assert unknown.status_code == 404
    assert dashboard.paused() == {}

    done = client.post("/queues/pause", {"csrf": token, "priority": "100", "pause": "1"})
    assert done.headers["location"] == "/queues?done=paused&queue=100"
    assert dashboard.paused()[100]["by"] == "from the dashboard"
    shown = client.get(done.headers["location"]).text
    assert "Paused priority 100" in shown and '<span class="paused">paused</span>' in shown
    assert 'class="resume"' in shown
    assert '<span class="paused">paused</span>' in client.get("/").text  # the overview too

    client.post("/queues/pause", {"csrf": token, "priority": "100", "pause": "0"})
    assert dashboard.paused() == {}

    dashboard.read_only = True
    page = client.get("/queues").text
    assert 'action="/queues/pause"' not in page
    read_only = client.post("/queues/pause", {"csrf": token, "priority": "100", "pause": "1"})
    assert read_only.status_code in (403, 404) and dashboard.paused() == {}


def test_a_workflow_s_page_shows_its_tree_with_a_link_to_each_step(dashboard: Dashboard) -> None:
    from hermes.core import Dispatcher, Worker
    from hermes.core.workflows import Workflows, chain, group, job

    driver = dashboard.driver
    dashboard.jobs = Jobs(driver)
    handle = Workflows(driver, dashboard.jobs).start(
        chain(group(job("a"), job("b")), job("<b>c</b>"))
    )
    dispatcher = Dispatcher(driver, records=dashboard.jobs)
    dispatcher.register_handler("a", lambda m: None)
    dispatcher.register_handler("b", lambda m: False)  # refused: the chain stops
    Worker(driver, dispatcher, max_items=2, handle_signals=False).run()
    client = client_of(dashboard)

    page = client.get(f"/jobs/{handle.id}").text
    assert '<span class="state state-failed" id="state">failed</span>' in page
    links = re.findall(r'<a class="id" href="/jobs/([^"]+)">', page)
    assert links == [handle.id, f"{handle.id}.0", f"{handle.id}.0.0", f"{handle.id}.0.1"]
    assert "&lt;b&gt;c&lt;/b&gt;" not in page  # a step not sent shows no type it was never given
    assert f'<span class="id">{handle.id}.1</span>' in page and "not sent" in page

    step = client.get(f"/jobs/{handle.id}.0.1").text
    assert f'A step of workflow <a class="id" href="/jobs/{handle.id}">' in step
    assert 'id="state">given_up</span>' in step
