"""The supervisor behind ``hermes worker --processes N``: it forks, reaps, replaces and signals.

The supervisor is small on purpose (gunicorn's arbiter is the model): it never
takes a job or opens a consumer. Each child is a forked copy that runs a whole
:class:`~hermes.core.Worker` of its own -- it imports the handlers module,
connects its driver and handles messages -- and reports to the supervisor over
a status pipe, one JSON line per record:

* ``{"ready": true}`` once its handlers are registered and its driver made;
* ``{"counts": {...}}`` now and then, and ``{"finished": reason, "counts": ...}``
  as it leaves, so the pool's exit summary adds up every child;
* ``{"error": line}`` for each ERROR it logs, so a death is reported with
  the last thing that went wrong;
* ``{"fatal": line}`` for a mistake the user must fix (its handlers module
  raises at import, the broker refuses the credentials): the child exits 2.
  A run that ended on a broker failure that may pass (unavailable for a
  moment) is no mistake: the child exits 1 and is replaced, as after a crash.

Why fork, and why the children import the handlers after the fork rather
than the supervisor before it: a forked child starts in milliseconds (the
interpreter and Hermes are already loaded), and because the supervisor never
imports the application, every new child -- after SIGHUP or ``--reload`` --
runs the code as it is on disk now. An import error is still found before the
pool runs: the first child exits 2 and the supervisor ends the pool with that
line. Drivers are connected in each child, after the fork; their clients are
per process (:class:`~hermes.core.drivertools.PerProcess`) anyway, and each child
makes its own Dispatcher and so its own event loop for async handlers.

Why the supervisor runs no thread: ``fork()`` copies only the calling thread,
and every lock another thread held at that moment stays held for ever in the
child -- a logging handler's, a metrics library's, a driver client's, a
module being imported. So the supervisor forks from a single-threaded state,
always: what needs threads for the pool's whole life (the ``/metrics``
server and its queue-depth sampler, the ``--reload`` file watcher) runs in a
*helper process* of its own, forked before it starts any thread, which
talks to the supervisor over a socket and ends when the supervisor closes it
or dies. Should a plugin start a thread in the supervisor anyway, the first
fork that finds one says so at WARNING.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import resource
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from hermes.core.run._worker import NOTICE, Backoff, WorkerStats
from hermes.core.spi._registry import notify, plugin_manager
from hermes.core.spi._shutdown import Shutdown
from hermes.core.spi._url import redact_url

logger = logging.getLogger("hermes")

#: Crashes of children, before any child handled a message, that make a crash loop...
CRASH_LOOP_DEATHS = 5
#: ...when they fall within this many seconds.
CRASH_LOOP_WINDOW_S = 10.0
#: The exit code of a user's mistake, for ``hermes`` and for a child alike.
EXIT_MISTAKE = 2
#: The exit code of a child whose run failed for a reason that may pass (the broker
#: went away while a retry copy was being sent): replaced with backoff, as a crash.
EXIT_FAILED = 1
#: How much longer than ``--grace`` a stopping child gets before it is SIGKILLed:
#: the child itself gives up on its handlers at the grace, then closes its consumer.
KILL_MARGIN_S = 5.0
#: How often a child looks at its counts and sends them when they changed.
REPORT_INTERVAL_S = 0.2
#: Why a child left that means "replace me now": not a crash, no backoff.
RECYCLED = {"max jobs": "--max-jobs-per-child", "memory": "--max-memory-per-child"}
#: Longest status line a child sends: one ``write`` up to PIPE_BUF is atomic,
#: so lines from several threads of a child never interleave.
_MAX_LINE = 4000


@dataclass(frozen=True)
class PoolConfig:
    """What the supervisor runs: how many children, and when one is replaced."""

    processes: int
    #: How long a stopping child's handlers in flight may finish (``--grace``).
    grace_s: float
    #: A child leaves after taking this many messages (0: never).
    max_jobs_per_child: int = 0
    #: A child leaves once its resident memory passes this many MiB (0: never).
    max_memory_mb: int = 0
    #: Directories whose ``.py`` files restart the children when they change (``--reload``).
    reload_paths: Sequence[Path] = ()


def rss_mb() -> float:
    """This process's resident memory in MiB (peak RSS where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # ru_maxrss is in KiB on Linux and in bytes on macOS.
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024


