"""SPEC §9: the ``hermes`` command, run as a user runs it -- the installed console script."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hermes_test_support import eventually

#: The venv's console script, the very file `pip install hermes-core` puts on PATH.
HERMES = shutil.which("hermes", path=str(Path(sys.executable).parent)) or shutil.which("hermes")
#: Longest any one command may take here; a hang fails the test instead of the suite.
COMMAND_TIMEOUT_S = 60

pytestmark = pytest.mark.skipif(HERMES is None, reason="the hermes console script is not installed")

HANDLERS_MODULE = '''
import json
import os
import time

from hermes.core import RetryMixin, RetryableHandler


class Record:
    """Appends each message to handled.jsonl in the current directory."""

    def handle(self, message):
        with open("handled.jsonl", "a") as file:
            row = {"id": message.id, "type": message.type, "payload": message.payload,
                   "execute_at": message.execute_at, "retries": message.retries,
                   "handled_at": time.time()}
            file.write(json.dumps(row) + "\\n")
        return True


class Flaky(RetryMixin, RetryableHandler):
    def handle(self, message):
        raise RuntimeError("flaky handler failed on purpose")


def register(dispatcher):
    dispatcher.register_handler("job", Record())
    dispatcher.register_handler("flaky", Flaky())


HANDLERS = {"job": Record, "flaky": [Flaky()]}
'''


def hermes(
    *args: str, cwd: Path, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``hermes ARGS`` in ``cwd`` without ``$HERMES_URL`` (unless ``env`` sets it)."""
    assert HERMES is not None
    environ = {k: v for k, v in os.environ.items() if k != "HERMES_URL"}
    environ.update(env or {})
    return subprocess.run(
        [HERMES, *args],
        cwd=cwd,
        input=input,
        env=environ,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


@contextlib.contextmanager
def running_hermes(*args: str, cwd: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """``hermes ARGS`` in the background, its stdout and stderr to a file; killed at the end."""
    assert HERMES is not None
    environ = {k: v for k, v in os.environ.items() if k != "HERMES_URL"}
    output = cwd / f"hermes-{uuid.uuid4().hex[:8]}.out"
    with output.open("w") as out:
        proc = subprocess.Popen(
            [HERMES, *args], cwd=cwd, env=environ, stdout=out, stderr=subprocess.STDOUT, text=True
        )
    try:
        yield proc, output
    finally:
        proc.kill()
        proc.wait()


#: How long a test waits for a worker process (start-up included) to do something.
WORKER_S = 30.0


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The run failed the way a user mistake must: exit 2, one stderr line, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hermes: error: ")
    return lines[0]


def seed(url: str, *messages: tuple[str, Any, int]) -> None:
    """Put ``(type, payload, priority)`` messages on ``url`` through the Python API.

    For tests of ``hermes worker``, where ``hermes emit`` is not the subject.
    """
    from hermes.core import DEFAULT_PRIORITY, Message, connect

    with connect(url) as driver:
        for priority in {p for _, _, p in messages} - {DEFAULT_PRIORITY}:
            driver.setup_priority_queue(f"p{priority}", priority)
        for type_, payload, priority in messages:
            driver.send(Message(type_, payload), priority)


def handled(cwd: Path) -> list[dict[str, Any]]:
    path = cwd / "handled.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory with the user's handlers module, jobs.py, in it."""
    (tmp_path / "jobs.py").write_text(HANDLERS_MODULE)
    return tmp_path


@pytest.fixture
def queue_url(tmp_path: Path) -> str:
    """A ``file://`` queue of this test's own."""
    return (tmp_path / "queue").as_uri()


@pytest.fixture
def redis_test_db_url(redis_url: str) -> Iterator[str]:
    """A Redis database away from other tests' (db 14), with keys of this test's own.

    The shutdown key (``hermes_shutdown``) is per database, so a shutdown asked
    here stops no other test's worker.
    """
    pytest.importorskip("hermes.drivers.redis", reason="hermes-redis is not installed")
    import redis

    base = redis_url.rsplit("/", 1)[0] + "/14"
    key = f"cli-test-{uuid.uuid4().hex[:8]}"
    yield f"{base}?key={key}&schedule_key={key}_schedule"
    client = redis.Redis.from_url(base)
    client.delete(key, f"{key}_schedule", f"{key}_wakeup", "hermes_shutdown")
    client.close()


# hermes drivers, --version, help -------------------------------------------------


def test_drivers_lists_each_installed_driver_with_its_distribution_and_capabilities(
    tmp_path: Path,
) -> None:
    result = hermes("drivers", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "DISTRIBUTION",
        "VERSION",
        "SCHEMES",
        "DELIVERY",
        "DELAY",
        "PRIORITIES",
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:] if line and line[0] != " "}
    assert rows["memory"] == [
        "memory",
        "hermes-core",
        "6.0.0",
        "memory://",
        "at-least-once",
        "native",
        "yes",
    ]
    assert rows["filesystem"][1] == "hermes-filesystem"
    assert rows["filesystem"][3:] == ["file://", "at-least-once", "native", "yes"]


def test_version_names_the_hermes_core_distribution(tmp_path: Path) -> None:
    result = hermes("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert re.fullmatch(r"hermes-core \d+\.\d+\.\d+\S*\n", result.stdout)


def test_no_subcommand_prints_the_help_and_exits_2(tmp_path: Path) -> None:
    result = hermes(cwd=tmp_path)
    assert result.returncode == 2
    for command in ("worker", "emit", "drivers", "shutdown", "demo"):
        assert command in result.stderr


# hermes emit and hermes worker ------------------------------------------------------


def test_messages_emitted_before_the_worker_starts_are_handled_and_counted(
    project: Path, queue_url: str
) -> None:
    one = hermes("emit", "--url", queue_url, "job", '{"n": 1}', cwd=project)
    assert one.returncode == 0, one.stderr
    assert re.match(r"Emitted message #[0-9a-f-]{36} \(job\) priority:100 to file://", one.stdout)
    piped = hermes("emit", "--url", queue_url, "job", "-", cwd=project, input='{"n": 2}\n')
    assert piped.returncode == 0, piped.stderr

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "2", cwd=project
    )

    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert [row["payload"] for row in handled(project)] == [{"n": 1}, {"n": 2}]
    assert worker.stdout.splitlines()[-1].endswith("received 2, handled 2, failed 0, retried 0"), (
        worker.stdout
    )
    assert "Handlers: job -> Record; flaky -> Flaky" in worker.stdout
    assert worker.stderr == ""


def test_every_event_of_the_worker_is_one_timestamped_line(project: Path, queue_url: str) -> None:
    seed(queue_url, ("job", None, 100))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:HANDLERS", "--max-items", "1", cwd=project
    )

    assert worker.returncode == 0, worker.stdout + worker.stderr
    log_lines = worker.stdout.splitlines()[:-1]
    assert log_lines, worker.stdout
    for line in log_lines:
        assert re.match(r"\d\d:\d\d:\d\d (INFO|NOTICE|WARNING|ERROR) +\S", line), line
    assert not any("handle message" in x for x in log_lines), worker.stdout


