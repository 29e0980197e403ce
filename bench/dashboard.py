"""What the dashboard's list pages cost with a realistic backlog, on Redis and PostgreSQL.

    python -m bench.dashboard [--quick] [--out DIR]

For each store, in one run: 10,000 waiting messages (half on priority 100,
half on 300), 1,000 scheduled a day ahead and 1,000 in the failed-message
store, each with a payload of some 300 bytes, and a job record for every
waiting and scheduled one (emitted through an Emitter with records). Then ``hermes
dashboard`` (the command users run) on a free port, and for each page the
time from the request to the last byte of the answer, the median of 5
requests after one uncounted, with the answer's size:

* the Overview, the Queues page's first page and its last (reached by
  following "Next page" from the first; the walk's slowest page is reported
  too) and filtered by type and by priority, the Failed page's first and last
  and filtered, the Jobs list (all, and filtered by state, and by type and
  priority), one job's page, the Workers page, and ``/api/queues``;
* the Jobs list over the 11,000 records (a record per waiting and per
  scheduled message) paged: its last page newest first and oldest first
  (reached by following its "Older jobs"/"Newer jobs" link, the walk's
  slowest page reported too), its first page oldest first, a filter no
  record matches (it reads its bounded share and gives a link on), and
  ``/api/jobs``.

The target the project states, reported beside the figures: every list page
answers in under 300 ms. A full run writes ``bench/results/dashboard.md`` and
``dashboard.json``; ``--quick`` (1,000 waiting, 100 scheduled, 100 failed, 3
requests a page) is a smoke run that proves every row can be measured, and
writes nothing. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.run import ROOT, load_average, machine, services

#: The bound the project states for a list page.
TARGET_MS = 300.0
#: "Next page" on the Queues and Failed pages.
_NEXT = re.compile(r'<a href="(\?after=[^"]+)" id="next-page">')
_NEXT_FILTERED = re.compile(r'<a href="\?[^"]*after=[^"]+" id="next-page">')
#: The next page's link on any list, its query kept (the Jobs list's order, a filter).
_NEXT_ANY = re.compile(r'<a href="(\?[^"]*after=[^"]+)" id="next-page">')


@dataclass
class Row:
    store: str
    page: str
    ms: float
    bytes: int
    note: str = ""


@dataclass
class Report:
    quick: bool
    waiting: int
    scheduled: int
    failed: int
    started: str
    machine: str
    load: list[str]
    rows: list[Row] = field(default_factory=list)
    fill_s: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _hermes() -> str:
    return str(Path(sys.executable).parent / "hermes")


def _get(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
    return (time.perf_counter() - started) * 1000, body


def _timed(url: str, repeats: int) -> tuple[float, bytes]:
    _get(url)  # connections, templates, the first SCAN: not counted
    samples = [_get(url) for _ in range(repeats)]
    return statistics.median(ms for ms, _ in samples), samples[-1][1]


def _payload(n: int) -> dict[str, object]:
    return {
        "order": n,
        "customer": f"cus_{n:08d}",
        "lines": [{"sku": f"SKU-{n % 97:04d}", "qty": 1 + n % 3, "price": 19.9}] * 3,
        "note": "deliver to the back door, ring twice" * 3,
    }


def fill(url: str, failed_url: str, results_url: str, report: Report) -> str:
    """The backlog; the id of one waiting job (for its page)."""
    from hermes.core import Emitter, FailedStore, Message, connect
    from hermes.core._cli._common import setup_priorities
    from hermes.core.jobs import Jobs

    started = time.monotonic()
    jobs = Jobs(results_url)
    try:
        with connect(url) as driver:
            setup_priorities(driver, [300])
            emitter = Emitter(driver, records=jobs)
            half = report.waiting // 2
            waiting = [Message("order.paid", _payload(n)) for n in range(report.waiting)]
            emitter.emit_batch(waiting[:half])
            emitter.emit_batch(waiting[half:], priority=300)
            later = time.time() + 86_400
            scheduled = [
                Message("report.build", _payload(n), execute_at=later)
                for n in range(report.scheduled)
            ]
            emitter.emit_batch(scheduled)
    finally:
        jobs.close()
    with FailedStore.connect(failed_url) as store:
        for n in range(report.failed):
            store.keep(Message("card.charge", _payload(n)), "card.charge: gave up after 25 retries")
    report.fill_s[url.split(":", 1)[0]] = time.monotonic() - started
    return waiting[0].id


@contextmanager
def dashboard(url: str, failed_url: str, results_url: str) -> Iterator[str]:
    port = services.free_port()
    args = [_hermes(), "dashboard", "--url", url, "--failed-url", failed_url]
    args += ["--results-url", results_url, "--priority", "300", "--port", str(port)]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(base + "/static/style.css")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    said = log.read().decode("utf-8", "replace")[-2000:]
                    raise RuntimeError(f"hermes dashboard did not start: {said}") from None
                time.sleep(0.1)
        yield base
    finally:
        log.close()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def walk(base: str, path: str, link: re.Pattern[str] = _NEXT) -> tuple[int, float, str]:
    """Follow "Next page" (``link``) from ``path``'s first page: pages, the slowest
    page's ms, and the last page's URL."""
    url, pages, slowest = base + path, 0, 0.0
    route = path.split("?", 1)[0]
    while True:
        ms, body = _get(url)
        pages, slowest = pages + 1, max(slowest, ms)
        found = link.search(body.decode())
        if found is None:
            return pages, slowest, url
        url = base + route + html.unescape(found.group(1))


def _listed(url: str) -> str:
    """How many messages a filtered page listed (a filter reads up to 10 pages to fill it)."""
    _, body = _get(url)
    listed = len(re.findall(r'<td class="id">', body.decode()))
    more = "; a Next page" if _NEXT_FILTERED.search(body.decode()) else ""
    return f"{listed} listed{more}"


def measure(store: str, base: str, job_id: str, report: Report, repeats: int) -> None:
    def row(page: str, url: str, note: str = "") -> None:
        ms, body = _timed(url, repeats)
        report.rows.append(Row(store, page, ms, len(body), note))
        print(f"  {store:10} {page:34} {ms:8.1f} ms  {len(body):>9,} bytes {note}", flush=True)

    row("Overview", base + "/")
    row("Queues, first page", base + "/queues")
    pages, slowest, last = walk(base, "/queues")
    row("Queues, last page", last, f"page {pages}; slowest of the walk {slowest:.0f} ms")
    # Filtered: on Redis the scheduled type is listed last, and priority 100 after the
    # 5,000 of 300, so these read the most pages a filter reads before it lists one.
    for name, query in [
        ("type report.build", "type=report.build"),
        ("priority 100", "priority=100"),
    ]:
        url = f"{base}/queues?{query}"
        row(f"Queues, {name}", url, _listed(url))
    row("Failed, first page", base + "/failed")
    pages, slowest, last = walk(base, "/failed")
    row("Failed, last page", last, f"page {pages}; slowest of the walk {slowest:.0f} ms")
    row("Failed, type and priority", base + "/failed?type=card.charge&priority=100")
    row("Jobs", base + "/jobs")
    row("Jobs, state waiting", base + "/jobs?state=waiting")
    row("Jobs, type and priority 300", base + "/jobs?type=order.paid&priority=300")
    for name, path in [
        ("Jobs, last page", "/jobs"),
        ("Jobs, oldest first, last page", "/jobs?order=oldest"),
    ]:
        pages, slowest, last = walk(base, path, _NEXT_ANY)
        row(name, last, f"page {pages}; slowest of the walk {slowest:.0f} ms")
    row("Jobs, oldest first", base + "/jobs?order=oldest")
    url = base + "/jobs?state=given_up"
    row("Jobs, state given_up (none)", url, _listed(url))
    row("/api/jobs", base + "/api/jobs")
    row("a job's page", base + f"/jobs/{job_id}")
    row("Workers", base + "/workers")
    row("/api/queues", base + "/api/queues")


def teardown(*urls: str) -> None:
    from hermes.core import connect
    from hermes.core._cli._common import setup_priorities

    for url in urls:
        with suppress(Exception), connect(url) as driver:
            setup_priorities(driver, [300])
            driver.teardown()  # type: ignore[attr-defined]


def stores() -> dict[str, Callable[[str], tuple[str, str, str]]]:
    def redis(ns: str) -> tuple[str, str, str]:
        base = services.ensure_redis()
        return tuple(f"{base}?prefix={ns}{part}:" for part in ("", "-failed", "-records"))  # type: ignore[return-value]

    def postgres(ns: str) -> tuple[str, str, str]:
        base = services.ensure_postgres()
        sep = "&" if "?" in base else "?"
        tables = (f"hermes_{ns}", f"hermes_{ns}_failed", f"hermes_{ns}_records")
        return tuple(f"{base}{sep}table={t}" for t in tables)  # type: ignore[return-value]

    return {"Redis": redis, "PostgreSQL": postgres}


def markdown(report: Report) -> str:
    lines = [
        f"`python -m bench.dashboard{' --quick' if report.quick else ''}` ({report.started}; "
        f"{report.machine}; load {report.load[0]} before, {report.load[-1]} after).",
        "",
        f"Each store holds {report.waiting:,} waiting messages (half on priority 100, half on "
        f"300), {report.scheduled:,} scheduled a day ahead, {report.failed:,} failed, and a "
        "job record per waiting and scheduled message; `hermes dashboard` serves them. Time: "
        "request to "
        "the answer's last byte, median of "
        f"{3 if report.quick else 5} requests after one uncounted.",
        "",
        "| store | page | ms | bytes | |",
        "|---|---|---:|---:|---|",
    ]
    for r in report.rows:
        lines.append(f"| {r.store} | {r.page} | {r.ms:.1f} | {r.bytes:,} | {r.note} |")
    slowest = max(report.rows, key=lambda r: r.ms, default=None)
    if slowest is not None:
        held = "yes" if slowest.ms < TARGET_MS else "no"
        lines += [
            "",
            "| target | measured | bound | held |",
            "|---|---:|---:|---|",
            f"| slowest page ({slowest.store}, {slowest.page}) | {slowest.ms:.1f} ms "
            f"| < {TARGET_MS:.0f} ms | {held} |",
        ]
    lines += [""] + [f"- error: {error}" for error in report.errors]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts, nothing written")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    report = Report(
        quick=args.quick,
        waiting=1_000 if args.quick else 10_000,
        scheduled=100 if args.quick else 1_000,
        failed=100 if args.quick else 1_000,
        started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        machine=machine(),
        load=[load_average()],
    )
    repeats = 3 if args.quick else 5
    for store, urls_of in stores().items():
        ns = f"benchdash{uuid.uuid4().hex[:8]}"
        urls: tuple[str, str, str] = ("", "", "")
        try:
            urls = urls_of(ns)
            print(f"== {store}: filling", flush=True)
            job_id = fill(*urls, report)
            with dashboard(*urls) as base:
                measure(store, base, job_id, report, repeats)
        except Exception as exc:  # one store's failure must not hide the other's figures
            report.errors.append(f"{store}: {type(exc).__name__}: {exc}")
            print(f"  !! {store}: {exc}", flush=True)
        finally:
            teardown(*[u for u in urls if u])
    report.load.append(load_average())
    md = markdown(report)
    print()
    print(md)
    if not args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "dashboard.md").write_text(md)
        (out / "dashboard.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
