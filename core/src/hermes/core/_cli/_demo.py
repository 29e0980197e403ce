"""``hermes demo``: the whole Hermes story in seconds, on a temporary queue, with no server.

The queue is a temporary ``file://`` directory, or, when hermes-filesystem is
not installed, an in-process ``memory://`` queue (the output says so and what
to install). The emitter and the worker each have their own driver object on
the same URL (the queue is all they share); the worker runs in a thread of
this process, which is why ``memory://`` can tell the same story.
Everything the worker prints is the real Dispatcher's log. One thing is not as
in production, and the output says so where it happens: retry copies are sent
with their backoff divided by :data:`FAST_FORWARD`, after printing the
``execute_at`` Hermes's retry formula computed.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hermes.core._cli._common import CliError, clock, exception_origin, scheme_installed
from hermes.core.app._dispatcher import Dispatcher
from hermes.core.app._emitter import Emitter
from hermes.core.app._handler import RetryableHandler, RetryMixin
from hermes.core.model._message import Message
from hermes.core.run._worker import Worker
from hermes.core.spi._driver import DEFAULT_PRIORITY, Delay, Driver
from hermes.core.spi._registry import connect
from hermes.core.spi._shutdown import SharedFileShutdown
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands

#: Retry copies are due this many times sooner than Hermes's backoff says.
FAST_FORWARD = 20
#: How far in the future the delayed message is due.
DELAY_S = 5.0
#: The handler of ``invoice.send`` fails this many times before it succeeds.
INVOICE_FAILURES = 2
#: Longest wait for any step; the demo fails (exit 1) rather than hang.
STEP_DEADLINE_S = 30.0

HIGH, LOW = 200, 50

#: The demo's last words: the same story with the user's own worker, copy-pasteable.
YOUR_TURN = r"""
Your turn, in a directory of your own (the queue goes to ./hermes-queue):{path}
  printf 'from hermes.core import EchoHandler\nHANDLERS = {"order.paid": EchoHandler()}\n' > jobs.py
  hermes emit order.paid '{"amount": 10}'
  hermes worker --handlers jobs:HANDLERS --max-items 1