def test_a_verbose_worker_logs_each_message_as_it_starts_and_ends(
    project: Path, queue_url: str
) -> None:
    seed(queue_url, ("job", None, 100))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:HANDLERS", "--max-items", "1", "-v",
        cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    log_lines = worker.stdout.splitlines()
    assert any(re.search(r"Start handle message #\S+ \(job\) priority:100$", x) for x in log_lines)
    assert any(re.search(r"End handle message #\S+ \(job\)$", x) for x in log_lines)


def test_a_failing_handler_is_one_error_line_and_its_retry_is_counted(
    project: Path, queue_url: str
) -> None:
    seed(queue_url, ("flaky", None, 100))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:HANDLERS", "--max-items", "1", cwd=project
    )

    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert "Traceback" not in worker.stdout
    errors = [line for line in worker.stdout.splitlines() if " ERROR " in line]
    assert len(errors) == 1
    assert errors[0].endswith(
        "Handler Flaky throws exception - flaky handler failed on purpose "
        "[RuntimeError at jobs.py:23]"
    )
    assert re.search(r"scheduled for retry 1 at \d+\.\d+$", worker.stdout, re.MULTILINE)
    assert worker.stdout.splitlines()[-1].endswith("received 1, handled 0, failed 1, retried 1")


def test_verbose_worker_shows_the_full_traceback(project: Path, queue_url: str) -> None:
    seed(queue_url, ("flaky", None, 100))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "1", "-v",
        cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert "Traceback (most recent call last)" in worker.stdout
    assert 'jobs.py", line 23, in handle' in worker.stdout


