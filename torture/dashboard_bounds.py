"""The dashboard with a broker full of large payloads: pages and requests stay bounded.

    python -m torture.dashboard_bounds [--quick] [--out DIR]

A redis-server of the run's own (no persistence, a free port) is filled with
10,000 waiting messages of 1 MB each (``--quick``: 200) and a failed-message
store with 1,000 (``--quick``: 50); a real ``hermes dashboard`` serves them.
The run then reads every page of Queues and of Failed, following "Next page"
from the first to the last, and posts a 50 MB body; then headless Chromium
(Debian's, through Selenium) opens Queues and clicks "Next page" to the last.
Rules, each a row of the table:

* every page answers 200, and none is larger than 1 MB of HTML (previews of
  2 KB per payload, not the payloads);
* the pages list every message exactly as many times as the broker holds it
  (the sets do not change meanwhile, so once each);
* the dashboard process's peak memory (``VmHWM``) stays under 400 MB: a page
  reads 8 MB of bodies at most, whatever the broker holds;
* the 50 MB POST is refused with 413 before it is read whole;
* in Chromium, "Next page" reaches the last page and the rows shown add up
  to every waiting message.

The full run writes ``torture/results/dashboard-bounds.md``. Exit 1 when a rule
is broken. Times are reported, never judged.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import http.client
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import services  # noqa: E402

from hermes.core import FailedStore, Message, connect  # noqa: E402

PAYLOAD_BYTES = 1024 * 1024
#: The largest page allowed, in bytes of HTML.
PAGE_BOUND = 1024 * 1024
#: The dashboard's peak resident memory allowed.
RSS_BOUND_MB = 400
_ID = re.compile(r'<td class="id">(?:<a [^>]*>)?([0-9a-f-]{36})')
_NEXT = re.compile(r'<a href="(\?after=[^"]+)" id="next-page">')


@dataclass
class Walk:
    """Every page of one dashboard page's listing."""

    pages: int = 0
    ids: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    statuses: set[int] = field(default_factory=set)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    port = services.free_port()
    with tempfile.TemporaryDirectory(prefix="hermes-bounds-") as tmp:
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp]
        argv += ["--save", "", "--appendonly", "no"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        try:
            services.wait_for_port(port, 20, "redis-server", proc)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(30)


def fill(url: str, failed_url: str, waiting: int, failed: int) -> set[str]:
    """Send ``waiting`` messages and keep ``failed``; the ids of both."""
    blob = "x" * PAYLOAD_BYTES
    ids: set[str] = set()
    with connect(url) as driver:
        for start in range(0, waiting, 20):
            batch = [Message("report", {"blob": blob, "n": n}) for n in range(start, start + 20)]
            driver.send_batch(batch[: waiting - start])
            ids.update(m.id for m in batch[: waiting - start])
    with FailedStore.connect(failed_url) as store:
        for n in range(failed):
            ids.add(store.keep(Message("report", {"blob": blob, "n": n}), "gave up").id)
    return ids


def get(port: int, path: str) -> tuple[int, bytes, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read(), time.perf_counter() - started
    finally:
        conn.close()


def walk(port: int, path: str) -> Walk:
    done = Walk()
    link: str | None = path
    while link is not None:
        status, body, seconds = get(port, link)
        text = body.decode()
        done.pages += 1
        done.statuses.add(status)
        done.sizes.append(len(body))
        done.seconds.append(seconds)
        done.ids += _ID.findall(text)
        found = _NEXT.search(text)
        link = path + html.unescape(found.group(1)) if found else None
        if done.pages > 100_000:
            raise RuntimeError(f"{path}: the pages go round")
    return done


def big_post(port: int) -> tuple[int, float]:
    """A 50 MB form POST, sent as fast as the server takes it; its status and the time."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        head = (
            f"POST /queues/delete HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {50 * 1024 * 1024}\r\n\r\n"
        )
        sock.sendall(head.encode())
        chunk = b"k" * (1024 * 1024)
        with contextlib.suppress(OSError):  # the server may answer and close first
            for _ in range(50):
                sock.sendall(chunk)
        answer = sock.recv(200).decode("latin-1")
    status = int(answer.split()[1]) if answer.startswith("HTTP/") else 0
    return status, time.perf_counter() - started


def click_through(port: int) -> tuple[int, int]:
    """Headless Chromium on Queues, clicking "Next page" until there is none: (pages, rows)."""
    from selenium.webdriver.common.by import By

    with services.chromium_browser(page_load_timeout_s=120) as browser:
        browser.get(f"http://127.0.0.1:{port}/queues")
        pages = rows = 0
        while True:
            pages += 1
            rows += len(browser.find_elements(By.CSS_SELECTOR, "table.messages tbody tr"))
            following = browser.find_elements(By.ID, "next-page")
            if not following or pages > 100_000:
                return pages, rows
            following[0].click()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 waiting, 50 failed")
    parser.add_argument("--out", default=str(ROOT / "torture" / "results"))
    args = parser.parse_args(argv)
    waiting, failed = (200, 50) if args.quick else (10_000, 1_000)
    hermes = shutil.which("hermes", path=str(Path(sys.executable).parent)) or "hermes"
    with redis_server() as url:
        failed_url = url + "?prefix=failed:"
        started = time.perf_counter()
        sent = fill(url, failed_url, waiting, failed)
        fill_s = time.perf_counter() - started
        port = services.free_port()
        argv_ = [hermes, "dashboard", "--url", url, "--failed-url", failed_url]
        argv_ += ["--port", str(port), "--sample-interval", "60"]
        with tempfile.TemporaryFile() as log:
            proc = subprocess.Popen(argv_, stdout=log, stderr=subprocess.STDOUT)
            try:
                services.wait_for_port(port, 60, "hermes dashboard", proc)
                queues = walk(port, "/queues")
                failed_walk = walk(port, "/failed")
                overview = get(port, "/")
                post_status, post_s = big_post(port)
                clicked_pages, clicked_rows = click_through(port)
                rss = peak_rss_mb(proc.pid)
            finally:
                proc.terminate()
                proc.wait(30)
    listed = queues.ids + failed_walk.ids
    rows = [
        (
            "every page answers 200",
            f"Queues {sorted(queues.statuses)}, Failed {sorted(failed_walk.statuses)}, "
            f"Overview {overview[0]}",
            queues.statuses == {200} and failed_walk.statuses == {200} and overview[0] == 200,
        ),
        (
            f"no page over {PAGE_BOUND // 1024} KB of HTML",
            f"largest {max(queues.sizes + failed_walk.sizes) / 1024:,.0f} KB",
            max(queues.sizes + failed_walk.sizes) <= PAGE_BOUND,
        ),
        (
            "every message listed, once",
            f"{len(listed):,} listed, {len(set(listed)):,} distinct, {len(sent):,} held",
            sorted(listed) == sorted(sent),
        ),
        (
            f"dashboard peak memory under {RSS_BOUND_MB} MB",
            f"{rss:,.0f} MB",
            rss < RSS_BOUND_MB,
        ),
        (
            "a 50 MB POST is refused with 413",
            f"{post_status} in {post_s:.2f} s",
            post_status == 413,
        ),
        (
            'Chromium: "Next page" reaches the last page, every message shown',
            f"{clicked_pages:,} pages, {clicked_rows:,} rows for {waiting:,} waiting",
            clicked_pages == queues.pages and clicked_rows == waiting,
        ),
    ]
    held = all(ok for _, _, ok in rows)
    lines = [
        f"`python -m torture.dashboard_bounds{' --quick' if args.quick else ''}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): {waiting:,} waiting "
        f"messages and {failed:,} failed ones of {PAYLOAD_BYTES // 1024} KB each on a "
        f"redis-server of the run's own ({fill_s:.0f} s to fill), one `hermes dashboard`.",
        "",
        "| listing | pages | messages | page p50 | page max | HTML max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, done in (("Queues", queues), ("Failed", failed_walk)):
        lines.append(
            f"| {name} | {done.pages:,} | {len(done.ids):,} | "
            f"{statistics.median(done.seconds) * 1000:,.0f} ms | "
            f"{max(done.seconds) * 1000:,.0f} ms | {max(done.sizes) / 1024:,.0f} KB |"
        )
    lines += ["", "| rule | measured | held |", "|---|---|---|"]
    lines += [f"| {rule} | {measured} | {'yes' if ok else 'NO'} |" for rule, measured, ok in rows]
    report = "\n".join(lines) + "\n"
    print(report)
    if not args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "dashboard-bounds.md").write_text(report)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