"""

#: (id, amount, priority) in the order they are emitted.
ORDERS = [
    ("order-1", 12.5, LOW),
    ("order-2", 99.0, HIGH),
    ("order-3", 40.0, DEFAULT_PRIORITY),
    ("order-4", 7.25, LOW),
    ("order-5", 25.0, HIGH),
    ("order-6", 60.0, DEFAULT_PRIORITY),
]


@dataclass
class _Story:
    """The narrator, and what the handlers did (read by the main thread)."""

    changed: threading.Condition = field(default_factory=threading.Condition)
    orders_handled: list[str] = field(default_factory=list)
    invoice_attempts: int = 0
    invoice_done: bool = False
    #: Hermes's backoff of each retry, seconds after the failure.
    backoffs: list[float] = field(default_factory=list)
    #: (due, ran) of the delayed message.
    report: tuple[float, float] | None = None
    worker_error: BaseException | None = None
    _print_lock: threading.Lock = field(default_factory=threading.Lock)

    def say(self, who: str, text: str, at: float | None = None) -> None:
        stamp = clock(time.time() if at is None else at, millis=True)
        self.write(f"{stamp}  {who:<7} {text}")

    def heading(self, text: str) -> None:
        self.write(f"\n{text}")

    def write(self, line: str) -> None:
        """One whole line at a time: the worker thread writes too."""
        with self._print_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def update(self, change: Callable[[], None]) -> None:
        with self.changed:
            change()
            self.changed.notify_all()

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + STEP_DEADLINE_S
        with self.changed:
            while not done() and self.worker_error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _DemoFailed(f"{what} did not happen within {STEP_DEADLINE_S:.0f} s")
                self.changed.wait(min(left, 0.05))
        if self.worker_error is not None:
            raise _DemoFailed(f"the worker failed: {self.worker_error}")


class _DemoFailed(Exception):
    pass


class _OrderPaid:
    def __init__(self, story: _Story) -> None:
        self.story = story

    def handle(self, message: Message) -> bool:
        self.story.say("handler", f"{message.id}: {message.payload['amount']:.2f} EUR paid")
        self.story.update(lambda: self.story.orders_handled.append(message.id))
        return True


class MailServerBusy(Exception):
    pass


class InvoiceMailer(RetryMixin, RetryableHandler):
    """Fails the first :data:`INVOICE_FAILURES` attempts, like a mail server that is busy."""

    def __init__(self, story: _Story) -> None:
        self.story = story

    def handle(self, message: Message) -> bool:
        attempt = message.retries + 1
        self.story.update(lambda: setattr(self.story, "invoice_attempts", attempt))
        if message.retries < INVOICE_FAILURES:
            self.story.say("handler", f"{message.id} attempt {attempt}: mail server busy, raising")
            raise MailServerBusy(f"mail server busy (attempt {attempt})")
        self.story.say("handler", f"{message.id} attempt {attempt}: invoice sent")
        self.story.update(lambda: setattr(self.story, "invoice_done", True))
        return True


class _DailyReport:
    def __init__(self, story: _Story) -> None:
        self.story = story

    def handle(self, message: Message) -> bool:
        ran = time.time()
        due = message.execute_at if message.execute_at is not None else message.created
        self.story.say("handler", f"{message.id} ran {_relative(ran, due)}", at=ran)
        self.story.update(lambda: setattr(self.story, "report", (due, ran)))
        return True


def _relative(ran: float, due: float) -> str:
    when = "after" if ran >= due else "BEFORE"
    return f"{abs(ran - due):.3f} s {when} its execute_at {clock(due, millis=True)}"


class _FastForwardDispatcher(Dispatcher):
    """Computes each retry's ``execute_at`` with Hermes's formula, prints it, and sends
    the copy due :data:`FAST_FORWARD` times sooner so the demo ends in seconds."""

    story: _Story

    def next_retry(self, message: Message) -> float:
        now = time.time()
        due = super().next_retry(message)
        backoff = due - now
        r = message.retries
        low, high = r**4 + 15 + 1 * (r + 1), r**4 + 15 + 30 * (r + 1)
        self.story.backoffs.append(backoff)
        self.story.say(
            "retry",
            f"#{message.id} retry {r + 1}: backoff for retries={r} ({low}..{high} s) "
            f"is {backoff:.1f} s -> execute_at {clock(due, millis=True)}",
            at=now,
        )
        fast = now + backoff / FAST_FORWARD
        self.story.say(
            "retry",
            f"demo fast-forward /{FAST_FORWARD}: copy sent with execute_at "
            f"{clock(fast, millis=True)} (+{backoff / FAST_FORWARD:.2f} s); "
            f"a real worker would wait the full {backoff:.1f} s",
            at=now,
        )
        return fast


class _WorkerLines(logging.Handler):
    """The Dispatcher's log records as demo lines; exceptions summarised on the line."""

    def __init__(self, story: _Story) -> None:
        super().__init__(logging.INFO)
        self.story = story

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text = f"{text} [{exception_origin(record.exc_info[1])}]"
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        line = f"{clock(record.created, millis=True)}  worker  {level}{text}"
        self.story.write(redact_url(line))


#: Printed when hermes-filesystem is missing and the demo runs on ``memory://``.
MEMORY_NOTE = (
    "hermes-filesystem is not installed, so the queue lives in this process's memory; "
    "`pip install hermes-filesystem` for the ./hermes-queue directory that `hermes emit` "
    "and `hermes worker` share by default."
)
#: The first suggested command when hermes-filesystem is missing.
INSTALL_FILESYSTEM = (
    "\n  pip install hermes-filesystem   # the ./hermes-queue directory queue, no server"
)