def test_quiet_worker_prints_only_problems_and_the_counts(project: Path, queue_url: str) -> None:
    seed(queue_url, ("job", None, 100))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "1", "-q",
        cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    lines = worker.stdout.splitlines()
    assert len(lines) == 1, worker.stdout
    assert lines[0].endswith("received 1, handled 1, failed 0, retried 0")


def test_a_worker_given_priorities_reads_only_those(project: Path, queue_url: str) -> None:
    seed(queue_url, ("job", "default", 100), ("job", "high", 200), ("job", "low", 50))

    high = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--priority", "200",
        "--max-items", "1", cwd=project,
    )  # fmt: skip
    assert high.returncode == 0, high.stdout + high.stderr
    assert [row["payload"] for row in handled(project)] == ["high"]

    rest = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--priority", "50",
        "--priority", "100", "--max-items", "2", cwd=project,
    )  # fmt: skip
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert [row["payload"] for row in handled(project)] == ["high", "default", "low"]


def test_a_delayed_emit_carries_its_execute_at_and_is_handled_no_sooner(
    project: Path, queue_url: str
) -> None:
    before = time.time()
    delayed = hermes("emit", "--url", queue_url, "job", '"later"', "--delay", "1.5", cwd=project)
    at = hermes("emit", "--url", queue_url, "job", '"at"', "--at", "2001-02-03T04:05:06+00:00",
                cwd=project)  # fmt: skip
    assert delayed.returncode == 0 and at.returncode == 0, delayed.stderr + at.stderr
    assert re.search(r"priority:100, execute_at \d\d:\d\d:\d\d to file://", delayed.stdout)

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "2", cwd=project
    )

    assert worker.returncode == 0, worker.stdout + worker.stderr
    rows = {row["payload"]: row for row in handled(project)}
    assert rows["at"]["execute_at"] == 981173106.0
    assert before + 1.5 <= rows["later"]["execute_at"] <= time.time() + 1.5
    assert rows["later"]["handled_at"] >= rows["later"]["execute_at"]


def test_count_emits_that_many_messages_and_reports_the_rate(project: Path, queue_url: str) -> None:
    emitted = hermes("emit", "--url", queue_url, "job", '{"bulk": true}', "--count", "250",
                     cwd=project)  # fmt: skip
    assert emitted.returncode == 0, emitted.stderr
    assert re.fullmatch(
        r"Emitted 250 messages \(job\) priority:100 to file://\S+ in \d+\.\d\d s: [\d,]+ msg/s\n",
        emitted.stdout,
    )

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "250", "-q",
        cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    rows = handled(project)
    assert len(rows) == 250
    assert len({row["id"] for row in rows}) == 250


def test_the_url_defaults_to_hermes_url_then_a_queue_in_the_current_directory(
    project: Path, tmp_path: Path
) -> None:
    local = hermes("emit", "job", '"local"', cwd=project)
    assert local.returncode == 0, local.stderr
    assert f"to {(project / 'hermes-queue').as_uri()}" in local.stdout
    elsewhere = (tmp_path / "elsewhere").as_uri()
    env = hermes("emit", "job", '"env"', cwd=project, env={"HERMES_URL": elsewhere})
    assert env.returncode == 0, env.stderr
    assert f"to {elsewhere}" in env.stdout

    worker = hermes("worker", "--handlers", "jobs:register", "--max-items", "1", cwd=project)

    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert [row["payload"] for row in handled(project)] == ["local"]


# Stopping workers -------------------------------------------------------------------


def test_shutdown_file_stops_a_running_worker(project: Path, queue_url: str) -> None:
    stop_file = project / "stop"
    with running_hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--shutdown-file",
        str(stop_file), cwd=project,
    ) as (worker, output):  # fmt: skip
        seed(queue_url, ("job", "first", 100))
        eventually(
            lambda: len(handled(project)) == 1, "the worker handling the first message", WORKER_S
        )

        stop = hermes("shutdown", "--file", str(stop_file), cwd=project)

        assert stop.returncode == 0, stop.stderr
        assert "Asked every worker watching" in stop.stdout
        assert worker.wait(timeout=30) == 0
    text = output.read_text()
    assert "NOTICE Exiting hermes dispatcher - shutdown" in text
    assert text.splitlines()[-1].endswith("received 1, handled 1, failed 0, retried 0")