class _SincePoolStart:
    """A Shutdown that honours every request made since the pool started.

    A Worker ignores requests older than its own start; a child started after
    ``hermes shutdown`` (a replacement) would otherwise run on, and the pool never end.
    """

    def __init__(self, inner: Shutdown, pool_start: float) -> None:
        self.inner = inner
        self.pool_start = pool_start

    def should_shutdown(self, start_time: float) -> bool:
        return self.inner.should_shutdown(min(start_time, self.pool_start))

    def shutdown(self, at: float | None = None) -> bool:
        return self.inner.shutdown(at)

    def __repr__(self) -> str:
        return repr(self.inner)


class ChildLink:
    """A child's end of its status pipe: what the child tells the supervisor, and its limits."""

    def __init__(self, slot: int, fd: int, config: PoolConfig, pool_start: float) -> None:
        #: The child's place in the pool, 1..N; a replacement takes the same one.
        self.slot = slot
        self.config = config
        self.pool_start = pool_start
        self.supervisor_pid = os.getppid()
        self._fd = fd
        self._lock = threading.Lock()
        #: Why the Worker's ``stop_when`` said stop: "memory", "supervisor gone".
        self.why: str | None = None

    @property
    def name(self) -> str:
        return f"worker-{self.slot}"

    @property
    def log_prefix(self) -> str:
        return f"[{self.name} pid {os.getpid()}] "

    def send(self, **record: Any) -> None:
        line = json.dumps(record).encode() + b"\n"
        if len(line) > _MAX_LINE:
            line = json.dumps({k: _shorten(v) for k, v in record.items()}).encode() + b"\n"
        with self._lock:
            try:
                os.write(self._fd, line)
            except BlockingIOError:
                # The supervisor is not reading (the pipe is full): a report is
                # dropped rather than a handler thread blocked; the next one catches up.
                return
            except BrokenPipeError:
                # The supervisor is gone; the reporter thread notices and stops the Worker.
                return

    def ready(self) -> None:
        self.send(ready=True)

    def fatal(self, line: str) -> None:
        self.send(fatal=line)

    def finished(self, stats: WorkerStats, counts: Mapping[str, int]) -> None:
        reason = stats.stopped_by
        if reason == "max items":
            reason = "max jobs"
        elif reason == "done":
            reason = self.why
        self.send(finished=reason, counts=dict(counts))

    def since_pool_start(self, shutdowns: Iterable[Shutdown]) -> list[Shutdown]:
        return [_SincePoolStart(shutdown, self.pool_start) for shutdown in shutdowns]

    def stop_when(self, stats: Callable[[], WorkerStats]) -> Callable[[], bool] | None:
        """The Worker's extra stop condition: past ``--max-memory-per-child``, or orphaned."""
        limit = self.config.max_memory_mb
        checked = {"started": 0, "at": 0.0}

        def should_stop() -> bool:
            if self.why is not None:
                return True
            if not limit:
                return False
            started = stats().started
            # Between messages, at most every REPORT_INTERVAL_S: reading /proc costs
            # a little, and a child at its limit before its first job must not spin.
            now = time.monotonic()
            if started == checked["started"] or now < checked["at"]:
                return False
            checked["started"], checked["at"] = started, now + REPORT_INTERVAL_S
            rss = rss_mb()
            if rss > limit:
                logger.log(
                    NOTICE,
                    "Resident memory %.0f MiB is past --max-memory-per-child %d: taking no "
                    "more messages, finishing those in flight, then leaving for a new child",
                    rss,
                    limit,
                )
                self.why = "memory"
                return True
            return False

        return should_stop

    def report_while_running(
        self, counts: Callable[[], Mapping[str, int]], stop: Callable[[], None]
    ) -> threading.Event:
        """Send ``counts()`` when they change; ``stop()`` the Worker if the supervisor dies.

        Set the returned event to end the reporter.
        """
        done = threading.Event()

        def report() -> None:
            last: dict[str, int] = {}
            while not done.wait(REPORT_INTERVAL_S):
                now = dict(counts())
                if now != last:
                    self.send(counts=now)
                    last = now
                if os.getppid() != self.supervisor_pid and self.why is None:
                    # An orphan would run on unsupervised, a pool beyond N: leave like a SIGTERM.
                    logger.warning("The supervisor is gone: stopping after the messages in flight")
                    self.why = "supervisor gone"
                    stop()

        threading.Thread(target=report, name="hermes-pool-report", daemon=True).start()
        return done

    def error_log_handler(self) -> logging.Handler:
        """A logging handler that sends each ERROR line to the supervisor (the death report)."""
        link = self

        class _ToSupervisor(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    text = record.getMessage()
                except (TypeError, ValueError):
                    text = str(record.msg)  # a bad format string: the raw text says enough
                link.send(error=redact_url(" ".join(text.split()))[:1000])

        return _ToSupervisor(logging.ERROR)


def _shorten(value: Any) -> Any:
    return value[:1000] + "..." if isinstance(value, str) and len(value) > 1000 else value


class HelperError(Exception):
    """A helper process of the pool could not start; :attr:`line` says why, in one line."""

    def __init__(self, name: str, line: str) -> None:
        super().__init__(line)
        #: The helper's name ("metrics server").
        self.name = name
        self.line = line


class HelperLink:
    """A helper process's end of its socket: what it tells the supervisor, and its life."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def send(self, **record: Any) -> None:
        self._sock.sendall(json.dumps(record).encode() + b"\n")

    def ready(self) -> None:
        """Set up: the supervisor goes on (and forks its workers)."""
        self.send(ready=True)

    def fatal(self, line: str) -> None:
        """Could not set up: the supervisor raises :class:`HelperError` with ``line``."""
        self.send(fatal=line)

    def wait_for_supervisor(self) -> None:
        """Block until the supervisor stops this helper or is gone."""
        try:
            while self._sock.recv(4096):
                pass
        except OSError:
            return  # reset by a supervisor that died: gone all the same


#: ``main(link)``: a helper's whole life; it calls ``link.ready()`` once set up.
HelperMain = Callable[[HelperLink], None]


@dataclass(eq=False)
class _Helper:
    """The supervisor's view of one helper process."""

    name: str
    pid: int
    sock: socket.socket
    buffer: bytes = b""
    #: Reaped: it is gone.
    exited: bool = False


@dataclass(eq=False)
class _Child:
    """The supervisor's view of one child."""

    slot: int
    pid: int
    fd: int
    generation: int
    started_at: float = field(default_factory=time.monotonic)
    buffer: bytes = b""
    #: Its pipe reached end of file: it is gone or going; the reaper decides.
    eof: bool = False
    ready: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    fatal: str | None = None
    finished: str | None = None
    #: Asked by the supervisor to stop (SIGTERM sent): its exit is expected.
    retiring: bool = False

    @property
    def name(self) -> str:
        return f"worker-{self.slot} pid {self.pid}"


@dataclass
class PoolStats:
    """What a pool did, over every child it ran."""

    #: The Dispatcher and Worker counts of every child, added up (a killed child's
    #: as of its last report, at most :data:`REPORT_INTERVAL_S` old).
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Children started, the first N included.
    started: int = 0
    #: Children that left at --max-jobs-per-child or --max-memory-per-child.
    recycled: int = 0
    #: Children that exited without being asked (crashed, killed, exited on their own).
    died: int = 0
    #: Children replaced by SIGHUP or --reload.
    rolled: int = 0
    #: Children that stopped on a stop request (the dashboard's Restart, ``hermes workers
    #: --stop``) and were replaced.
    requested: int = 0
    #: Why the pool stopped: "SIGTERM", "SIGINT", "shutdown", "crash loop", ...
    stopped_by: str | None = None
    #: The one-line mistake that ended the pool with exit 2, if one did.
    fatal: str | None = None
    exit_code: int = 0


ChildMain = Callable[[ChildLink], int]


class Supervisor:
    """Keeps ``config.processes`` children running ``child_main(link)`` until told to stop.

    * A child that dies is replaced after a jittered backoff, with a log line
      saying how it died and its last ERROR line. A child exiting 2 (a mistake
      of the user's) ends the pool with exit 2 and its one line; so do
      :data:`CRASH_LOOP_DEATHS` crashes (an exit code, or a signal such as
      SIGSEGV; not a SIGKILL from outside) within :data:`CRASH_LOOP_WINDOW_S`
      before any child handled a message. Never more than N children run,
      except one extra while SIGHUP replaces one.
    * A child that leaves at ``max_jobs_per_child`` / ``max_memory_mb`` (exit
      0, its reason on the pipe) is replaced at once.
    * SIGTERM / SIGINT: every child gets SIGTERM (its handlers in flight
      finish within ``grace_s``); a second one, or a child still there after
      the grace and :data:`KILL_MARGIN_S`, gets SIGKILL. A child that stopped
      for a shutdown request stops the pool the same way.
    * SIGHUP, or a change under ``reload_paths``: a rolling restart -- for each
      child in turn a new one is started, and once it is ready the old one
      gets SIGTERM. A new child that cannot start ends the roll and leaves the
      old children running.
    * ``helpers`` (name -> ``main(link)``) are started first, each in a
      process of its own, and stopped last: the work that needs threads, so
      that the supervisor runs none when it forks (see the module's
      docstring). One that cannot start raises :class:`HelperError` from
      :meth:`run` before any child starts; one that dies later is logged at
      ERROR and the pool runs on without it.
    """

    def __init__(
        self,
        config: PoolConfig,
        child_main: ChildMain,
        helpers: Mapping[str, HelperMain] | None = None,
    ) -> None:
        if config.processes < 1:
            raise ValueError(f"processes must be >= 1, got {config.processes}")
        self.config = config
        self.child_main = child_main
        self.stats = PoolStats()
        self.children: dict[int, _Child] = {}
        self._pool_start = time.time()
        self._stopping = False
        self._stop_deadline = 0.0
        self._signals: collections.deque[int] = collections.deque()
        self._wake_r, self._wake_w = -1, -1
        self._backoff = Backoff(first_s=0.1, cap_s=2.0)
        self._last_death = 0.0
        self._deaths: collections.deque[float] = collections.deque()
        self._respawn_at: dict[int, float] = {}
        #: A child of the pool has handled a message: deaths are no longer a crash loop.
        self._proven = False
        self._generation = 0
        self._roll_new: _Child | None = None
        self._roll_old: _Child | None = None
        self._roll_why = ""
        #: After a death, a rolling restart waits out the same backoff as a replacement.
        self._roll_not_before = 0.0
        self._changed: list[str] = []
        self._helper_mains: dict[str, HelperMain] = dict(helpers or {})
        if config.reload_paths:
            self._helper_mains["file watcher"] = _watch(config.reload_paths)
        self.helpers: list[_Helper] = []
        self._warned_threads = False

    # The loop ----------------------------------------------------------------

    def run(self) -> PoolStats:
        """Run the pool until it is stopped; what it did (``stats.exit_code`` to exit with).

        Raises :class:`HelperError` if a helper process cannot start.
        """
        try:
            for name, main in self._helper_mains.items():
                self._start_helper(name, main)
        except BaseException:
            self._stop_helpers()
            raise
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        logger.info(
            "Supervising %d worker processes, each a Worker of its own%s",
            self.config.processes,
            self._limits(),
        )
        try:
            while True:
                # Signals first: children that exit because Ctrl-C reached them too
                # are then seen as stopping, not as deaths to replace.
                self._handle_signals()
                self._reap()
                self._take_changes()
                if self._stopping:
                    if not self.children:
                        break
                    self._kill_if_late()
                else:
                    self._fill_slots()
                    self._roll_on()
                self._sleep()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for child in list(self.children.values()):
                # Only when the loop itself failed: no child outlives its supervisor.
                self._signal(child, signal.SIGKILL)
                os.waitpid(child.pid, 0)
                self._forget(child)
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
            self._stop_helpers()
        return self.stats

    def _limits(self) -> str:
        config, limits = self.config, []
        if config.max_jobs_per_child:
            limits.append(f"replaced after {config.max_jobs_per_child} messages")
        if config.max_memory_mb:
            limits.append(f"replaced past {config.max_memory_mb} MiB")
        if config.reload_paths:
            where = ", ".join(map(str, config.reload_paths))
            limits.append(f"restarted when a .py file changes under {where}")
        return "; " + ", ".join(limits) if limits else ""

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD:
            self._signals.append(signum)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b".")
        except BlockingIOError:
            return  # the pipe is full: the loop is awake already

    def _sleep(self) -> None:
        timeout = 0.5
        now = time.monotonic()
        for at in self._respawn_at.values():
            timeout = min(timeout, max(0.0, at - now))
        fds = [self._wake_r, *(c.fd for c in self.children.values() if not c.eof)]
        listening = {h.sock.fileno(): h for h in self.helpers if h.sock.fileno() >= 0}
        try:
            readable, _, _ = select.select([*fds, *listening], [], [], timeout)
        except InterruptedError:
            return
        for fd in readable:
            if fd == self._wake_r:
                self._drain_wake()
            elif fd in listening:
                self._hear(listening[fd])
            else:
                child = next((c for c in self.children.values() if c.fd == fd), None)
                if child is not None:
                    self._read(child)

    def _drain_wake(self) -> None:
        while True:
            try:
                if not os.read(self._wake_r, 4096):
                    return
            except BlockingIOError:
                return

    # Children ----------------------------------------------------------------

    def _fork(self, become: Callable[[Iterable[int]], None]) -> int:
        """Fork; the child calls ``become(mask)``, which never returns. The child's pid.

        Only from this one thread: see the module's docstring.
        """
        self._warn_of_threads()
        # Unflushed output would be written twice: once by each process.
        sys.stdout.flush()
        sys.stderr.flush()
        # Blocked across the fork: a SIGTERM the supervisor sends a child that has
        # not yet put its own handlers in place would reach the child's copy of
        # the supervisor's handler, which only records it for a loop the child
        # never runs (or, arriving during the fork, be cleared with the child's
        # pending signals). Unblocked in the child once its handlers are the
        # default ones, such a SIGTERM ends it, as the supervisor expects.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _FORK_BLOCKED)
        try:
            pid = os.fork()
            if pid == 0:  # the child: never returns into the supervisor's stack
                become(mask)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return pid

    def _warn_of_threads(self) -> None:
        others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
        if others and not self._warned_threads:
            self._warned_threads = True
            logger.warning(
                "Threads run in the supervisor as it forks a worker process (%s): a lock one "
                "of them holds stays held for ever in the child, which can hang on it; a "
                "plugin should start its threads in the worker processes, not the supervisor",
                ", ".join(others),
            )

    def _close_inherited(self) -> None:
        """In a forked process: close the supervisor's ends of every pipe and socket."""
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        for other in self.children.values():
            os.close(other.fd)
        for helper in self.helpers:
            helper.sock.close()

    def _spawn(self, slot: int) -> _Child:
        read_fd, write_fd = os.pipe()

        def become(mask: Iterable[int]) -> None:
            os.close(read_fd)
            self._become_child(slot, write_fd, mask)

        pid = self._fork(become)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        child = _Child(slot, pid, read_fd, self._generation)
        self.children[pid] = child
        self.stats.started += 1
        self._respawn_at.pop(slot, None)
        logger.info("Started %s", child.name)
        return child

    def _become_child(self, slot: int, fd: int, mask: Iterable[int]) -> None:
        code = 1
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            # The supervisor decides what a hangup means (a rolling restart): a
            # terminal closing must not take the children down one by one.
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            self._close_inherited()
            os.set_blocking(fd, False)
            link = ChildLink(slot, fd, self.config, self._pool_start)
            code = self.child_main(link)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                # os._exit skips atexit: the plugins' exit-time flushes happen here or never.
                notify(plugin_manager().hook.hermes_process_exiting)
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)

    def _fill_slots(self) -> None:
        if self._stopping:
            return
        held = {c.slot for c in self.children.values() if not c.retiring}
        now = time.monotonic()
        for slot in range(1, self.config.processes + 1):
            if slot in held:
                self._respawn_at.pop(slot, None)  # a rolling restart's new child took it
            elif now >= self._respawn_at.get(slot, 0.0):
                self._spawn(slot)

    def _read(self, child: _Child) -> None:
        while True:
            try:
                data = os.read(child.fd, 65536)
            except BlockingIOError:
                break
            if not data:
                child.eof = True
                break
            child.buffer += data
        *lines, child.buffer = child.buffer.split(b"\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                logger.warning("%s sent an unreadable status line: %r", child.name, line[:200])
                continue
            self._record(child, record)

    def _record(self, child: _Child, record: dict[str, Any]) -> None:
        if record.get("ready"):
            child.ready = True
        if "counts" in record:
            child.counts = {k: int(v) for k, v in record["counts"].items()}
            if child.counts.get("processed", 0) > 0:
                self._proven = True
                if child.started_at > self._last_death:
                    self._backoff.reset()  # a child born after the last death works
        if "error" in record:
            child.last_error = str(record["error"])
        if "fatal" in record:
            child.fatal = str(record["fatal"])
        if "finished" in record:
            child.finished = record["finished"] or "stopped"

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.get(pid)
            if child is None:
                helper = next((h for h in self.helpers if h.pid == pid), None)
                if helper is not None:
                    self._helper_exited(helper, status)
                continue  # else not ours: e.g. a process a plugin started
            self._read(child)  # what it said before it went: everything is in the pipe
            self._forget(child)
            self._exited(child, status)

    def _forget(self, child: _Child) -> None:
        del self.children[child.pid]
        os.close(child.fd)
        self.stats.counts.update(child.counts)
        notify(plugin_manager().hook.hermes_worker_process_exited, pid=child.pid)

    def _exited(self, child: _Child, status: int) -> None:
        how = _how(status)
        code = os.waitstatus_to_exitcode(status)
        last = f" - {child.fatal or child.last_error}" if child.fatal or child.last_error else ""
        if child is self._roll_new:
            self._roll_new = None
            if not child.ready:
                self._roll_old = None
                for other in self.children.values():
                    other.generation = self._generation  # the roll ends here
                self._roll_why = ""
                if not self._stopping:
                    logger.error(
                        "Rolling restart stopped: the new %s %s before it was ready%s; the "
                        "running worker processes go on with the code they have",
                        child.name,
                        how,
                        last,
                    )
                return
        if child is self._roll_old:
            self._roll_old = None
        if child.retiring:
            logger.info("%s stopped (%s)", child.name, how)
            return
        if code == 0 and child.finished in RECYCLED:
            self.stats.recycled += 1
            logger.info(
                "%s reached %s after %d messages and left (%s); replacing it",
                child.name,
                RECYCLED[child.finished],
                child.counts.get("started", 0),
                how,
            )
            return
        if code == 0 and (child.finished or "").startswith("stop requested"):
            self.stats.requested += 1
            logger.info("%s stopped on a request (%s); replacing it", child.name, child.finished)
            return
        if code == 0 and child.finished == "shutdown":
            logger.log(NOTICE, "%s stopped for a shutdown request: stopping the pool", child.name)
            self._stop("shutdown")
            return
        if code == EXIT_MISTAKE:
            self.stats.fatal = child.fatal or f"{child.name} {how}{last}"
            # INFO: the pool's last line, on stderr, is this mistake.
            logger.info("%s %s%s: stopping the pool", child.name, how, last)
            self._stop("a child's mistake", exit_code=EXIT_MISTAKE)
            return
        self.stats.died += 1
        now = time.monotonic()
        self._last_death = now
        if _crashed(status):
            self._deaths.append(now)
        while self._deaths and self._deaths[0] < now - CRASH_LOOP_WINDOW_S:
            self._deaths.popleft()
        if not self._proven and len(self._deaths) >= CRASH_LOOP_DEATHS:
            self.stats.fatal = (
                f"worker processes keep crashing: {len(self._deaths)} within "
                f"{CRASH_LOOP_WINDOW_S:.0f} s before any handled a message; the last, "
                f"{child.name}, {how}{last}"
            )
            logger.error("%s", self.stats.fatal)
            self._stop("crash loop", exit_code=EXIT_MISTAKE)
            return
        delay = self._backoff.next_delay_s()
        self._respawn_at[child.slot] = now + delay
        self._roll_not_before = now + delay
        logger.warning("%s %s%s; a new one starts in %.2f s", child.name, how, last, delay)

    def _signal(self, child: _Child, sig: int) -> None:
        try:
            os.kill(child.pid, sig)
        except ProcessLookupError:
            return  # gone already; the reaper hears of it

    # Stopping ----------------------------------------------------------------

    def _handle_signals(self) -> None:
        while self._signals:
            signum = self._signals.popleft()
            name = signal.Signals(signum).name
            if signum == signal.SIGHUP:
                if not self._stopping:
                    self._start_roll("SIGHUP")
            elif not self._stopping:
                logger.log(
                    NOTICE,
                    "Received %s: stopping %d worker processes after their messages in flight "
                    "(at most %g s; %s again stops them at once)",
                    name,
                    len(self.children),
                    self.config.grace_s,
                    name,
                )
                self._stop(name)
            else:
                logger.warning("Received %s again: killing every worker process", name)
                for child in self.children.values():
                    self._signal(child, signal.SIGKILL)
                if self.stats.exit_code == 0:
                    self.stats.exit_code = 128 + signum

    def _stop(self, why: str, exit_code: int = 0) -> None:
        if not self._stopping:
            self._stopping = True
            self.stats.stopped_by = why
            self._stop_deadline = time.monotonic() + self.config.grace_s + KILL_MARGIN_S
        if exit_code and not self.stats.exit_code:
            self.stats.exit_code = exit_code
        self._respawn_at.clear()
        for child in self.children.values():
            if not child.retiring:
                child.retiring = True
                self._signal(child, signal.SIGTERM)

    def _kill_if_late(self) -> None:
        if time.monotonic() < self._stop_deadline:
            return
        for child in self.children.values():
            logger.warning(
                "%s still runs %.0f s after the grace period: killing it",
                child.name,
                KILL_MARGIN_S,
            )
            self._signal(child, signal.SIGKILL)
        self._stop_deadline = float("inf")  # once; the reaper takes them

    # Rolling restarts and reload ----------------------------------------------

    def _start_roll(self, why: str) -> None:
        self._generation += 1
        self._roll_why = why
        logger.log(
            NOTICE,
            "%s: replacing the %d worker processes one after another",
            why,
            len([c for c in self.children.values() if not c.retiring]),
        )

    def _roll_on(self) -> None:
        new, old = self._roll_new, self._roll_old
        if new is not None:
            if new.ready and old is not None and not old.retiring:
                old.retiring = True
                self.stats.rolled += 1
                self._signal(old, signal.SIGTERM)
            if old is None or old.pid not in self.children:
                self._roll_new = self._roll_old = None  # the old one is gone: next
            return
        stale = [
            c for c in self.children.values() if c.generation < self._generation and not c.retiring
        ]
        if stale and time.monotonic() >= self._roll_not_before:
            self._roll_old = min(stale, key=lambda c: c.slot)
            self._roll_new = self._spawn(self._roll_old.slot)
        elif self._roll_why:
            logger.info("%s: every worker process replaced", self._roll_why)
            self._roll_why = ""

    # Helper processes -----------------------------------------------------------

    def _start_helper(self, name: str, main: HelperMain) -> None:
        """Fork the helper ``name`` and wait until it is set up (or could not be)."""
        ours, theirs = socket.socketpair()

        def become(mask: Iterable[int]) -> None:
            code = 1
            try:
                ours.close()
                for sig in (signal.SIGTERM, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                # Ctrl-C and a hangup are the supervisor's to act on: it stops its helpers last.
                for sig in (signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_IGN)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                self._close_inherited()
                main(HelperLink(theirs))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)

        pid = self._fork(become)
        theirs.close()
        helper = _Helper(name, pid, ours)
        self.helpers.append(helper)
        record: dict[str, Any] = {}
        while b"\n" not in helper.buffer:
            data = ours.recv(65536)
            if not data:
                break
            helper.buffer += data
        line, _, helper.buffer = helper.buffer.partition(b"\n")
        with contextlib.suppress(ValueError):
            record = json.loads(line) if line else {}
        if not record.get("ready"):
            why = record.get("fatal")
            if why is None:
                _, status = os.waitpid(pid, 0)
                helper.exited = True
                why = f"the {name} process {_how(status)} as it started"
            raise HelperError(name, str(why))
        ours.setblocking(False)
        logger.debug("Started the %s (pid %d)", name, pid)

    def _hear(self, helper: _Helper) -> None:
        """What a helper said: changed files (the file watcher); its end of the socket."""
        while True:
            try:
                data = helper.sock.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                helper.sock.close()  # it is going; the reaper says how
                break
            helper.buffer += data
        *lines, helper.buffer = helper.buffer.split(b"\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                logger.warning("The %s sent an unreadable line: %r", helper.name, line[:200])
                continue
            changed = record.get("changed")
            if isinstance(changed, list):
                self._changed.extend(str(path) for path in changed)

    def _helper_exited(self, helper: _Helper, status: int) -> None:
        helper.exited = True
        helper.sock.close()
        if not self._stopping:
            logger.error(
                "The %s (pid %d) %s; the pool runs on without it",
                helper.name,
                helper.pid,
                _how(status),
            )

    def _stop_helpers(self) -> None:
        for helper in self.helpers:
            helper.sock.close()  # its wait_for_supervisor() returns
            if not helper.exited:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(helper.pid, signal.SIGTERM)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(helper.pid, 0)
                helper.exited = True

    def _take_changes(self) -> None:
        if not self._changed:
            return
        changed, self._changed = self._changed, []
        if self._stopping:
            return
        names = sorted({os.path.relpath(path) for path in changed})
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        self._start_roll(f"{shown} changed")


def _watch(paths: Sequence[Path]) -> HelperMain:
    """``--reload``'s file watcher: a helper sending the ``.py`` files changed under ``paths``."""

    def main(link: HelperLink) -> None:
        import watchfiles  # optional: only --reload needs it

        stop = threading.Event()

        def until_supervisor_gone() -> None:
            link.wait_for_supervisor()
            stop.set()

        threading.Thread(
            target=until_supervisor_gone, name="hermes-reload-stop", daemon=True
        ).start()
        link.ready()
        for changes in watchfiles.watch(
            *paths,
            watch_filter=watchfiles.PythonFilter(),
            stop_event=stop,
            raise_interrupt=False,
        ):
            link.send(changed=sorted({path for _, path in changes}))

    return main


#: Signals sent to a process from outside (an operator, a process manager, the OOM
#: killer): a child ended by one did not crash by itself.
#: Held back across ``fork()`` until the child's own handlers are in place.
_FORK_BLOCKED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}

_SENT_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


def _crashed(status: int) -> bool:
    """Whether a child's end was its own doing: an exit code, or SIGSEGV, SIGABRT and the like.

    Only those make a crash loop; a child killed from outside before it could handle a
    message (a soak test's SIGKILL every half second) is replaced like any other.
    """
    if os.WIFSIGNALED(status):
        return os.WTERMSIG(status) not in _SENT_SIGNALS
    return True


def _how(status: int) -> str:
    """``exited with code 1``, ``was killed by SIGKILL``: how a child ended."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"was killed by {name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"