def add_parser(commands: Commands) -> None:
    """``hermes demo``: only ``--url``."""
    demo = commands.add_parser(
        "demo",
        help="the whole story on a temporary queue, no server",
        description="Emit, priorities, a failing handler retried with backoff and a delayed "
        "message, on a temporary file:// queue (memory:// in this process when "
        "hermes-filesystem is not installed); finishes in seconds.",
    )
    demo.add_argument(
        "--url",
        help="run it on this broker instead (needs priorities and native delay; "
        "default: a temporary file:// queue, else memory://)",
    )
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="hermes-demo-"))
    try:
        if args.url:
            return _tell(args.url, workdir / "shutdown")
        if scheme_installed("file"):
            return _tell((workdir / "queue").as_uri(), workdir / "shutdown")
        return _tell(f"memory://{workdir.name}", workdir / "shutdown", note=MEMORY_NOTE)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _open(url: str) -> tuple[Driver, Driver]:
    """The emitter's and the worker's drivers on ``url``, once it has what the demo shows."""
    emit_driver = connect(url)
    worker_driver = connect(url)
    caps = emit_driver.capabilities
    if not caps.priorities or caps.delay is not Delay.NATIVE:
        emit_driver.close()
        worker_driver.close()
        raise CliError(
            f"the demo needs a driver with priorities and native delay; {redact_url(url)} has "
            f"priorities={'yes' if caps.priorities else 'no'}, delay={caps.delay.value}"
        )
    return emit_driver, worker_driver


def _introduce(url: str, driver: Driver, note: str | None) -> None:
    print(
        "Hermes demo: emit, priorities, a failing handler retried with backoff and a delayed "
        "message, with no server."
    )
    print(
        f"Queue: {redact_url(url)} ({type(driver).__name__}, {driver.capabilities.delivery.value})"
    )
    if note:
        print(note)
    print(
        "The emitter and the worker each have their own driver on it: the queue is all they share."
    )


def _worker_logger(story: _Story) -> tuple[logging.Logger, _WorkerLines]:
    log_handler = _WorkerLines(story)
    worker_logger = logging.getLogger("hermes.demo.worker")
    worker_logger.addHandler(log_handler)
    worker_logger.setLevel(logging.INFO)
    worker_logger.propagate = False
    return worker_logger, log_handler