def test_sigterm_stops_a_worker_after_its_message_and_prints_the_counts(
    project: Path, queue_url: str
) -> None:
    with running_hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", cwd=project
    ) as (worker, output):
        seed(queue_url, ("job", None, 100))
        eventually(lambda: len(handled(project)) == 1, "the worker handling the message", WORKER_S)

        worker.send_signal(signal.SIGTERM)

        assert worker.wait(timeout=30) == 0
    text = output.read_text()
    assert "Received SIGTERM, stopping after the message in progress" in text
    assert text.splitlines()[-1].endswith("handled 1, failed 0, retried 0")


def test_shutdown_by_redis_url_stops_a_worker_on_that_redis(
    project: Path, redis_test_db_url: str
) -> None:
    with running_hermes(
        "worker", "--url", redis_test_db_url, "--handlers", "jobs:register", cwd=project
    ) as (worker, output):
        hermes("emit", "--url", redis_test_db_url, "job", cwd=project)
        eventually(lambda: len(handled(project)) == 1, "the worker handling the message", WORKER_S)
        time.sleep(1)  # RedisShutdown compares whole seconds: ask in a later second than the start

        stop = hermes("shutdown", "--url", redis_test_db_url, cwd=project)

        assert stop.returncode == 0, stop.stderr
        assert worker.wait(timeout=30) == 0
    assert "NOTICE Exiting hermes dispatcher - shutdown" in output.read_text()


def test_shutdown_by_a_url_that_is_not_redis_says_to_use_a_file(
    tmp_path: Path, queue_url: str
) -> None:
    line = assert_one_line_error(hermes("shutdown", "--url", queue_url, cwd=tmp_path))
    assert "shutdown by URL needs Redis" in line
    assert "--file" in line


def test_shutdown_without_a_target_says_what_to_give(tmp_path: Path) -> None:
    line = assert_one_line_error(hermes("shutdown", cwd=tmp_path))
    assert "--file F" in line and "--url redis://" in line


# Mistakes a user makes: one line on stderr, exit code 2 ---------------------------


def test_an_unknown_scheme_lists_the_installed_drivers_and_hides_the_password(
    tmp_path: Path,
) -> None:
    line = assert_one_line_error(
        hermes("emit", "--url", "nats://ana:s3cret@localhost:4222/jobs", "job", cwd=tmp_path)
    )
    assert "no installed Hermes driver handles nats://" in line
    assert "memory://" in line and "file://" in line
    assert "s3cret" not in line
    assert "nats://ana:***@localhost:4222/jobs" in line


def core_only_environment(root: Path) -> dict[str, str]:
    """The environment of a Python that has hermes-core and pluggy and no driver at all.

    ``python -S`` skips site-packages; ``root`` gets links to hermes.core, pluggy
    and hermes-core's metadata (its ``hermes`` entry point registers memory://).
    """
    import importlib.metadata

    import pluggy

    import hermes.core

    site = root / "site"
    (site / "hermes").mkdir(parents=True)
    (site / "hermes" / "core").symlink_to(Path(hermes.core.__file__).parent)
    (site / "pluggy").symlink_to(Path(pluggy.__file__).parent)
    core = importlib.metadata.distribution("hermes-core")
    dist_info = Path(str(core.locate_file(""))) / f"hermes_core-{core.version}.dist-info"
    assert dist_info.is_dir(), dist_info
    (site / dist_info.name).symlink_to(dist_info)
    environ = {k: v for k, v in os.environ.items() if k not in ("HERMES_URL", "PYTHONPATH")}
    environ["PYTHONPATH"] = str(site)
    return environ


def test_a_known_scheme_whose_driver_is_missing_names_the_pip_install(tmp_path: Path) -> None:
    assert HERMES is not None
    result = subprocess.run(
        [sys.executable, "-S", HERMES, "emit", "--url", "amqp://guest:s3cret@localhost/", "job"],
        cwd=tmp_path,
        env=core_only_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )

    line = assert_one_line_error(result)
    assert "no installed Hermes driver handles amqp://" in line
    assert "installed schemes: memory://;" in line
    assert "`pip install hermes-rabbitmq` adds it" in line
    assert "s3cret" not in line


