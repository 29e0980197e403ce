"""What the kit's tests share: time bounds, in-process and subprocess workers, checks.

Every test gets a :class:`Kit` (the ``hermes_kit`` fixture). The kit owns a
namespace of its own on the broker -- ``isolated_url(URL, namespace)``, the
driver plugin's ``isolate`` -- and everything the test creates there: driver
objects (each one ``connect(kit.url)``), worker threads, worker processes. When
the test ends it stops the workers, closes the drivers and calls ``teardown()``
on a fresh driver object when the driver has it (:class:`SupportsTeardown`);
each of those steps is bounded (STOP_S, CLOSE_S), and a call that outlives its
bound fails the test naming the call and the line it is stuck on.

Time: every bound below is in seconds and multiplied by ``HERMES_KIT_TIME_SCALE``
(default 1.0) before use. The kit waits by polling to a deadline; the only
fixed-length waits are the "must not arrive" windows of :func:`stays_false`,
which can only ever make a test pass later, never fail it.
"""

from __future__ import annotations

import collections
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, runtime_checkable

import pytest

from hermes.conformance import TIME_SCALE_ENV
from hermes.conformance._worker import JOB, Record, read_records
from hermes.core import (
    DEFAULT_PRIORITY,
    Dispatcher,
    Emitter,
    Handler,
    Message,
    Shutdown,
    available_drivers,
    connect,
    redact_url,
)
from hermes.core import Worker as HermesWorker
from hermes.core.driver import (
    Capabilities,
    Consumer,
    Driver,
    DriverPlugin,
    DriverUrl,
    Received,
    SupportsTeardown,
)
from hermes.core.drivertools import isolated_url

#: A message sent to a running worker (or before it starts) is handled within this.
DELIVERY_S = 10.0
#: A worker subprocess imports, connects and starts handling within this.
WORKER_START_S = 20.0
#: A worker returns from ``handle()`` within this after it was asked to stop
#: (generous: the shutdown tests check the tighter bound, SHUTDOWN_S).
STOP_S = 10.0
#: A SharedFileShutdown stops an idle worker within this (drivers check it before
#: every idle wait, and no idle wait lasts longer than about a second).
SHUTDOWN_S = 2.0
#: The "must not arrive" window: how long the kit watches for a message that
#: must not be delivered (on top of the driver's declared redelivery time).
QUIET_S = 1.0
#: ``delay=NATIVE``: a message is delivered at most this long after ``execute_at``.
DELAY_LATE_S = 5.0
#: ``delay=NATIVE``: how early before ``execute_at`` a delivery is still on time
#: (timestamps on the broker are often milliseconds). Not scaled.
EARLY_TOLERANCE_S = 0.1
#: A driver's ``close()`` and ``teardown()`` return within this (the kit's cleanup).
CLOSE_S = 10.0
#: A running worker's view of the queues is at most this old: a message sent
#: this long ago is among those its next receive chooses from.
FRESH_S = 1.0
#: How many messages a consumer may hold taken ahead of its handler (an SQS
#: receive batch): the slack of the priority checks on a running worker.
TAKEN_AHEAD = 10

#: A handler that runs this long is overtaken: core's worker hands the consumer
#: to another of its threads, which receives the next message meanwhile (it
#: waits about a millisecond), so this handler's settle comes from a thread
#: that is no longer the one receiving.
OVERTAKEN_S = 0.05

_NAMESPACE_LENGTH = 48
_POLL_S = 0.02


@runtime_checkable
class SupportsDropConnection(Protocol):
    """Optional, for the kit alone: drop this driver object's broker connections.

    As a server restart or an idle timeout would: close the sockets under the
    client without telling it, so the next call finds them gone. Messages the
    broker handed out on them follow its rules (returned, or kept under a
    lease); the driver must reconnect and lose nothing. A driver without it
    is checked through ``--hermes-drop-connection COMMAND``, or not at all.
    """

    def drop_connection(self) -> None: ...


# Time ------------------------------------------------------------------------


def time_scale() -> float:
    """The factor from ``HERMES_KIT_TIME_SCALE`` (default 1.0); raises ValueError if bad."""
    raw = os.environ.get(TIME_SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        scale = -1.0
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"{TIME_SCALE_ENV}={raw!r} must be a number > 0, e.g. 2 on a slow machine")
    return scale


