"""The metrics a worker exports: counted from the Dispatcher's hooks, served over HTTP."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from hermes.core import Dispatcher as CoreDispatcher
from hermes.core import Emitter, Limit, Message, RetryableHandler, RetryMixin, Worker, connect
from hermes.core.compat import Dispatcher
from hermes.core.drivertools import MemoryDriver
from hermes.core.jobs import Jobs

DEADLINE_S = 30.0
#: The sampled ready count of the default queue, in the exposition format.
READY = r'hermes_queue_messages\{priority="100",queue="[^"]*",state="ready"\}'


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class StopWhen:
    def __init__(self, condition: Callable[[], bool]) -> None:
        self.condition = condition
        self.deadline = time.monotonic() + DEADLINE_S

    def should_shutdown(self, start_time: float) -> bool:
        return self.condition() or time.monotonic() > self.deadline

    def shutdown(self, at: float | None = None) -> bool:
        return False


class Flaky(RetryMixin, RetryableHandler):
    def handle(self, message: Message) -> bool:
        if message.payload["outcome"] == "raise":
            raise RuntimeError("flaky")
        time.sleep(0.01)
        return message.payload["outcome"] == "ok"


def test_a_dispatcher_counts_each_outcome_per_type_and_times_each_handler() -> None:
    kind = f"metrics-{os.getpid()}-{time.monotonic_ns()}"
    before_in_flight = value("hermes_messages_in_flight")
    driver = MemoryDriver(kind)
    for outcome in ("ok", "ok", "false", "raise"):
        driver.send(Message(kind, {"outcome": outcome}))
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: dispatcher.stats.received == 4))
    dispatcher.register_handler(kind, Flaky())
    dispatcher.handle()

    assert value("hermes_messages_received_total", type=kind) == 4
    assert value("hermes_messages_handled_total", type=kind) == 2
    assert value("hermes_messages_failed_total", type=kind, reason="returned False") == 1
    assert value("hermes_messages_failed_total", type=kind, reason="raised") == 1
    assert value("hermes_messages_retried_total", type=kind) == 1
    assert value("hermes_messages_gave_up_total", type=kind, reason="returned False") == 1
    assert value("hermes_handler_duration_seconds_count", type=kind) == 4
    assert value("hermes_handler_duration_seconds_sum", type=kind) >= 0.03  # three slept 10 ms
    assert value("hermes_messages_in_flight") == before_in_flight
    driver.teardown()


def test_a_job_over_its_limit_is_counted_as_deferred_not_as_received() -> None:
    kind = f"limited-{os.getpid()}-{time.monotonic_ns()}"
    driver = MemoryDriver(kind)
    dispatcher = CoreDispatcher(driver).limit(kind, Limit(rate="1/h"))
    dispatcher.register_handler(kind, lambda message: None)
    with dispatcher.running():
        for n in range(3):
            dispatcher.handle_message(Message(kind, {"n": n}), 100)

    assert value("hermes_messages_deferred_total", type=kind) == 2
    assert value("hermes_messages_received_total", type=kind) == 1
    driver.teardown()


def test_messages_without_a_handler_leave_the_in_flight_gauge_where_it_was() -> None:
    kind = f"unhandled-{os.getpid()}-{time.monotonic_ns()}"
    before_in_flight = value("hermes_messages_in_flight")
    seen_in_flight: list[float] = []
    driver = MemoryDriver(kind)
    for _ in range(3):
        driver.send(Message(f"{kind}-nobody"))
    driver.send(Message(kind))
    dispatcher = Dispatcher(driver, shutdown=StopWhen(lambda: dispatcher.stats.received == 4))
    dispatcher.register_handler(
        kind, lambda m: seen_in_flight.append(value("hermes_messages_in_flight"))
    )
    dispatcher.handle()

    assert value("hermes_messages_gave_up_total", type=f"{kind}-nobody", reason="no handler") == 3
    assert seen_in_flight == [before_in_flight + 1]  # counted up while its handler ran
    assert value("hermes_messages_in_flight") == before_in_flight  # and never below
    driver.teardown()


def test_jobs_are_counted_by_the_final_state_their_records_reach() -> None:
    kind = f"jobs-{os.getpid()}-{time.monotonic_ns()}"
    driver = MemoryDriver(kind)
    jobs = Jobs(MemoryDriver(f"{kind}-records"))
    emitter = Emitter(driver, records=jobs)
    for outcome in ("ok", "ok", "false"):
        emitter.emit(Message(kind, {"outcome": outcome}))
    cancelled = Message(kind, {"outcome": "ok"})
    emitter.emit(cancelled)
    jobs.cancel(cancelled.id)
    dispatcher = CoreDispatcher(driver, records=jobs)
    dispatcher.register_handler(kind, lambda m: m.payload["outcome"] == "ok")

    Worker(driver, dispatcher, max_items=4, handle_signals=False).run()

    assert value("hermes_jobs_finished_total", type=kind, state="succeeded") == 2
    assert value("hermes_jobs_finished_total", type=kind, state="given_up") == 1
    assert value("hermes_jobs_finished_total", type=kind, state="cancelled") == 1
    assert value("hermes_jobs_finished_total", type=kind, state="lost") == 0
    driver.teardown()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return None


def _sample(text: str, pattern: str) -> float | None:
    match = re.search(rf"^{pattern} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("hermes.drivers.filesystem") is None,
    reason="the worker process shares its queue through hermes-filesystem's file:// driver",
)
def test_hermes_worker_serves_counters_histogram_and_queue_depth_over_http(
    tmp_path: Path,
) -> None:
    (tmp_path / "jobs.py").write_text(
        textwrap.dedent(
            """
            class Returns:
                def __init__(self, result):
                    self.result = result

                def handle(self, message):
                    return self.result


            def register(dispatcher):
                dispatcher.register_handler("job", Returns(True))
                dispatcher.register_handler("refused", Returns(False))
            """
        )
    )
    url = (tmp_path / "queue").as_uri()
    emitter = Emitter(connect(url))
    for _ in range(3):
        emitter.emit(Message("job", {}))
    emitter.emit(Message("refused", {}))
    emitter.emit(Message("job", {}), 100)
    port = _free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "hermes.core.cli", "worker", "--url", url, "--handlers",
         "jobs:register", "--metrics-port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + DEADLINE_S
        text = ""
        while time.monotonic() < deadline:
            text = _scrape(port) or ""
            handled = _sample(text, r'hermes_messages_handled_total\{type="job"\}')
            ready = _sample(
                text, r'hermes_queue_messages\{priority="100",queue="[^"]*",state="ready"\}'
            )
            if handled == 4 and ready == 0:
                break
            time.sleep(0.2)
        assert _sample(text, r'hermes_messages_handled_total\{type="job"\}') == 4, text
        assert _sample(text, r'hermes_messages_received_total\{type="refused"\}') == 1, text
        assert (
            _sample(text, r'hermes_messages_failed_total\{reason="returned False",type="refused"\}')
            == 1
        ), text
        assert _sample(text, r'hermes_handler_duration_seconds_count\{type="job"\}') == 4, text
        assert _sample(text, r"hermes_messages_in_flight") == 0, text
        assert _sample(text, READY) == 0, text
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=DEADLINE_S)[0].decode()
    assert worker.returncode == 0, output
    assert f"Metrics on http://127.0.0.1:{port}/metrics" in output, output


def test_metrics_port_without_a_metrics_plugin_says_what_to_install(tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text(
        "from hermes.core import EchoHandler\n"
        "def register(dispatcher):\n"
        "    dispatcher.register_handler('j', EchoHandler())\n"
    )
    code = textwrap.dedent(
        """
        import sys
        from hermes.core.drivertools import plugin_manager
        plugin_manager().unregister(name="prometheus")
        from hermes.core.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "worker", "--url", "memory://m", "--handlers",
         "jobs:register", "--metrics-port", "9"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "--metrics-port needs a metrics plugin: pip install hermes-prometheus" in done.stderr