def test_an_unreachable_broker_names_its_host_and_port(tmp_path: Path) -> None:
    pytest.importorskip("hermes.drivers.redis", reason="hermes-redis is not installed")

    line = assert_one_line_error(
        hermes("emit", "--url", "redis://:s3cret@127.0.0.1:1/0", "job", cwd=tmp_path)
    )

    assert "unreachable" in line
    assert "127.0.0.1:1" in line
    assert "s3cret" not in line


def test_a_worker_whose_broker_is_unreachable_names_its_host_and_port(project: Path) -> None:
    pytest.importorskip("hermes.drivers.rabbitmq", reason="hermes-rabbitmq is not installed")

    result = hermes(
        "worker", "--url", "amqp://guest:s3cret@127.0.0.1:1/", "--handlers", "jobs:register",
        cwd=project,
    )  # fmt: skip

    line = assert_one_line_error(result)
    assert "unreachable" in line
    assert "127.0.0.1:1" in line
    assert "s3cret" not in result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].endswith("received 0, handled 0, failed 0, retried 0")


def test_output_piped_into_a_closed_reader_ends_quietly(tmp_path: Path) -> None:
    assert HERMES is not None
    result = subprocess.run(
        f"'{HERMES}' drivers | head -1", shell=True, cwd=tmp_path, capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip
    assert result.stdout.startswith("NAME")
    assert result.stderr == ""


def test_a_malformed_payload_shows_where_with_a_caret(tmp_path: Path) -> None:
    result = hermes("emit", "--url", "memory://cli", "job", '{"a": 1 "b": 2}', cwd=tmp_path)

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error, excerpt, caret = result.stderr.splitlines()
    assert error == (
        "hermes: error: PAYLOAD_JSON is not valid JSON: Expecting ',' delimiter at line 1, column 9"
    )
    assert excerpt.strip() == '{"a": 1 "b": 2}'
    assert excerpt[caret.index("^") :].startswith('"b"')


def test_a_malformed_payload_on_stdin_names_its_line(tmp_path: Path) -> None:
    result = hermes(
        "emit", "--url", "memory://cli", "job", "-", cwd=tmp_path, input='{\n  "a": tru\n}\n'
    )

    assert result.returncode == 2
    error, excerpt, caret = result.stderr.splitlines()
    assert "the payload on stdin is not valid JSON" in error
    assert "at line 2, column 8" in error
    assert excerpt[caret.index("^") :] == "tru"


def test_a_bad_at_time_is_one_line(tmp_path: Path) -> None:
    line = assert_one_line_error(
        hermes("emit", "--url", "memory://cli", "job", "--at", "tomorrow", cwd=tmp_path)
    )
    assert "--at 'tomorrow'" in line


@pytest.mark.parametrize(
    ("module", "spec", "expected"),
    [
        (None, "missing:register", "cannot import handlers module 'missing': no module named"),
        ("raise ZeroDivisionError('boom')\n", "jobs2:register",
         "cannot import handlers module 'jobs2': it raised ZeroDivisionError: boom (jobs2.py:1)"),
        ("import not_installed_anywhere\n", "jobs2:register",
         "cannot import handlers module 'jobs2': it imports 'not_installed_anywhere', "
         "which is not installed"),
        ("def register(:\n", "jobs2:register",
         "cannot import handlers module 'jobs2': SyntaxError at jobs2.py:1"),
        ("x = 1\n", "jobs2:register", "handlers module 'jobs2' ("),
        ("x = 1\n", "jobs2", "must be module:object"),
        ("class H:\n    def handle(self, m):\n        return True\n", "jobs2:H",
         "is a handler, not a registration"),
        ("def register(d):\n    pass\n", "jobs2:register", "registered no handlers"),
    ],
)  # fmt: skip
def test_handlers_that_do_not_load_say_which_module_and_why(
    tmp_path: Path, queue_url: str, module: str | None, spec: str, expected: str
) -> None:
    if module is not None:
        (tmp_path / "jobs2.py").write_text(module)

    line = assert_one_line_error(
        hermes("worker", "--url", queue_url, "--handlers", spec, cwd=tmp_path)
    )

    assert expected in line