def _tell(url: str, shutdown_file: Path, note: str | None = None) -> int:
    started = time.time()
    story = _Story()
    emit_driver, worker_driver = _open(url)
    _introduce(url, emit_driver, note)
    worker_logger, log_handler = _worker_logger(story)
    quiet = logging.getLogger("hermes.demo.emitter")
    quiet.setLevel(logging.WARNING)

    shutdown = SharedFileShutdown(shutdown_file)
    dispatcher = _FastForwardDispatcher(worker_driver, worker_logger, shutdown=shutdown)
    dispatcher.story = story
    dispatcher.register_handler("order.paid", _OrderPaid(story))
    dispatcher.register_handler("invoice.send", InvoiceMailer(story))
    dispatcher.register_handler("report.daily", _DailyReport(story))

    def work() -> None:
        try:
            Worker(worker_driver, dispatcher).run()
        except BaseException as exc:  # reported by the main thread, which exits 1
            error = exc
            story.update(lambda: setattr(story, "worker_error", error))

    worker = threading.Thread(target=work, name="hermes-demo-worker", daemon=True)
    try:
        for driver in (emit_driver, worker_driver):
            driver.setup_priority_queue("high", HIGH)
            driver.setup_priority_queue("low", LOW)
        emitter = Emitter(emit_driver, quiet)

        story.heading(
            f"1. Six orders at priorities {HIGH}, {DEFAULT_PRIORITY} and {LOW}, "
            "emitted before any worker runs"
        )
        for order_id, amount, priority in ORDERS:
            story.say("emit", f"#{order_id} (order.paid) priority:{priority}")
            emitter.emit(Message("order.paid", {"amount": amount}, id=order_id), priority)

        story.heading(f"2. A worker starts: highest priority first, {_order_within(url)}")
        worker.start()
        # The Dispatcher counts a message after its last log line: wait for the count.
        stats = dispatcher.stats
        story.wait_for(lambda: stats.handled == len(ORDERS), "handling the six orders")

        story.heading(
            f"3. A handler that fails {INVOICE_FAILURES} times, retried by the Dispatcher with "
            f"Hermes's backoff; and a message delayed by {DELAY_S:.0f} s"
        )
        due = time.time() + DELAY_S
        story.say(
            "emit",
            f"#report-1 (report.daily) priority:{DEFAULT_PRIORITY}, "
            f"execute_at {clock(due, millis=True)} (in {DELAY_S:.1f} s)",
        )
        emitter.emit(Message("report.daily", {"day": "today"}, id="report-1", execute_at=due))
        story.say("emit", f"#invoice-1 (invoice.send) priority:{DEFAULT_PRIORITY}")
        emitter.emit(Message("invoice.send", {"order": "order-2"}, id="invoice-1"))
        story.wait_for(lambda: story.invoice_done, "the invoice's third attempt")
        story.wait_for(lambda: story.report is not None, "the delayed report")
        story.wait_for(lambda: stats.handled == len(ORDERS) + 2, "the last End handle line")

        story.heading("4. Stop the worker as `hermes shutdown --file F` does")
        shutdown.shutdown()
        story.say("demo", f"touched {shutdown_file}")
        worker.join(STEP_DEADLINE_S)
        if worker.is_alive():
            raise _DemoFailed("the worker did not stop after the shutdown request")
    except _DemoFailed as exc:
        print(f"\nhermes demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if worker.is_alive():
            shutdown.shutdown()
            worker.join(5)
        worker_logger.removeHandler(log_handler)
        emit_driver.close()
        worker_driver.close()

    _summary(story, dispatcher, time.time() - started, install_filesystem=note is not None)
    return 0


def _order_within(url: str) -> str:
    """The order within one priority, which is the driver's, not Hermes's."""
    scheme = url.partition("://")[0]
    if scheme in ("redis", "rediss"):
        return "in no particular order within one (a Redis set keeps no order within a priority)"
    return (
        f"first in first out within one on this {scheme}:// queue (a Redis set keeps no "
        "order within a priority)"
    )


def _summary(
    story: _Story, dispatcher: Dispatcher, elapsed: float, *, install_filesystem: bool
) -> None:
    priority_of = {order_id: priority for order_id, _, priority in ORDERS}
    expected = [order_id for order_id, _, _ in sorted(ORDERS, key=lambda row: -row[2])]
    verdict = (
        "highest priority first, FIFO within a priority on this queue"
        if story.orders_handled == expected
        else f"NOT the expected {', '.join(expected)}"
    )
    handled = ", ".join(f"{o} ({priority_of[o]})" for o in story.orders_handled)
    backoffs = " and ".join(f"{b:.1f} s" for b in story.backoffs)
    assert story.report is not None
    due, ran = story.report
    stats = dispatcher.stats
    print(f"\nSummary ({elapsed:.1f} s)")
    print(f"  orders handled: {handled}: {verdict}")
    print(
        f"  invoice-1: {story.invoice_attempts} attempts; the backoff put the retries "
        f"{backoffs} after each failure (sent {FAST_FORWARD}x sooner in this demo)"
    )
    print(f"  report-1: held back, then handled {_relative(ran, due)}")
    print(
        f"  Dispatcher.stats: received {stats.received}, handled {stats.handled}, "
        f"failed {stats.failed}, retried {stats.retried}"
    )
    first = _path_hint() + (INSTALL_FILESYSTEM if install_filesystem else "")
    print(YOUR_TURN.replace("{path}", first), end="")


def _path_hint() -> str:
    """A line that puts this ``hermes`` on PATH, when ``hermes`` there is another one or none."""
    script = Path(sys.argv[0]).resolve()
    if script.name != "hermes":
        return ""  # run as `python -m hermes.core.cli`: no script to point at
    found = shutil.which("hermes")
    if found is not None and Path(found).resolve() == script:
        return ""
    return f'\n  export PATH="{script.parent}:$PATH"   # puts this hermes on your PATH'