def scaled(seconds: float) -> float:
    """``seconds`` times ``HERMES_KIT_TIME_SCALE``."""
    return seconds * time_scale()


def wait_until(predicate: Callable[[], object], timeout_s: float, *, scale: bool = True) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` (scaled) passed; its last truth.

    ``scale=False`` for a span the broker measures (a lease, a visibility
    timeout): the kit's time scale does not change how long those last.
    """
    deadline = time.monotonic() + (scaled(timeout_s) if scale else timeout_s)
    pause = 0.001  # fast drivers answer in a millisecond; slow ones are polled every 20 ms
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(pause)
        pause = min(pause * 2, _POLL_S)


def stays_false(predicate: Callable[[], object], window_s: float, *, scale: bool = True) -> bool:
    """True if ``predicate`` stays false for the whole window (``window_s`` scaled).

    The "must not arrive" check: a fixed-length wait by design. It returns as
    soon as the predicate turns true, so it never makes a test slower to fail.
    """
    return not wait_until(predicate, window_s, scale=scale)


def wait_for_progress(count: Callable[[], int], target: int, idle_s: float) -> bool:
    """Poll until ``count() >= target``; give up only after ``idle_s`` (scaled) without progress.

    For big batches on slow brokers: a deadline on progress, not on the total.
    """
    idle = scaled(idle_s)
    last, last_change = count(), time.monotonic()
    while last < target:
        time.sleep(_POLL_S)
        now_count = count()
        if now_count != last:
            last, last_change = now_count, time.monotonic()
        elif time.monotonic() - last_change >= idle:
            return False
    return True


def wait_quiet(count: Callable[[], int], quiet_s: float, timeout_s: float) -> bool:
    """Poll until ``count()`` did not change for ``quiet_s`` (scaled); false after ``timeout_s``."""
    deadline = time.monotonic() + scaled(timeout_s)
    quiet = scaled(quiet_s)
    last, last_change = count(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(_POLL_S)
        now_count = count()
        if now_count != last:
            last, last_change = now_count, time.monotonic()
        elif time.monotonic() - last_change >= quiet:
            return True
    return False


# Calls that may hang ------------------------------------------------------------


_PACKAGE_DIR = Path(__file__).resolve().parent
_STDLIB_DIR = Path(threading.__file__).resolve().parent


def where(thread: threading.Thread) -> str:
    """The line ``thread`` is stuck on: its innermost frames outside the kit and the
    standard library (up to three, innermost last), and the innermost frame of all."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "(the thread has ended)"
    return where_frame(frame)


def where_frame(frame: FrameType) -> str:
    """:func:`where` for a frame: the line a stack is stuck on."""
    frames = traceback.extract_stack(frame)

    def own(f: traceback.FrameSummary) -> bool:
        path = Path(f.filename).resolve()
        if path.is_relative_to(_PACKAGE_DIR):
            return False
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            return True
        return not path.is_relative_to(_STDLIB_DIR)

    def describe(f: traceback.FrameSummary) -> str:
        return f"{Path(f.filename).name}:{f.lineno} {f.name}()"

    kept = [f for f in frames if own(f)][-3:] or frames[-3:]
    text = " -> ".join(describe(f) for f in kept)
    if kept[-1] is not frames[-1]:
        text += f", waiting in {describe(frames[-1])}"
    return text


def call_within(what: str, call: Callable[[], object], timeout_s: float, about: str = "") -> None:
    """Run ``call`` on a daemon thread; raise if it raises, or is still running after
    ``timeout_s`` (scaled) -- naming ``what``, the line it is stuck on, and ``about``
    (the driver, say: last, as it can be long).

    A call that never returns is left behind on its daemon thread: the kit
    cannot stop it, only refuse to wait for it.
    """
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # raised below, on the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"kit: {what}", daemon=True)
    thread.start()
    thread.join(scaled(timeout_s))
    if thread.is_alive():
        raise AssertionError(
            f"{what} did not return within {scaled(timeout_s):.1f} s (scaled); it is stuck "
            f"in {where(thread)}{f' ({about})' if about else ''}"
        )
    if errors:
        raise errors[0]


# Names -----------------------------------------------------------------------


def namespace_for(test_name: str) -> str:
    """``[a-z0-9-]``, at most 48 characters: the test's name plus a random suffix."""
    name = test_name.removeprefix("test_").lower()
    name = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "test"
    suffix = secrets.token_hex(4)
    name = name[: _NAMESPACE_LENGTH - len(suffix) - 1].rstrip("-")
    return f"{name}-{suffix}"


# What was delivered ------------------------------------------------------------


@dataclass(frozen=True)
class Delivered:
    """One call of a driver's callback, as an in-process worker saw it."""

    message: Message
    #: The priority the driver passed to the callback.
    priority: int
    #: ``time.time()`` when the callback started.
    at: float
    #: The name of the worker (thread) that received it.
    worker: str
    #: The handler thread that ran the callback (``threading.get_ident()``).
    thread: int = 0


class Ledger:
    """Every delivery the in-process workers of one test saw, in order. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[Delivered] = []

    def add(self, entry: Delivered) -> None:
        with self._lock:
            self._entries.append(entry)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def entries(self, after: int = 0) -> list[Delivered]:
        with self._lock:
            return self._entries[after:]

    def of(self, message_id: str, after: int = 0) -> list[Delivered]:
        """The deliveries of ``message_id`` (from position ``after`` on)."""
        return [e for e in self.entries(after) if e.message.id == message_id]

    def has(self, message_id: str, after: int = 0) -> bool:
        return bool(self.of(message_id, after))

    def ids(self) -> list[str]:
        return [e.message.id for e in self.entries()]

    def distinct(self) -> int:
        return len(set(self.ids()))


@dataclass(frozen=True)
class TotalQueue:
    """Jepsen's total-queue check: what was sent against what came out.

    ``lost`` = attempted - delivered, ``unexpected`` = delivered - attempted,
    ``duplicated`` = ids delivered more than once (with their counts).
    """

    attempted: frozenset[str]
    delivered: collections.Counter[str]

    @classmethod
    def of(cls, attempted: Iterable[str], delivered: Iterable[str]) -> TotalQueue:
        return cls(frozenset(attempted), collections.Counter(delivered))

    @property
    def lost(self) -> set[str]:
        return set(self.attempted - self.delivered.keys())

    @property
    def unexpected(self) -> set[str]:
        return set(self.delivered.keys() - self.attempted)

    @property
    def duplicated(self) -> dict[str, int]:
        return {id_: n for id_, n in self.delivered.items() if n > 1}

    def summary(self) -> str:
        return (
            f"attempted={len(self.attempted)} delivered={sum(self.delivered.values())} "
            f"lost={len(self.lost)} duplicated={len(self.duplicated)} "
            f"unexpected={len(self.unexpected)}"
        )


def fields(message: Message) -> tuple[Any, ...]:
    """Every field of ``message``, for comparisons whose diff names the field."""
    return (
        ("id", message.id),
        ("type", message.type),
        ("payload", message.payload),
        ("created", message.created),
        ("execute_at", message.execute_at),
        ("retries", message.retries),
    )


# In-process workers ------------------------------------------------------------


class _Ok:
    """The kit's default handler: succeeds."""

    def handle(self, message: Message) -> bool:
        return True


class KitDispatcher(Dispatcher):
    """A Dispatcher that writes every delivery into a :class:`Ledger` first.

    A message of a type without handlers is recorded and succeeds quietly: the
    kit tests drivers, and round trips use arbitrary types.
    """

    def __init__(
        self,
        driver: Driver,
        ledger: Ledger,
        name: str,
        shutdown: Shutdown,
        concurrency: int = 1,
        grace_s: float = 30.0,
    ) -> None:
        super().__init__(driver, shutdown=shutdown, concurrency=concurrency, grace_s=grace_s)
        self.ledger = ledger
        self.name = name

    def handle_message(self, message: Message, priority: int) -> bool:
        delivered = Delivered(message, priority, time.time(), self.name, threading.get_ident())
        self.ledger.add(delivered)
        if not self.handlers(message.type):
            return True
        return super().handle_message(message, priority)


class _StopOrUser:
    """Stops when the kit says so or when the test's own Shutdown does."""

    def __init__(self, stop: threading.Event, user: Shutdown | None) -> None:
        self.stop = stop
        self.user = user

    def should_shutdown(self, start_time: float) -> bool:
        if self.stop.is_set():
            return True
        return self.user is not None and self.user.should_shutdown(start_time)

    def shutdown(self, at: float | None = None) -> bool:
        self.stop.set()
        return True


class Worker:
    """A :class:`KitDispatcher` running ``handle()`` in a daemon thread on its own driver."""

    def __init__(
        self,
        driver: Driver,
        ledger: Ledger,
        *,
        name: str,
        handlers: Mapping[str, Sequence[Handler]],
        priorities: Sequence[int] = (),
        shutdown: Shutdown | None = None,
        dispatcher_class: type[KitDispatcher] = KitDispatcher,
        concurrency: int = 1,
        grace_s: float = 30.0,
        max_items: int = 0,
    ) -> None:
        self.driver = driver
        #: The run returns after this many messages (0: no limit).
        self.max_items = max_items
        self.name = name
        self.priorities = tuple(priorities)
        self._stop = threading.Event()
        #: ``time.monotonic()`` of the first request to stop.
        self._stop_asked_at = 0.0
        self.dispatcher = dispatcher_class(
            driver, ledger, name, _StopOrUser(self._stop, shutdown), concurrency, grace_s
        )
        for type_, type_handlers in handlers.items():
            self.dispatcher.register_handlers(type_, type_handlers)
        #: What escaped ``handle()``, if anything did.
        self.error: BaseException | None = None
        self._checked = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            HermesWorker(
                self.dispatcher.driver,
                self.dispatcher,
                priorities=self.priorities,
                max_items=self.max_items,
            ).run()
        except BaseException as exc:  # kept for the test to inspect; see stop()
            self.error = exc

    def start(self) -> Worker:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> bool:
        """Wait (``timeout_s`` scaled) for ``handle()`` to return by itself; True if it did."""
        self._thread.join(scaled(timeout_s))
        return not self._thread.is_alive()

    def ask_to_stop(self) -> None:
        """Ask ``handle()`` to return; do not wait."""
        if not self._stop.is_set():
            self._stop_asked_at = time.monotonic()
            self._stop.set()

    def stop(self, timeout_s: float = STOP_S, *, expect: type[BaseException] | None = None) -> None:
        """Ask ``handle()`` to return, wait, and raise what escaped it (unless ``expect``-ed)."""
        self.ask_to_stop()
        if self._thread.ident is not None and not self.join(timeout_s):
            raise AssertionError(
                f"handle() still runs {time.monotonic() - self._stop_asked_at:.1f} s after a "
                f"shutdown request; it is stuck in {where(self._thread)} ({self.name} on "
                f"{self.driver!r}): the loop must check the shutdown before every receive, "
                "and no receive, ack, release or close may block longer than about a second"
            )
        self.check(expect)

    def check(self, expect: type[BaseException] | None = None) -> None:
        """Raise what escaped ``handle()``, unless it is an ``expect`` instance (once)."""
        error = self.error
        if error is None or self._checked:
            return
        self._checked = True
        if not (expect is not None and isinstance(error, expect)):
            raise AssertionError(
                f"handle() raised {error!r} ({self.name} on {self.driver!r})"
            ) from error


class Sleeps:
    """A handler that takes ``seconds`` (long enough to be overtaken, by default), then succeeds."""

    def __init__(self, seconds: float = OVERTAKEN_S) -> None:
        self.seconds = seconds

    def handle(self, message: Message) -> bool:
        time.sleep(self.seconds)
        return True


class _Watched(Consumer):
    """A driver's consumer, with the thread of each ``receive`` and each settle written down."""

    def __init__(self, inner: Consumer, threads: ReceivingThreads) -> None:
        self.inner = inner
        self.threads = threads

    def receive(self, timeout_s: float) -> Received | None:
        self.threads.add(threading.get_ident())
        try:
            return self.inner.receive(timeout_s)
        finally:
            self.threads.returned(threading.get_ident())

    def ack(self, received: Received) -> None:
        self.threads.settling(threading.get_ident())
        self.inner.ack(received)

    def release(self, received: Received) -> None:
        self.threads.settling(threading.get_ident())
        self.inner.release(received)

    def reject(self, received: Received, reason: str) -> None:
        self.threads.settling(threading.get_ident())
        self.inner.reject(received, reason)

    def close(self) -> None:
        self.inner.close()


class ReceivingThreads:
    """The threads that call ``receive`` on the consumers ``driver`` makes from now on.

    Core's worker gives the consumer to whichever of its handler threads is
    free: a row that means to settle off the receiving thread makes its
    handler wait until another thread received (:meth:`wait_for_other`).
    The settles are counted too, and those made while another thread was
    inside a receive (:meth:`settles`): a client that is not thread-safe
    garbles exactly those.
    """

    def __init__(self, driver: Driver) -> None:
        self._lock = threading.Lock()
        self._idents: list[int] = []
        #: The threads inside a ``receive`` now.
        self._receiving: set[int] = set()
        #: Settles made so far, and those made while another thread was inside a receive.
        self._settles = 0
        self._settles_beside_receive = 0
        make = driver.consumer

        def consumer(priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
            return _Watched(make(priorities, concurrency=concurrency), self)

        driver.consumer = consumer  # type: ignore[method-assign]

    def add(self, ident: int) -> None:
        with self._lock:
            self._receiving.add(ident)
            if not self._idents or self._idents[-1] != ident:
                self._idents.append(ident)

    def returned(self, ident: int) -> None:
        with self._lock:
            self._receiving.discard(ident)

    def settling(self, ident: int) -> None:
        with self._lock:
            self._settles += 1
            if self._receiving - {ident}:
                self._settles_beside_receive += 1

    def settles(self) -> tuple[int, int]:
        """Settles made so far, and how many of them while another thread received."""
        with self._lock:
            return self._settles, self._settles_beside_receive

    def distinct(self) -> int:
        """How many threads have received so far."""
        with self._lock:
            return len(set(self._idents))

    def last(self) -> int | None:
        with self._lock:
            return self._idents[-1] if self._idents else None

    def wait_for_other(self, timeout_s: float) -> bool:
        """Wait until a thread other than the calling one received last; True if one did."""
        me = threading.get_ident()
        return wait_until(lambda: self.last() not in (None, me), timeout_s)


# Worker processes --------------------------------------------------------------


class WorkerProcess:
    """``python -m hermes.conformance._worker`` on the test's URL; see that module."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self.pid = self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code, waiting up to ``timeout_s`` (scaled); None if it still runs."""
        try:
            return self._proc.wait(scaled(timeout_s))
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL: the worker gets no chance to ack, nack or close anything."""
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)
        self._proc.wait()

    def ask_to_stop(self) -> None:
        """SIGTERM: the worker finishes the message in progress and exits."""
        if self.alive:
            self._proc.terminate()

    def output(self, limit: int = 3000) -> str:
        """The end of what the worker wrote to stdout and stderr."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return redact_url(text[-limit:])

    def __repr__(self) -> str:
        return f"<worker process {self.pid}>"


# The target and the per-test kit -----------------------------------------------


@dataclass(frozen=True)
class Target:
    """The driver under test, as ``--hermes-url`` names it."""

    url: str
    plugin: DriverPlugin
    #: What a driver built from ``url`` declares (read from a driver object).
    capabilities: Capabilities
    driver_class: str
    #: Plugin modules the worker processes register (``--hermes-plugin``).
    plugins: tuple[str, ...] = ()

    @property
    def redacted(self) -> str:
        return redact_url(self.url)

    @classmethod
    def probe(cls, url: str, plugins: tuple[str, ...] = ()) -> Target:
        """Build one driver on a namespace of its own to read its capabilities, then clean up."""
        scheme = DriverUrl.parse(url).scheme
        plugin = next(p for p in available_drivers() if scheme in p.schemes)
        driver = connect(isolated_url(url, namespace_for("probe")))
        try:
            capabilities, driver_class = driver.capabilities, type(driver).__name__
            if isinstance(driver, SupportsTeardown):
                call_within("teardown()", driver.teardown, CLOSE_S, f"probing {driver!r}")
        finally:
            call_within("close()", driver.close, CLOSE_S, f"probing {driver!r}")
        return cls(url, plugin, capabilities, driver_class, plugins)


class Kit:
    """One test's namespace on the broker and everything the test runs there."""

    def __init__(self, target: Target, node: pytest.Item, tmp_path: Path) -> None:
        self.target = target
        self.capabilities = target.capabilities
        self.namespace = namespace_for(node.name.split("[")[0])
        #: The URL of this test's own queues.
        self.url = isolated_url(target.url, self.namespace)
        #: Deliveries seen by this test's in-process workers.
        self.ledger = Ledger()
        #: Lines written by this test's worker processes.
        self.record_path = tmp_path / "records.tsv"
        self.tmp_path = tmp_path
        self._node = node
        self._priority_queues: dict[str, int] = {}
        self._drivers: list[Driver] = []
        self._workers: list[Worker] = []
        self._processes: list[WorkerProcess] = []
        self._scripts: list[subprocess.Popen[str]] = []
        self._sender: Driver | None = None
        self._default_worker: Worker | None = None
        self._pid = os.getpid()

    # Drivers and messages

    def driver(self) -> Driver:
        """A new ``connect(kit.url)`` with this test's priority queues set up; closed at the end."""
        driver = connect(self.url)
        self._drivers.append(driver)
        for name, priority in self._priority_queues.items():
            driver.setup_priority_queue(name, priority)
        return driver

    @property
    def sender(self) -> Driver:
        """The driver object this test emits through (made on first use)."""
        if self._sender is None:
            self._sender = self.driver()
        return self._sender

    def emit(self, message: Message, priority: int = DEFAULT_PRIORITY) -> Message:
        """``Emitter(kit.sender).emit(message, priority)``; returns ``message``."""
        Emitter(self.sender).emit(message, priority)
        return message

    def setup_priority_queue(self, name: str, priority: int) -> None:
        """Set the queue up on every driver object of this test, now and later."""
        for driver in self._drivers:
            driver.setup_priority_queue(name, priority)
        self._priority_queues[name] = priority

    @staticmethod
    def message(n: int, **fields: Any) -> Message:
        """A message of the kit's type with payload ``{"n": n}``."""
        return Message(JOB, {"n": n}, **fields)

    # Workers

    def worker(
        self,
        *,
        handlers: Mapping[str, Sequence[Handler]] | None = None,
        priorities: Sequence[int] = (),
        shutdown: Shutdown | None = None,
        driver: Driver | None = None,
        dispatcher_class: type[KitDispatcher] = KitDispatcher,
        start: bool = True,
        concurrency: int = 1,
        grace_s: float = 30.0,
        max_items: int = 0,
    ) -> Worker:
        """A worker thread on its own driver (``driver`` or a new one), started."""
        worker = Worker(
            driver if driver is not None else self.driver(),
            self.ledger,
            name=f"worker-{len(self._workers) + 1}",
            handlers=handlers if handlers is not None else {JOB: [_Ok()]},
            priorities=priorities,
            shutdown=shutdown,
            dispatcher_class=dispatcher_class,
            concurrency=concurrency,
            grace_s=grace_s,
            max_items=max_items,
        )
        self._workers.append(worker)
        return worker.start() if start else worker

    def default_worker(self) -> Worker:
        """The test's plain worker, started on first use and reused afterwards."""
        if self._default_worker is None:
            self._default_worker = self.worker()
        return self._default_worker

    def spawn_worker(
        self,
        *,
        block: bool = False,
        block_n: int | None = None,
        max_items: int = 0,
        shutdown_file: Path | None = None,
        concurrency: int = 1,
        grace_s: float | None = None,
    ) -> WorkerProcess:
        """A worker process on this test's URL recording into :attr:`record_path`.

        ``block``: every handler records, then sleeps until the process is killed;
        ``block_n``: only the handler of the message whose payload ``n`` is that.
        """
        argv = [
            sys.executable,
            "-m",
            "hermes.conformance._worker",
            self.url,
            str(self.record_path),
        ]
        if block:
            argv.append("--block")
        if block_n is not None:
            argv += ["--block-n", str(block_n)]
        if max_items:
            argv += ["--max-items", str(max_items)]
        if shutdown_file is not None:
            argv += ["--shutdown-file", str(shutdown_file)]
        if concurrency != 1:
            argv += ["--concurrency", str(concurrency)]
        if grace_s is not None:
            argv += ["--grace", str(grace_s)]
        for plugin in self.target.plugins:
            argv += ["--plugin", plugin]
        log = self.tmp_path / f"worker-{len(self._processes) + 1}.log"
        process = WorkerProcess(argv, log)
        self._processes.append(process)
        return process

    def python(self, script: str, *args: str) -> subprocess.Popen[str]:
        """``python -c script args``, its output piped; killed when the test ends.

        The script runs after the ``--hermes-plugin`` modules are registered, as
        in the kit's worker processes, so ``connect(url)`` finds their drivers.
        """
        prelude = (
            "from hermes.conformance._worker import register_plugins\n"
            f"register_plugins({list(self.target.plugins)!r})\n"
        )
        process = subprocess.Popen(
            [sys.executable, "-c", prelude + script, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._scripts.append(process)
        return process

    def records(self) -> list[Record]:
        """The message lines (not status lines) the worker processes wrote so far."""
        return [r for r in read_records(self.record_path) if not r.is_status]

    def statuses(self, pid: int) -> list[str]:
        return [r.id for r in read_records(self.record_path) if r.is_status and r.pid == pid]

    def process_output(self) -> str:
        """The output of every worker process, for assertion messages."""
        return "\n".join(f"--- {p!r}:\n{p.output()}" for p in self._processes)

    # Reporting

    def claim(self, check: str) -> None:
        """Name the branch this test verifies, for the summary (default: the marker's text)."""
        self._node.user_properties.append(("hermes_check", check))

    def require_cross_process(self) -> None:
        """Skip as "not verified" unless worker subprocesses can share the driver's queues."""
        if not self.capabilities.cross_process:
            pytest.skip("not verified: driver is in-process")

    def report(self, figure: str) -> None:
        """A figure for the summary (e.g. a total-queue count)."""
        self._node.user_properties.append(("hermes_figure", figure))

    # Cleanup

    def close(self) -> None:
        """Stop workers, kill processes, close drivers, tear the namespace down; each bounded.

        Raises one AssertionError naming every step that failed or hung.
        """
        if os.getpid() != self._pid:  # a forked child never cleans up the parent's things
            return
        errors: list[str] = []
        for worker in self._workers:
            worker.ask_to_stop()
        deadline = time.monotonic() + scaled(STOP_S)
        for worker in self._workers:
            try:
                left = max(0.0, deadline - time.monotonic()) / time_scale()
                worker.stop(left)
            except AssertionError as exc:
                errors.append(str(exc))
        for process in self._processes:
            process.ask_to_stop()
        deadline = time.monotonic() + scaled(STOP_S)
        for process in self._processes:
            if process.wait_exit(max(0.0, deadline - time.monotonic()) / time_scale()) is None:
                process.kill()
        for script in self._scripts:
            if script.poll() is None:  # its test failed before it ended
                script.kill()
                script.communicate()
        closing = []
        for driver in self._drivers:
            thread = threading.Thread(
                target=self._close_one, args=(driver, errors), name="kit: close()", daemon=True
            )
            thread.start()
            closing.append((driver, thread))
        deadline = time.monotonic() + scaled(CLOSE_S)
        for driver, thread in closing:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                errors.append(
                    f"close() did not return within {scaled(CLOSE_S):.1f} s (scaled); it is "
                    f"stuck in {where(thread)} ({driver!r})"
                )
        try:
            call_within(
                "teardown()",
                self._teardown,
                CLOSE_S,
                f"the test's namespace on {redact_url(self.url)}",
            )
        except Exception as exc:
            errors.append(str(exc) if isinstance(exc, AssertionError) else repr(exc))
        if errors:
            raise AssertionError("; ".join(errors))

    @staticmethod
    def _close_one(driver: Driver, errors: list[str]) -> None:
        try:
            driver.close()
        except Exception as exc:
            errors.append(f"close() raised {exc!r} ({driver!r})")

    def _teardown(self) -> None:
        driver = connect(self.url)
        try:
            if isinstance(driver, SupportsTeardown):
                for name, priority in self._priority_queues.items():
                    driver.setup_priority_queue(name, priority)
                driver.teardown()
        finally:
            driver.close()


@dataclass
class Outcome:
    """What happened to one kit test, for the summary."""

    row: str
    check: str
    #: ``not run``, ``verified``, ``not verified: …``, ``n/a: …``, ``failed…``
    status: str = "not run"
    figures: list[str] = field(default_factory=list)