def test_hermes_plugins_lists_it_with_the_hooks_it_implements() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hermes.core.cli", "plugins"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done
    [line] = [line for line in done.stdout.splitlines() if line.startswith("prometheus ")]
    assert "hermes-prometheus" in line
    assert "message_finished" in line and "worker_metrics" in line


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("hermes.drivers.filesystem") is None,
    reason="the worker processes share their queue through hermes-filesystem's file:// driver",
)
def test_a_worker_pool_serves_one_port_that_counts_every_child(tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text("HANDLERS = {'job': lambda message: None}\n")
    url = (tmp_path / "queue").as_uri()
    driver = connect(url)
    driver.send_batch([Message("job", {}) for _ in range(40)])
    port = _free_port()
    # A child is replaced every 10 messages: the dead children's counts stay in the sum.
    pool = subprocess.Popen(
        [sys.executable, "-m", "hermes.core.cli", "worker", "--url", url, "--handlers",
         "jobs:HANDLERS", "--metrics-port", str(port), "--processes", "2",
         "--max-jobs-per-child", "10"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            text = _scrape(port) or ""
            if _sample(text, r'hermes_messages_handled_total\{type="job"\}') == 40:
                break
            time.sleep(0.2)
        assert _sample(text, r'hermes_messages_handled_total\{type="job"\}') == 40, text
        assert _sample(text, r"hermes_messages_in_flight") == 0, text
    finally:
        pool.send_signal(signal.SIGTERM)
        output = pool.communicate(timeout=DEADLINE_S)[0].decode()
        driver.close()
    assert pool.returncode == 0, output
    assert output.count("Metrics on") == 1, output  # the supervisor's, not each child's


def test_async_handlers_in_flight_at_once_are_each_counted_and_timed_on_the_async_path() -> None:
    import asyncio

    from hermes.core.run._worker import handler_mix

    kind = f"metrics-async-{os.getpid()}-{time.monotonic_ns()}"
    before_in_flight = value("hermes_messages_in_flight")
    driver = MemoryDriver(kind)
    for n in range(10):
        driver.send(Message(kind, {"n": n}))
    seen_in_flight: list[float] = []

    async def handle(message: Message) -> None:
        await asyncio.sleep(0.05)
        seen_in_flight.append(value("hermes_messages_in_flight") - before_in_flight)

    dispatcher = CoreDispatcher(driver)
    dispatcher.handler(kind)(handle)
    assert handler_mix(dispatcher) == "async", "the plugin keeps the async path"
    Worker(driver, dispatcher, handle_signals=False, concurrency=10, max_items=10).run()

    assert max(seen_in_flight) > 1, "several were in flight at once"
    assert value("hermes_messages_received_total", type=kind) == 10
    assert value("hermes_messages_handled_total", type=kind) == 10
    assert value("hermes_handler_duration_seconds_count", type=kind) == 10
    assert value("hermes_handler_duration_seconds_sum", type=kind) >= 10 * 0.05
    assert value("hermes_messages_in_flight") == before_in_flight
    driver.teardown()
