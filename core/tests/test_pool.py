"""``hermes worker --processes N``: the supervisor, run as a user runs it, on file:// and Redis.

Counts here are small to keep the suite quick (``--max-jobs-per-child 10``
over 200 messages); torture/pool_soak.py runs the full figures (100 over
2,000, SIGKILLs for two minutes).
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hermes_test_support import eventually

from hermes.core import Message, connect

HERMES = shutil.which("hermes", path=str(Path(sys.executable).parent)) or shutil.which("hermes")

pytestmark = [
    pytest.mark.skipif(HERMES is None, reason="the hermes console script is not installed"),
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="counts children in /proc"),
]

#: Appends "<n>\t<pid>\t<tag>" per message with one write on an O_APPEND file:
#: several processes share it, and a line written survives a SIGKILL.
JOBS = """
import os
import time

TAG = "v1"
SLEEP_S = float(os.environ.get("JOBS_SLEEP_S", "0"))
_fd = os.open("handled.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def record(message):
    if SLEEP_S:
        os.write(_fd, f"start {message.payload['n']}\\t{os.getpid()}\\n".encode())
        time.sleep(SLEEP_S)
    os.write(_fd, f"{message.payload['n']}\\t{os.getpid()}\\t{TAG}\\n".encode())


class AsyncRecord:
    async def handle(self, message):
        import asyncio

        await asyncio.sleep(0.01)
        record(message)
        return True


HANDLERS = {"job": record}
ASYNC_HANDLERS = {"job": AsyncRecord()}
"""


def children_of(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``, from /proc."""
    try:
        # The supervisor forks from its main thread: its task's children file lists them.
        entries = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        entries = os.listdir("/proc")  # a kernel without that file: look at every process
    found = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name is in parentheses and may hold spaces: split after it.
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.append(int(entry))
    return found


class Pool:
    """A ``hermes worker`` process in ``cwd``, its output in a file, its children counted."""

    def __init__(
        self,
        cwd: Path,
        *args: str,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> None:
        assert HERMES is not None
        self.output = cwd / f"pool-{uuid.uuid4().hex[:6]}.out"
        self.stdout = cwd / f"pool-{uuid.uuid4().hex[:6]}.stdout"
        environ = {k: v for k, v in os.environ.items() if k not in ("HERMES_URL",)}
        environ.update(env or {})
        with self.output.open("w") as err, self.stdout.open("w") as out:
            self.proc = subprocess.Popen(
                [*(command or [HERMES]), "worker", *args],
                cwd=cwd,
                env=environ,
                stdout=out,
                stderr=err,
            )
        #: The most children seen alive at once, by :meth:`watch`.
        self.most = 0
        self._watching = threading.Event()

    def children(self) -> list[int]:
        return children_of(self.proc.pid)

    def watch(self) -> None:
        """Count the children every few ms until :meth:`stop`, keeping the most seen."""

        def sample() -> None:
            while not self._watching.wait(0.005):
                self.most = max(self.most, len(self.children()))

        threading.Thread(target=sample, daemon=True).start()

    def log(self) -> str:
        return self.output.read_text()

    def wait(self, timeout_s: float = 20.0) -> int:
        try:
            return self.proc.wait(timeout_s)
        finally:
            self._watching.set()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def close(self) -> None:
        self._watching.set()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                for child in self.children():
                    os.kill(child, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "jobs.py").write_text(JOBS)
    return tmp_path


@pytest.fixture
def pools() -> Iterator[list[Pool]]:
    started: list[Pool] = []
    yield started
    for pool in started:
        pool.close()


def seed(url: str, numbers: range) -> None:
    with connect(url) as driver:
        messages = [Message("job", {"n": n}) for n in numbers]
        for i in range(0, len(messages), 100):
            driver.send_batch(messages[i : i + 100])


def handled(project: Path) -> collections.Counter[int]:
    path = project / "handled.txt"
    text = path.read_text() if path.exists() else ""
    return collections.Counter(
        int(line.split("\t")[0]) for line in text.splitlines() if not line.startswith("start")
    )


def rows(project: Path) -> list[list[str]]:
    path = project / "handled.txt"
    text = path.read_text() if path.exists() else ""
    return [line.split("\t") for line in text.splitlines() if not line.startswith("start")]


def file_url(project: Path) -> str:
    return (project / "queue").as_uri()


def start(
    pools: list[Pool],
    project: Path,
    *args: str,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
) -> Pool:
    pool = Pool(project, *args, env=env, command=command)
    pools.append(pool)
    return pool


def test_a_killed_child_is_replaced_and_never_more_than_n_run(project, pools):
    url = file_url(project)
    pool = start(pools, project, "--url", url, "--handlers", "jobs:HANDLERS", "--processes", "2")
    pool.watch()
    first = eventually(lambda: len(pool.children()) == 2 and pool.children(), "two children", 20)
    victim = first[0]
    os.kill(victim, signal.SIGKILL)
    eventually(
        lambda: len(set(pool.children()) - set(first)) == 1 and len(pool.children()) == 2,
        "a replacement",
        20,
    )
    eventually(lambda: f"pid {victim} was killed by SIGKILL" in pool.log(), "the death logged")
    seed(url, range(20))
    eventually(lambda: len(handled(project)) == 20, "20 messages handled", 20)
    # The replacement may still be starting (importing, connecting) when the other
    # child has handled all 20: its first line is waited for, not assumed.
    eventually(
        lambda: "[worker-1 pid " in pool.log() and "[worker-2 pid " in pool.log(),
        "a log line from each slot",
        20,
        details=pool.log,
    )
    assert pool.stop() == 0
    assert pool.most == 2
    assert "handled 20," in pool.stdout.read_text()
    assert "1 died and were replaced" in pool.stdout.read_text()


def test_each_child_s_heartbeat_names_its_supervisor_and_slot_and_a_replacement_takes_the_slot(
    project, pools
):
    from hermes.core.heartbeat import live_workers

    url = file_url(project)
    pool = start(
        pools,
        project,
        "--url",
        url,
        "--handlers",
        "jobs:HANDLERS",
        "--processes",
        "2",
        "--heartbeat-interval",
        "0.5",
    )

    seen = []

    def beating(pids):
        """The live records, once they are exactly those of ``pids``."""
        with connect(url) as driver:
            found = live_workers(driver)
        seen[:] = found
        return found if sorted(r["pid"] for r in found) == sorted(pids) else None

    first = eventually(lambda: len(pool.children()) == 2 and pool.children(), "two children", 20)
    records = eventually(lambda: beating(first), "a heartbeat from each child", 20)
    assert {r["supervisor_pid"] for r in records} == {pool.proc.pid}
    slots = {r["pid"]: r["slot"] for r in records}
    assert sorted(slots.values()) == [1, 2]
    victim = first[0]
    os.kill(victim, signal.SIGKILL)

    def replaced():
        """The live records once they are exactly the pool's two children, the victim gone.

        The children are read afresh at each look, not once: should a list read
        mid-replacement name a process that is gone by then, the test waits for the
        pool as it settles rather than for that process.
        """
        children = pool.children()
        if len(children) != 2 or victim in children:
            return None
        return beating(children)

    # The killed child's record stays until it expires (three periods): then only the two live.
    records = eventually(
        replaced,
        "the replacement's heartbeat, the victim's gone",
        20,
        details=lambda: (
            f"children now {pool.children()}; live records "
            f"{[(r['pid'], r.get('slot')) for r in seen]}; the pool's log:\n{pool.log()}"
        ),
    )
    (replacement,) = [r for r in records if r["pid"] not in first]
    assert replacement["slot"] == slots[victim]
    assert replacement["supervisor_pid"] == pool.proc.pid
    assert pool.stop() == 0


def test_a_handlers_module_raising_at_import_ends_the_pool_with_exit_2_and_one_line(project, pools):
    (project / "broken.py").write_text("raise RuntimeError('no DATABASE_URL set')\n")
    started = time.monotonic()
    pool = start(
        pools, project, "--url", file_url(project), "--handlers", "broken:X", "--processes", "2"
    )
    assert pool.wait(10) == 2
    assert time.monotonic() - started < 10
    err = pool.log()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("hermes: error: cannot import handlers module 'broken'")
    assert "RuntimeError: no DATABASE_URL set (broken.py:1)" in last
    assert err.count("hermes: error:") == 1


def test_refused_credentials_end_the_pool_with_exit_2_and_one_line(project, pools, redis_url):
    url = redis_url.replace("redis://", "redis://hermes-nobody:wrong@", 1)
    pool = start(pools, project, "--url", url, "--handlers", "jobs:HANDLERS", "--processes", "2")
    assert pool.wait(10) == 2
    err = pool.log()
    assert "Traceback" not in err and "wrong" not in err
    last = err.splitlines()[-1]
    assert last.startswith("hermes: error: broker refused:"), last
    assert err.count("hermes: error:") == 1


def test_sigterm_lets_every_childs_jobs_in_flight_finish_and_leaves_the_rest(project, pools):
    url = file_url(project)
    seed(url, range(40))
    pool = start(
        pools,
        project,
        "--url",
        url,
        "--handlers",
        "jobs:HANDLERS",
        "--processes",
        "2",
        "--concurrency",
        "2",
        "--grace",
        "20.5",
        env={"JOBS_SLEEP_S": "1.5"},
    )
    record = project / "handled.txt"

    def started() -> set[str]:
        text = record.read_text() if record.exists() else ""
        return {line.split("\t")[1] for line in text.splitlines() if line.startswith("start")}

    # Every handler thread of both children is busy.
    eventually(lambda: len(started()) == 2 and record.read_text().count("start") >= 4, "4 jobs", 20)
    assert pool.stop() == 0
    text = record.read_text()
    begun = {line.split("\t")[0].split()[1] for line in text.splitlines() if "start" in line}
    done = {str(n) for n in handled(project)}
    assert begun == done  # each one in flight finished within the grace
    with connect(url) as driver:
        waiting = sum(row.ready or 0 for row in driver.queue_stats())
    assert waiting + len(done) == 40  # the rest stayed on the broker
    assert "stopped (exited with code 0)" in pool.log()
    assert "(at most 20.5 s;" in pool.log()  # --grace as given


def test_max_jobs_per_child_replaces_children_without_losing_or_repeating_a_job(project, pools):
    url = file_url(project)
    seed(url, range(200))
    pool = start(
        pools,
        project,
        "--url",
        url,
        "--handlers",
        "jobs:HANDLERS",
        "--processes",
        "2",
        "--concurrency",
        "2",
        "--max-jobs-per-child",
        "10",
    )
    pool.watch()
    eventually(lambda: len(handled(project)) == 200, "200 messages handled", 60)
    assert pool.stop() == 0
    counts = handled(project)
    assert set(counts) == set(range(200))  # lost 0
    assert max(counts.values()) == 1  # none handled twice
    pids = collections.Counter(row[1] for row in rows(project))
    assert max(pids.values()) <= 10
    assert len(pids) >= 20
    summary = pool.stdout.read_text()
    assert "received 200, handled 200" in summary
    recycled = int(summary.split(" replaced at their limit")[0].rsplit(" ", 1)[1])
    assert 18 <= recycled <= 21
    assert pool.most <= 2
    assert "reached --max-jobs-per-child after 10 messages" in pool.log()


def test_max_memory_per_child_replaces_a_child_past_it(project, pools):
    url = file_url(project)
    seed(url, range(4))
    # Every Python process is past 1 MiB: each child takes one message, then leaves.
    pool = start(
        pools, project, "--url", url, "--handlers", "jobs:HANDLERS", "--max-memory-per-child", "1"
    )
    eventually(lambda: len(handled(project)) == 4, "4 messages handled", 30)
    assert pool.stop() == 0
    assert len({row[1] for row in rows(project)}) == 4
    assert "past --max-memory-per-child 1" in pool.log()
    assert "reached --max-memory-per-child" in pool.log()


def test_reload_picks_up_an_edited_handler_module(project, pools):
    url = file_url(project)
    pool = start(pools, project, "--url", url, "--handlers", "jobs:HANDLERS", "--reload")
    seed(url, range(1))
    eventually(lambda: rows(project), "the first message handled", 20)
    assert rows(project)[0][2] == "v1"
    jobs = project / "jobs.py"
    jobs.write_text(jobs.read_text().replace('TAG = "v1"', 'TAG = "v2"'))
    eventually(lambda: "jobs.py changed" in pool.log(), "the change seen", 10)
    n = iter(range(1, 1000))

    def new_code() -> bool:
        seed(url, range(next(n), next(n) + 1))
        time.sleep(0.2)
        return any(row[2] == "v2" for row in rows(project))

    eventually(new_code, "a message handled by the new code", 10, 0.1)
    assert pool.stop() == 0


def test_reload_without_watchfiles_is_one_line_naming_the_extra(project):
    blocker = project / "block"
    blocker.mkdir()
    # sys.modules[name] = None makes importlib.util.find_spec(name) answer None.
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['watchfiles'] = None\n")
    assert HERMES is not None
    result = subprocess.run(
        [HERMES, "worker", "--handlers", "jobs:HANDLERS", "--reload"],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(blocker)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "hermes: error: --reload needs the file-watching library watchfiles: "
        "pip install 'hermes-core[reload]'"
    ]


def test_sighup_replaces_every_child_without_losing_a_job(project, pools):
    url = file_url(project)
    seed(url, range(150))
    pool = start(
        pools,
        project,
        "--url",
        url,
        "--handlers",
        "jobs:HANDLERS",
        "--processes",
        "2",
        "--concurrency",
        "2",
        env={"JOBS_SLEEP_S": "0.02"},
    )
    before = eventually(lambda: len(pool.children()) == 2 and pool.children(), "children", 20)
    eventually(lambda: len(handled(project)) >= 20, "20 handled", 20)
    pool.proc.send_signal(signal.SIGHUP)
    eventually(lambda: "SIGHUP: every worker process replaced" in pool.log(), "the roll", 30)
    after = pool.children()
    assert len(after) == 2 and not set(after) & set(before)
    eventually(lambda: len(handled(project)) == 150, "150 handled", 60)
    assert pool.stop() == 0
    counts = handled(project)
    assert set(counts) == set(range(150)) and max(counts.values()) == 1
    assert "2 replaced by a rolling restart" in pool.stdout.read_text()


def test_a_shutdown_request_stops_the_whole_pool(project, pools):
    url = file_url(project)
    flag = project / "stop-flag"
    pool = start(
        pools,
        project,
        "--url",
        url,
        "--handlers",
        "jobs:HANDLERS",
        "--processes",
        "2",
        "--shutdown-file",
        str(flag),
    )
    eventually(lambda: len(pool.children()) == 2, "two children", 20)
    assert HERMES is not None
    subprocess.run([HERMES, "shutdown", "--file", str(flag)], check=True, timeout=30)
    assert pool.wait(20) == 0
    assert "stopped for a shutdown request: stopping the pool" in pool.log()


def test_async_handlers_run_on_an_event_loop_in_each_child(project, pools):
    url = file_url(project)
    seed(url, range(30))
    pool = start(
        pools,
        project,
        "--url",
        url,
        "--handlers",
        "jobs:ASYNC_HANDLERS",
        "--processes",
        "2",
        "--concurrency",
        "4",
    )
    eventually(lambda: len(handled(project)) == 30, "30 handled", 30)
    assert pool.stop() == 0
    assert "failed 0" in pool.stdout.read_text()


def test_max_items_with_a_pool_is_one_line_pointing_at_max_jobs_per_child(project):
    assert HERMES is not None
    result = subprocess.run(
        [HERMES, "worker", "--handlers", "jobs:HANDLERS", "--processes", "2", "--max-items", "5"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-jobs-per-child N" in lines[0]


@pytest.mark.parametrize("processes", ["1"])
def test_one_process_without_pool_options_runs_no_supervisor(project, pools, processes):
    pool = start(
        pools,
        project,
        "--url",
        file_url(project),
        "--handlers",
        "jobs:HANDLERS",
        "--processes",
        processes,
    )
    eventually(lambda: "Reading priority" in pool.log(), "the worker started", 20)
    assert pool.children() == []
    assert "supervisor" not in pool.log()
    assert pool.stop() == 0


def test_a_second_sigterm_kills_the_children_at_once(project, pools):
    url = file_url(project)
    seed(url, range(4))
    pool = start(
        pools,
        project,
        "--url",
        url,
        "--handlers",
        "jobs:HANDLERS",
        "--processes",
        "2",
        "--grace",
        "60",
        env={"JOBS_SLEEP_S": "60"},
    )
    record = project / "handled.txt"
    eventually(lambda: record.exists() and record.read_text().count("start") == 2, "both busy", 20)
    children = pool.children()
    pool.proc.send_signal(signal.SIGTERM)
    eventually(lambda: "stopping 2 worker processes" in pool.log(), "the first SIGTERM", 10)
    pool.proc.send_signal(signal.SIGTERM)
    assert pool.wait(20) == 128 + signal.SIGTERM
    assert not any(Path(f"/proc/{pid}").exists() for pid in children)
    assert "killing every worker process" in pool.log()


def test_children_that_keep_crashing_end_the_pool_with_exit_2_and_the_last_cause(project, pools):
    (project / "crashing.py").write_text("import os\n\nos._exit(3)  # before any handler runs\n")
    pool = start(
        pools, project, "--url", file_url(project), "--handlers", "crashing:X", "--processes", "2"
    )
    assert pool.wait(15) == 2
    last = pool.log().splitlines()[-1]
    assert last.startswith("hermes: error: worker processes keep crashing: 5 within 10 s"), last
    assert last.endswith("exited with code 3")


#: Handlers whose broker is "down" while the file ``down`` exists: every put
#: (the retry copy's send) raises BrokerUnavailableError. The job fails on its
#: first delivery, so it needs a retry copy.
BLIPS = """
import os

from hermes.core import BrokerUnavailableError, Dispatcher, HandlerRegistry
from hermes.drivers.filesystem import FileSystemDriver

Dispatcher.retry_send_waits_s = (0.05,)
_put = FileSystemDriver.put


def put(self, items, priority=100):
    if os.path.exists("down"):
        raise BrokerUnavailableError("the broker is restarting")
    return _put(self, items, priority)


FileSystemDriver.put = put
handlers = HandlerRegistry()


@handlers.handler("job", max_retry=3, backoff=0)
def job(message):
    if message.retries == 0:
        raise RuntimeError("fails once")
    fd = os.open("handled.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{message.payload['n']}\\t{os.getpid()}\\tv1\\n".encode())
    os.close(fd)
"""


def test_a_child_whose_broker_is_briefly_unavailable_is_replaced_and_the_pool_runs_on(
    project, pools
):
    (project / "blips.py").write_text(BLIPS)
    (project / "down").write_text("")
    url = file_url(project)
    pool = start(pools, project, "--url", url, "--handlers", "blips:handlers", "--processes", "2")
    eventually(lambda: len(pool.children()) == 2, "two children", 20)
    seed(url, range(1))
    eventually(
        lambda: "a new one starts in" in pool.log() or pool.proc.poll() is not None,
        "the child whose retry copy could not be sent to leave",
        20,
        details=pool.log,
    )
    (project / "down").unlink()
    assert pool.proc.poll() is None, pool.log()
    eventually(lambda: handled(project) == {0: 1}, "the job handled by its retry", 20)
    log = pool.log()
    assert "its retry copy could not be sent after 2 attempts" in log
    assert "stopping the pool" not in log
    assert pool.stop() == 0
    # The other child may have taken the released message while the broker was still down.
    assert "died and were replaced" in pool.stdout.read_text()


#: Handlers whose module registers, in each process that imports it, a plugin
#: recording ``hermes_process_exiting`` calls: "<pid>" per call, in exiting.txt.
EXITING = """
import os

from hermes.core import hookimpl
from hermes.core.spi._registry import plugin_manager


class RecordsExit:
    @hookimpl
    def hermes_process_exiting(self):
        fd = os.open("exiting.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{os.getpid()}\\n".encode())
        os.close(fd)


plugin_manager().register(RecordsExit())


def job(message):
    fd = os.open("handled.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{message.payload['n']}\\t{os.getpid()}\\tv1\\n".encode())
    os.close(fd)


HANDLERS = {"job": job}
"""


def exiting_pids(project: Path) -> list[int]:
    path = project / "exiting.txt"
    return sorted(map(int, path.read_text().split())) if path.exists() else []


def test_a_pool_child_calls_the_exiting_hook_as_it_leaves(project, pools):
    (project / "exiting.py").write_text(EXITING)
    url = file_url(project)
    args = ["--url", url, "--handlers", "exiting:HANDLERS", "--processes", "2"]
    pool = start(pools, project, *args, "--max-jobs-per-child", "1")
    seed(url, range(2))
    eventually(lambda: len(handled(project)) == 2, "both messages handled", 20, details=pool.log)
    workers = sorted({int(pid) for _, pid, _ in rows(project)})
    eventually(
        lambda: set(workers) <= set(exiting_pids(project)),
        "each child that left at --max-jobs-per-child to call the hook",
        20,
        details=lambda: f"{exiting_pids(project)} of {workers}; the pool's log:\n{pool.log()}",
    )
    assert pool.stop() == 0


def test_a_single_worker_calls_the_exiting_hook_at_the_end_of_its_run(project, pools):
    (project / "exiting.py").write_text(EXITING)
    url = file_url(project)
    worker = start(
        pools, project, "--url", url, "--handlers", "exiting:HANDLERS", "--max-items", "1"
    )
    seed(url, range(1))
    assert worker.wait(20) == 0, worker.log()
    assert exiting_pids(project) == [worker.proc.pid]


#: A metrics plugin whose thread holds a lock for as long as it runs -- a queue-depth
#: sampler stuck in its broker client's call, that client's lock taken -- and a
#: ``hermes`` run with it registered. ``threads.txt`` gets one line per fork of the
#: supervisor: how many threads the process had at that moment.
HOLDER = """
import threading

LOCK = threading.Lock()


def hold():
    held = threading.Event()

    def run():
        with LOCK:
            held.set()
            threading.Event().wait()

    threading.Thread(target=run, name="metrics-sampler", daemon=True).start()
    held.wait()
"""

RUN_WITH_METRICS_PLUGIN = """
import os
import sys

import holder
from hermes.core import hookimpl
from hermes.core.cli import main
from hermes.core.spi._registry import plugin_manager

SUPERVISOR = os.getpid()


def count_threads():
    if os.getpid() == SUPERVISOR:
        threads = len(os.listdir("/proc/self/task"))
        fd = os.open("threads.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{threads}\\n".encode())
        os.close(fd)


os.register_at_fork(before=count_threads)


class Metrics:
    @hookimpl
    def hermes_worker_metrics(self, port, url, host):
        holder.hold()
        return f"http://{host}:{port}/metrics"


plugin_manager().register(Metrics())
sys.exit(main(sys.argv[1:]))
"""

#: A handler that needs the lock the metrics plugin's thread holds in its own process.
LOCKING_JOBS = """
import os

import holder


def job(message):
    got = holder.LOCK.acquire(timeout=5)
    if got:
        holder.LOCK.release()
    line = f"{message.payload['n']}\\t{os.getpid()}\\t{'free' if got else 'held'}\\n"
    fd = os.open("handled.txt", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.close(fd)


HANDLERS = {"job": job}
"""


def _with_metrics_plugin(project: Path) -> list[str]:
    (project / "holder.py").write_text(HOLDER)
    (project / "run_hermes.py").write_text(RUN_WITH_METRICS_PLUGIN)
    (project / "locking.py").write_text(LOCKING_JOBS)
    return [sys.executable, str(project / "run_hermes.py")]


def test_a_child_never_inherits_a_lock_held_by_a_thread_of_the_metrics_server(project, pools):
    url = file_url(project)
    pool = start(
        pools,
        project,
        "--url", url, "--handlers", "locking:HANDLERS", "--processes", "2",
        "--metrics-port", "9", "--max-jobs-per-child", "2",
        command=_with_metrics_plugin(project),
    )  # fmt: skip
    seed(url, range(6))
    eventually(lambda: len(rows(project)) == 6, "6 messages handled", 30, details=pool.log)
    # Each child took the lock at once: no thread of the supervisor held it when it forked.
    assert [row[2] for row in rows(project)] == ["free"] * 6, pool.log()
    assert pool.stop() == 0, pool.log()


def test_the_supervisor_forks_only_while_it_runs_no_other_thread(project, pools):
    url = file_url(project)
    pool = start(
        pools,
        project,
        "--url", url, "--handlers", "locking:HANDLERS", "--processes", "2",
        "--metrics-port", "9", "--reload", "--max-jobs-per-child", "1",
        command=_with_metrics_plugin(project),
    )  # fmt: skip
    seed(url, range(3))
    eventually(lambda: len(rows(project)) == 3, "3 messages handled", 30, details=pool.log)
    assert pool.stop() == 0, pool.log()
    forks = (project / "threads.txt").read_text().split()
    assert set(forks) == {"1"}, forks
    assert len(forks) >= 5, forks  # 2 children, and the replacements of the 3 that left
    assert "Threads run in the supervisor" not in pool.log()


def test_reload_dir_watches_the_directory_given_instead_of_the_handlers_package(project, pools):
    url = file_url(project)
    lib = project / "lib"
    lib.mkdir()
    pool = start(
        pools, project, "--url", url, "--handlers", "jobs:HANDLERS", "--reload",
        "--reload-dir", str(lib),
    )  # fmt: skip
    eventually(lambda: "Started worker-1" in pool.log(), "the first worker", 20)
    assert f"restarted when a .py file changes under {lib}" in pool.log()

    edits = iter(range(1000))

    def edited() -> bool:
        # Written again until seen: the watcher may start watching after the first worker.
        (lib / "helpers.py").write_text(f"VALUE = {next(edits)}\n")
        time.sleep(0.2)
        return "helpers.py changed" in pool.log()

    eventually(edited, "the change seen", 20, 0.1)
    eventually(lambda: pool.log().count("Started worker-1") >= 2, "the worker started anew", 20)
    assert pool.stop() == 0


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--reload-dir", "."], "--reload-dir says what --reload watches: give --reload too"),
        (["--reload", "--reload-dir", "nowhere"], "--reload-dir nowhere: no such directory"),
    ],
)
def test_a_reload_dir_without_reload_or_a_directory_is_one_line(project, args, error):
    done = subprocess.run(
        [HERMES, "worker", "--url", file_url(project), "--handlers", "jobs:HANDLERS", *args],
        cwd=project, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == f"hermes: error: {error}"
