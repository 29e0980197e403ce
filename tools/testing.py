"""What the driver test suites share: waiting to a deadline, a Shutdown set by hand, refusals.

The root ``conftest.py`` loads this file as the module ``hermes_test_support``
(test directories are not packages, so there is nothing else to import it
from); ``from hermes_test_support import eventually, StopFlag, StopWhen`` then
works in every conftest and test module.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

#: How long a test polls for something that should take milliseconds.
DEADLINE_S = 10.0

T = TypeVar("T")


def eventually(
    condition: Callable[[], Any],
    what: str,
    timeout_s: float = DEADLINE_S,
    interval_s: float = 0.01,
    details: Callable[[], str] | None = None,
) -> Any:
    """``condition()``'s first truthy value, polled until ``timeout_s``; fails naming ``what``.

    ``details()``, if given, is added to the failure: what the test saw instead.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f": {details()}" if details is not None else ""
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}{extra}")
        time.sleep(interval_s)


class StopFlag:
    """A Shutdown a test sets by hand, from any thread."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def should_shutdown(self, start_time: float) -> bool:
        return self.event.is_set()

    def shutdown(self, at: float | None = None) -> bool:
        self.event.set()
        return True


class StopWhen:
    """A Shutdown that stops ``wait()`` once ``condition()`` holds, at ``timeout_s``, or when set.

    The deadline turns a worker that never gets its messages into a failing
    test instead of a hanging one.
    """

    def __init__(
        self, condition: Callable[[], Any] = lambda: False, timeout_s: float = DEADLINE_S
    ) -> None:
        self.condition = condition
        self.deadline = time.monotonic() + timeout_s
        self.event = threading.Event()

    def should_shutdown(self, start_time: float) -> bool:
        return self.event.is_set() or bool(self.condition()) or time.monotonic() > self.deadline

    def shutdown(self, at: float | None = None) -> bool:
        self.event.set()
        return True


# Refusals ---------------------------------------------------------------------

#: Long enough for a refusal that takes milliseconds, on a slow shared machine.
REFUSAL_S = 30.0


def concurrently(
    count: int, call: Callable[[int], T], timeout_s: float = 3 * DEADLINE_S
) -> tuple[list[T], float]:
    """``call(i)`` for each i in ``range(count)``, on threads released at once (a barrier);
    the answers, ``answers[i]`` being ``call(i)``'s, and the seconds from the first start
    to the last join. Fails on the first exception a call raised."""
    barrier = threading.Barrier(count)
    answers: list[Any] = [None] * count
    done: list[int] = []
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait()
            answers[index] = call(index)
            done.append(index)
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    took = time.monotonic() - started
    assert errors == [], f"a concurrent call raised {errors[0]!r}"
    assert len(done) == count, f"{count - len(done)} of {count} calls never returned"
    return answers, took


def refused_send(url: str, *names: str, kind: type[Exception] | None = None) -> str:
    """The one line ``send`` on ``url`` is refused with; it names each of ``names``.

    ``kind``: the refusal's class, when a driver has its own (default: any refusal).
    """
    from hermes.core import BrokerRefusedError, Message, connect

    driver = connect(url)
    try:
        with pytest.raises(kind or BrokerRefusedError) as caught:
            driver.send(Message("refused"))
    finally:
        driver.close()
    text = str(caught.value)
    assert "\n" not in text, text
    for name in names:
        assert name in text, text
    return text


def worker_stops_refused(url: str, match: str) -> None:
    """A Worker on ``url`` stops with the refusal (``match``) instead of backing off for ever."""
    from hermes.core import BrokerRefusedError, Worker, connect

    driver = connect(url)
    deadline = time.monotonic() + REFUSAL_S  # a worker that retries fails the test, not hangs
    try:
        with pytest.raises(BrokerRefusedError, match=match):
            Worker(
                driver,
                {"refused": lambda message: None},
                handle_signals=False,
                stop_when=lambda: time.monotonic() > deadline,
            ).run()
    finally:
        driver.close()


def refused_worker_line(url: str, cwd: Path, *args: str, never: Sequence[str] = ()) -> str:
    """``hermes worker --url URL`` exits 2 with no traceback and one ``hermes: error:`` line: it.

    ``never``: what must not appear anywhere in its output (a password).
    """
    (cwd / "refused_handlers.py").write_text(
        textwrap.dedent(
            """
            def handle(message):
                return True

            HANDLERS = {"refused": handle}
            """
        )
    )
    hermes = Path(sys.executable).with_name("hermes")
    result = subprocess.run(
        [str(hermes), "worker", "--url", url, "--handlers", "refused_handlers:HANDLERS", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(cwd)},
        capture_output=True,
        text=True,
        timeout=REFUSAL_S,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    refusals = [line for line in result.stderr.splitlines() if line.startswith("hermes: error:")]
    assert len(refusals) == 1, result.stderr
    for secret in never:
        assert secret not in result.stdout + result.stderr, "the output shows a secret"
    return refusals[0]


def handled_by_a_worker(url: str) -> tuple[Any, str]:
    """Send a message on ``url`` and run a Worker until it is handled: that message, and the
    driver's repr. The queue is torn down afterwards."""
    from hermes.core import Message, Worker, connect

    driver = connect(url)
    handled: list[Message] = []
    try:
        message = Message("sent", {"secret": "only on the wire encrypted"})
        driver.send(message)
        deadline = time.monotonic() + REFUSAL_S  # a worker that never gets it fails, not hangs
        Worker(
            driver,
            {"sent": handled.append},
            handle_signals=False,
            stop_when=lambda: bool(handled) or time.monotonic() > deadline,
        ).run()
        assert [m.id for m in handled] == [message.id]
        return handled[0], repr(driver)
    finally:
        driver.teardown()  # type: ignore[attr-defined]
        driver.close()


# TLS certificates (trustme) ---------------------------------------------------


def write_certificates(tmp: Path, ca: Any, cert: Any) -> tuple[Path, Path, Path]:
    """PEM files in ``tmp``: the CA's certificate, the server's and its key."""
    ca_path, cert_path, key_path = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    ca.cert_pem.write_to_path(str(ca_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    return ca_path, cert_path, key_path


def expired_certificate(ca: Any, host: str = "127.0.0.1") -> Any:
    """A certificate from ``ca`` for ``host`` that expired yesterday."""
    now = datetime.datetime.now(datetime.UTC)
    return ca.issue_cert(
        host,
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )


def other_ca_file(tmp: Path) -> Path:
    """The certificate of a CA that signed nothing the test serves, as a PEM file."""
    import trustme

    path = tmp / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


def walk_pages(browser: Any, limit: int, max_bytes: int) -> list[list[bytes | str]]:
    """Every page of ``browser`` (a ``QueueBrowser``), following ``next`` from the start:
    the bodies of each page. Fails on a page past 1,000 (a ``next`` that goes round)."""
    pages: list[list[bytes | str]] = []
    after = None
    for _ in range(1000):
        page = browser.page(after, limit, max_bytes)
        pages.append([body for _, body in page.entries])
        if page.next is None:
            return pages
        assert page.next != after, f"the page after {after!r} names itself"
        after = page.next
    raise AssertionError("more than 1,000 pages")
