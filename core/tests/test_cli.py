"""The ``hermes`` command, run as a user runs it -- the installed console script."""

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

from hermes.core.driver import DriverUrl

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


class CardDeclined(Exception):
    pass


def charge_card(message):
    """Never retried: a function without max_retry goes to the store at its first failure."""
    raise CardDeclined(f"card declined for order {message.payload['order']}")


class Picky(Record):
    """Declines (returns False) until a file called "fixed" is in the current directory."""

    def handle(self, message):
        return os.path.exists("fixed") and super().handle(message)


def register(dispatcher):
    dispatcher.register_handler("job", Record())
    dispatcher.register_handler("flaky", Flaky())
    dispatcher.register_handler("picky", Picky())
    dispatcher.register_handler("charge", charge_card)


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


def names(cwd: Path) -> list[str]:
    """The ``"name"`` of each handled payload, in the order handled."""
    return [row["payload"]["name"] for row in handled(cwd)]


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
    assert re.fullmatch(r"[0-9a-f-]{36}\n", one.stdout)
    assert re.match(r"Emitted message #[0-9a-f-]{36} \(job\) priority:100 to file://", one.stderr)
    piped = hermes("emit", "--url", queue_url, "job", "-", cwd=project, input='{"n": 2}\n')
    assert piped.returncode == 0, piped.stderr

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "2", cwd=project
    )

    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert [row["payload"] for row in handled(project)] == [{"n": 1}, {"n": 2}]
    (summary,) = worker.stdout.splitlines()  # stdout holds the result, stderr the log
    assert summary.endswith("received 2, handled 2, failed 0, retried 0, gave up 0"), summary
    assert "Handlers: job -> Record; flaky -> Flaky" in worker.stderr


def test_every_event_of_the_worker_is_one_timestamped_line(project: Path, queue_url: str) -> None:
    seed(queue_url, ("job", None, 100))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:HANDLERS", "--max-items", "1", cwd=project
    )

    assert worker.returncode == 0, worker.stdout + worker.stderr
    log_lines = worker.stderr.splitlines()
    assert log_lines, worker.stderr
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
    log_lines = worker.stderr.splitlines()
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
    assert "Traceback" not in worker.stderr
    errors = [line for line in worker.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1
    assert errors[0].endswith(
        "Handler Flaky throws exception - flaky handler failed on purpose "
        "[RuntimeError at jobs.py:23]"
    )
    assert re.search(
        r" WARNING Message #\S+ \(flaky\) failed in Flaky, retry 1 of 25 in \d+\.\d s "
        r"at \d\d:\d\d:\d\d$",
        worker.stderr,
        re.MULTILINE,
    ), worker.stderr
    assert worker.stdout.splitlines()[-1].endswith(
        "received 1, handled 0, failed 1, retried 1, gave up 0"
    )


def test_very_verbose_worker_shows_the_full_traceback(project: Path, queue_url: str) -> None:
    seed(queue_url, ("flaky", None, 100))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "1", "-vv",
        cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert "Traceback (most recent call last)" in worker.stderr
    assert 'jobs.py", line 23, in handle' in worker.stderr


def test_verbose_worker_adds_debug_lines_but_keeps_exceptions_on_one_line(
    project: Path, queue_url: str, tmp_path: Path
) -> None:
    seed(queue_url, ("nobody-handles-this", None, 100))
    failed_url = (tmp_path / "failed").as_uri()

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "1", "-v",
        "--failed-url", failed_url, cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert "Traceback" not in worker.stderr
    debug = [line for line in worker.stderr.splitlines() if " DEBUG " in line]
    assert any(re.search(r"kept in <FileSystemDriver file://\S+/failed> at ", x) for x in debug)


def test_quiet_worker_prints_only_problems_and_the_counts(project: Path, queue_url: str) -> None:
    seed(queue_url, ("job", None, 100))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "1", "-q",
        cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    lines = worker.stdout.splitlines()
    assert len(lines) == 1, worker.stdout
    assert lines[0].endswith("received 1, handled 1, failed 0, retried 0, gave up 0")
    assert worker.stderr == ""


def test_a_worker_given_priorities_reads_only_those(project: Path, queue_url: str) -> None:
    seed(queue_url, ("job", {"name": "default"}, 100), ("job", {"name": "high"}, 200),
         ("job", {"name": "low"}, 50))  # fmt: skip

    high = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--priority", "200",
        "--max-items", "1", cwd=project,
    )  # fmt: skip
    assert high.returncode == 0, high.stdout + high.stderr
    assert names(project) == ["high"]

    rest = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--priority", "50",
        "--priority", "100", "--max-items", "2", cwd=project,
    )  # fmt: skip
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert names(project) == ["high", "default", "low"]


def test_a_worker_given_queues_still_reads_the_default_queue(project: Path, queue_url: str) -> None:
    seed(queue_url, ("job", {"name": "default"}, 100), ("job", {"name": "high"}, 200))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--queue", "hermes_high:200",
        "--queue", "hermes_low:50", "--max-items", "2", cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert names(project) == ["high", "default"]
    assert "Reading priorities 200 (hermes_high), 100, 50 (hermes_low)" in worker.stderr


def test_an_old_queue_command_line_says_why_it_dropped_a_default_queue_message(
    project: Path, queue_url: str
) -> None:
    # `--queue NAME:P` once restricted the worker; now the default queue is read too,
    # and a message of a type another worker handled there is dropped here.
    seed(queue_url, ("job", {"name": "high"}, 200), ("order.paid", {"order": 7}, 100))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:HANDLERS", "--queue", "hermes_high:200",
        "--max-items", "2", cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    [error] = [line for line in worker.stderr.splitlines() if "ERROR" in line]
    assert "No handlers registered for message #" in error
    assert "(order.paid); dropped - this worker (--handlers jobs:HANDLERS) handles 'job', " in error
    assert "'flaky'; it reads priority 100 besides --queue hermes_high:200 because " in error
    assert "to read only those queues as before, add --priority 200;" in error
    assert "give --handlers a handler for 'order.paid'" in error


@pytest.mark.parametrize(
    ("options", "why"),
    [
        (["--queue", "hermes_high:200"], "it reads priority 200 (hermes_high) because of --queue "
         "hermes_high:200, and a worker on a queue needs a handler for every type sent there"),
        (["--priority", "200"], "it reads priority 200 because --priority 200 says so: "
         "give --handlers a handler for 'order.paid', or leave priority 200 to a worker"),
        (["--url-queue"], "it reads priority 200 (p200) as it reads every queue it knows without "
         "--priority: give --handlers a handler for 'order.paid', or give --priority"),
    ],
    ids=["queue", "priority", "default"],
)  # fmt: skip
def test_a_message_without_a_handler_is_one_line_that_says_why_this_worker_read_it(
    project: Path, queue_url: str, options: list[str], why: str
) -> None:
    if options == ["--url-queue"]:  # a queue the worker reads by default: the URL names it
        queue_url, options = f"{queue_url}?priority_queues=p200:200", []
    seed(queue_url, ("order.paid", {"order": 7}, 200))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", *options, "--max-items", "1",
        cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    [error] = [line for line in worker.stderr.splitlines() if "ERROR" in line]
    assert "(order.paid); dropped - this worker (--handlers jobs:register) handles 'job', " in error
    assert why in error


def test_a_worker_restricted_by_priority_says_what_it_leaves_unread(
    project: Path, queue_url: str
) -> None:
    seed(queue_url, ("job", {"name": "high"}, 200))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--priority", "200",
        "--max-items", "1", cwd=project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    [warning] = [line for line in worker.stderr.splitlines() if "WARNING" in line]
    assert "does not read priority 100" in warning
    assert "where retry copies land" in warning


def test_worker_help_says_which_queue_option_adds_and_which_restricts(tmp_path: Path) -> None:
    text = " ".join(hermes("worker", "--help", cwd=tmp_path).stdout.split())

    assert "--priority P read only the queues of the priorities given" in text
    assert "--queue NAME:P also read the queue NAME" in text


def test_the_worker_and_emit_name_the_redis_key_they_use(
    project: Path, redis_test_db_url: str
) -> None:
    import redis

    prefix = f"cli-{uuid.uuid4().hex[:8]}:"
    url = f"{redis_test_db_url}&prefix={prefix}"
    key = DriverUrl.parse(redis_test_db_url).options["key"]
    try:
        emitted = hermes("emit", "--url", url, "job", '{"name": "a"}', cwd=project)
        worker = hermes("worker", "--url", url, "--handlers", "jobs:register", "--max-items", "1",
                        cwd=project)  # fmt: skip
    finally:
        client = redis.Redis.from_url(redis_test_db_url.split("?")[0])
        client.delete(*(client.keys(f"{prefix}*") or [f"{prefix}none"]))
        client.close()

    assert f"priority:100 ({prefix}{key}) to redis://" in emitted.stderr
    assert f"Reading priority 100 ({prefix}{key})" in worker.stderr


def test_a_delayed_emit_carries_its_execute_at_and_is_handled_no_sooner(
    project: Path, queue_url: str
) -> None:
    before = time.time()
    delayed = hermes("emit", "--url", queue_url, "job", '{"name": "later"}', "--delay", "1.5",
                     cwd=project)  # fmt: skip
    at = hermes("emit", "--url", queue_url, "job", '{"name": "at"}', "--at",
                "2001-02-03T04:05:06+00:00", cwd=project)  # fmt: skip
    assert delayed.returncode == 0 and at.returncode == 0, delayed.stderr + at.stderr
    assert re.search(r"priority:100, execute_at \d\d:\d\d:\d\d to file://", delayed.stderr)

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "2", cwd=project
    )

    assert worker.returncode == 0, worker.stdout + worker.stderr
    rows = {row["payload"]["name"]: row for row in handled(project)}
    assert rows["at"]["execute_at"] == 981173106.0
    assert before + 1.5 <= rows["later"]["execute_at"] <= time.time() + 1.5
    assert rows["later"]["handled_at"] >= rows["later"]["execute_at"]


def test_count_emits_that_many_messages_and_reports_the_rate(project: Path, queue_url: str) -> None:
    emitted = hermes("emit", "--url", queue_url, "job", '{"bulk": true}', "--count", "250",
                     cwd=project)  # fmt: skip
    assert emitted.returncode == 0, emitted.stderr
    assert re.search(
        r"Emitted 250 messages \(job\) priority:100 to file://\S+ in \d+\.\d\d s: [\d,]+ msg/s\n",
        emitted.stderr,
    )
    ids = emitted.stdout.split()
    assert len(ids) == len(set(ids)) == 250

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
    local = hermes("emit", "job", '{"name": "local"}', cwd=project)
    assert local.returncode == 0, local.stderr
    assert f"to {(project / 'hermes-queue').as_uri()}" in local.stderr
    elsewhere = (tmp_path / "elsewhere").as_uri()
    env = hermes("emit", "job", '{"name": "env"}', cwd=project, env={"HERMES_URL": elsewhere})
    assert env.returncode == 0, env.stderr
    assert f"to {elsewhere}" in env.stderr

    worker = hermes("worker", "--handlers", "jobs:register", "--max-items", "1", cwd=project)

    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert names(project) == ["local"]


@pytest.fixture
def php_queues(redis_test_db_url: str) -> Iterator[tuple[str, str, str]]:
    """``(url, high, low)``: a Redis URL and the names of two priority sets of this test's
    own, spelled as a PHP deployment names them (``<key>_high``, ``<key>_low``)."""
    import redis

    key = DriverUrl.parse(redis_test_db_url).options["key"]
    high, low = f"{key}_high", f"{key}_low"
    yield redis_test_db_url, high, low
    client = redis.Redis.from_url(redis_test_db_url.split("?")[0])
    client.delete(high, low, f"{high}_wakeup", f"{low}_wakeup")
    client.close()


def test_emit_queue_sends_to_the_set_a_php_deployment_named(
    project: Path, php_queues: tuple[str, str, str]
) -> None:
    import redis

    url, high, _ = php_queues
    emitted = hermes("emit", "--url", url, "--queue", f"{high}:200", "job", '{"name": "vip"}',
                     cwd=project)  # fmt: skip

    assert emitted.returncode == 0, emitted.stderr
    assert f"priority:200 ({high}) to redis://" in emitted.stderr
    client = redis.Redis.from_url(url.split("?")[0])
    try:
        [body] = client.smembers(high)
    finally:
        client.close()
    assert json.loads(body)["message"]["payload"] == {"name": "vip"}


def test_a_worker_reads_the_sets_named_by_queue_or_by_the_url(
    project: Path, php_queues: tuple[str, str, str]
) -> None:
    url, high, low = php_queues
    php_like = f"{url}&priority_queues={high}:200,{low}:50"
    for priority, name in ((50, "low"), (100, "default"), (200, "high")):
        sent = hermes("emit", "--url", php_like, "--priority", str(priority), "job",
                      f'{{"name": "{name}"}}', cwd=project)  # fmt: skip
        assert sent.returncode == 0, sent.stderr

    named = hermes(
        "worker", "--url", url, "--handlers", "jobs:register", "--queue", f"{high}:200",
        "--max-items", "1", cwd=project,
    )  # fmt: skip
    assert named.returncode == 0, named.stdout + named.stderr
    assert f"Reading priorities 200 ({high}), 100 (" in named.stderr
    assert names(project) == ["high"]

    rest = hermes(
        "worker", "--url", php_like, "--handlers", "jobs:register", "--max-items", "2", cwd=project
    )
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert f"Reading priorities 200 ({high}), 100 (" in rest.stderr
    assert f"), 50 ({low}) and the queues the handlers set up" in rest.stderr
    assert names(project) == ["high", "default", "low"]


def test_emit_to_a_priority_no_queue_is_named_for_is_refused_as_in_python(
    tmp_path: Path, queue_url: str
) -> None:
    line = assert_one_line_error(
        hermes("emit", "--url", queue_url, "--priority", "999", "job", cwd=tmp_path)
    )

    assert "priority 999 has no queue" in line
    assert "--queue hermes_priority_999:999" in line and "priority_queues" in line
    assert not (tmp_path / "queue").exists()


def test_emit_to_a_priority_the_url_names_is_sent(tmp_path: Path) -> None:
    result = hermes(
        "emit", "--url", "memory://cli?priority_queues=high:200", "--priority", "200", "job",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "priority:200 (high)" in result.stderr


def test_a_queue_that_contradicts_the_url_is_refused_in_one_line(tmp_path: Path) -> None:
    line = assert_one_line_error(
        hermes("emit", "--url", "memory://cli?priority_queues=hermes_high:200",
               "--queue", "other:200", "job", cwd=tmp_path)
    )  # fmt: skip
    assert line == (
        "hermes: error: --queue other:200 contradicts the URL's priority_queues, which names "
        "priority 200 'hermes_high'; give one of them"
    )


def test_a_queue_without_a_priority_is_an_argument_error(tmp_path: Path) -> None:
    result = hermes("worker", "--handlers", "jobs:register", "--queue", "hermes_high",
                    cwd=tmp_path)  # fmt: skip

    assert result.returncode == 2
    assert "argument --queue: queue 'hermes_high' must be NAME:PRIORITY" in result.stderr
    assert "Traceback" not in result.stderr


# The failed-message store ------------------------------------------------------------


@pytest.fixture(params=["file", "redis"])
def failed_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A failed-message store of this test's own: a directory, or keys under a Redis prefix."""
    if request.param == "file":
        yield (tmp_path / "failed").as_uri()
        return
    pytest.importorskip("hermes.drivers.redis", reason="hermes-redis is not installed")
    import redis

    base = request.getfixturevalue("redis_url").rsplit("/", 1)[0] + "/14"
    prefix = f"cli-failed-{uuid.uuid4().hex[:8]}:"
    yield f"{base}?prefix={prefix}"
    client = redis.Redis.from_url(base)
    client.delete(*(client.keys(f"{prefix}*") or [f"{prefix}none"]))
    client.close()


def test_a_message_given_up_on_is_listed_retried_and_then_handled(
    project: Path, queue_url: str, failed_url: str
) -> None:
    seed(queue_url, ("picky", {"n": 7}, 100))
    store = ("--url", failed_url)

    first = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "1",
        "--failed-url", failed_url, cwd=project,
    )  # fmt: skip

    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(
        r" ERROR   Message #(\S+) \(picky\) failed in Picky, not retried: it returned False "
        r"\(a handler that returns False is never retried\); it goes to the failed-message "
        r"store$",
        first.stderr,
        re.MULTILINE,
    ), first.stderr
    assert first.stdout.rstrip().endswith("gave up 1 (1 kept in the failed-message store)")
    listed = hermes("failed", *store, "list", cwd=project)
    assert listed.returncode == 0, listed.stderr
    header, row, count = listed.stdout.splitlines()
    assert header.split() == ["ID", "TYPE", "RETRIES", "FAILED", "AT", "REASON", "EXCEPTION"]
    message_id, type_, retries, day, moment, *reason, raised = row.split()
    assert (type_, retries) == ("picky", "0")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", f"{day} {moment}")
    assert " ".join(reason) == (
        "Picky: it returned False (a handler that returns False is never retried)"
    )
    assert raised == "-", "returning False raises nothing"
    assert count.startswith("1 failed message in ")

    (project / "fixed").touch()
    retried = hermes("failed", *store, "retry", message_id, "--to", queue_url, cwd=project)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout == (
        f"Put 1 message back on {queue_url} with retries reset: #{message_id} (picky)\n"
    )
    assert hermes("failed", "list", *store, cwd=project).stdout.startswith("No failed messages")
    second = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "1",
        cwd=project,
    )  # fmt: skip

    assert second.returncode == 0, second.stdout + second.stderr
    assert [(r["id"], r["payload"], r["retries"]) for r in handled(project)] == [
        (message_id, {"n": 7}, 0)
    ]


def test_failed_list_and_show_name_the_exception_a_handler_raised_and_show_its_traceback(
    project: Path, queue_url: str, failed_url: str
) -> None:
    seed(queue_url, ("charge", {"order": 7}, 100))
    worker = hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "1",
        "--failed-url", failed_url, cwd=project,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stdout + worker.stderr

    listed = hermes("failed", "--url", failed_url, "list", cwd=project)

    assert listed.returncode == 0, listed.stderr
    row = listed.stdout.splitlines()[1]
    assert row.endswith("  jobs.CardDeclined: card declined for order 7"), row
    message_id = row.split()[0]
    shown = hermes("failed", "--url", failed_url, "show", message_id, cwd=project)
    assert shown.returncode == 0, shown.stderr
    assert f"id:        {message_id}" in shown.stdout
    assert 'payload:   {"order": 7}' in shown.stdout
    assert "jobs.charge_card raised jobs.CardDeclined: card declined for order 7" in shown.stdout
    assert "Traceback (most recent call last):" in shown.stdout
    assert ", in charge_card\n" in shown.stdout
    assert shown.stdout.rstrip().endswith("jobs.CardDeclined: card declined for order 7")


def test_failed_list_and_show_json_carry_the_exception_and_its_traceback(
    project: Path, queue_url: str, tmp_path: Path
) -> None:
    failed_url = (tmp_path / "failed").as_uri()
    seed(queue_url, ("charge", {"order": 8}, 100), ("nobody.handles", {}, 100))
    hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--max-items", "2",
        "--failed-url", failed_url, cwd=project,
    )  # fmt: skip

    listed = hermes("failed", "--url", failed_url, "list", "--json", cwd=project)

    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert document["store"] == failed_url
    by_type = {m["type"]: m for m in document["messages"]}
    [raised] = by_type["charge"]["exceptions"]
    assert raised["class"] == "jobs.CardDeclined"
    assert raised["message"] == "card declined for order 8"
    assert raised["handler"] == "jobs.charge_card"
    assert "in charge_card" in raised["traceback"]
    assert by_type["nobody.handles"]["exceptions"] == []
    assert by_type["nobody.handles"]["failed_reason"] == "no handler is registered for its type"
    charge_id = by_type["charge"]["id"]
    shown = hermes("failed", "--url", failed_url, "show", charge_id, "--json", cwd=project)
    assert json.loads(shown.stdout) == by_type["charge"]


def test_failed_show_says_when_no_exception_was_recorded(project: Path, tmp_path: Path) -> None:
    from hermes.core import FailedStore, Message

    failed_url = (tmp_path / "failed").as_uri()
    with FailedStore.connect(failed_url) as store:
        kept = store.keep(Message("job", {"n": 1}), "Picky: it returned False")

    shown = hermes("failed", "--url", failed_url, "show", kept.id, cwd=project)

    assert shown.returncode == 0, shown.stderr
    assert "reason:    Picky: it returned False" in shown.stdout
    assert "No exception was recorded: the reason says what put it here." in shown.stdout


def test_failed_show_of_an_unknown_or_missing_id_is_a_one_line_error(
    project: Path, tmp_path: Path
) -> None:
    failed_url = (tmp_path / "failed").as_uri()

    unknown = assert_one_line_error(
        hermes("failed", "--url", failed_url, "show", "no-such-id", cwd=project)
    )
    missing = assert_one_line_error(hermes("failed", "--url", failed_url, "show", cwd=project))

    assert "no failed message with id no-such-id" in unknown
    assert "`hermes failed list` shows the ids" in unknown
    assert "required: ID" in missing


def test_purge_deletes_the_messages_it_is_given_or_all_of_them(
    project: Path, failed_url: str
) -> None:
    from hermes.core import FailedStore, Message

    with FailedStore.connect(failed_url) as store:
        kept = [store.keep(Message("job"), "gave up") for _ in range(3)]
    purge = ("failed", "--url", failed_url, "purge")

    one = hermes(*purge, kept[0].id, cwd=project)
    refused = hermes(*purge, cwd=project)
    everything = hermes(*purge, "--all", cwd=project)

    assert one.stdout.startswith("Deleted 1 message from "), one.stderr
    assert "the IDs `hermes failed list` shows, or --all" in assert_one_line_error(refused)
    assert everything.stdout.startswith("Deleted 2 messages from "), everything.stderr
    assert hermes("failed", "--url", failed_url, "list", cwd=project).stdout.startswith("No ")


def test_an_unknown_id_changes_nothing_and_says_where_to_find_the_ids(
    project: Path, queue_url: str, failed_url: str
) -> None:
    from hermes.core import FailedStore, Message

    with FailedStore.connect(failed_url) as store:
        kept = store.keep(Message("job"), "gave up")

    result = hermes(
        "failed", "--url", failed_url, "retry", kept.id, "no-such-id", "--to", queue_url,
        cwd=project,
    )  # fmt: skip

    line = assert_one_line_error(result)
    assert "no failed message with id no-such-id" in line
    assert "nothing was changed" in line
    listed = hermes("failed", "--url", failed_url, "list", cwd=project)
    assert kept.id in listed.stdout


def test_failed_retry_without_a_target_asks_for_to_not_for_the_store_s_url(
    tmp_path: Path, core_only_env: dict[str, str]
) -> None:
    assert HERMES is not None
    result = subprocess.run(
        [sys.executable, "-S", HERMES, "failed", "--url", "memory://store", "retry"],
        cwd=tmp_path, env=core_only_env, capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip

    line = assert_one_line_error(result)
    assert "no --to and no $HERMES_URL" in line
    assert "give the workers' queue with --to or $HERMES_URL" in line
    assert "with --url" not in line


def test_failed_list_on_a_live_queue_warns_that_it_is_not_a_failed_message_store(
    project: Path, queue_url: str
) -> None:
    seed(queue_url, ("job", {"n": 1}, 100), ("job", {"n": 2}, 100))

    result = hermes("failed", "--url", queue_url, "list", cwd=project)

    assert result.returncode == 0, result.stderr
    assert "2 failed messages" in result.stdout
    [warning] = result.stderr.splitlines()
    assert warning.startswith("hermes: warning: 2 of 2 messages")
    assert "no failed_reason" in warning and "a worker's queue" in warning
    assert "--failed-url" in warning


def test_a_store_that_cannot_be_listed_says_which_urls_can(project: Path) -> None:
    pytest.importorskip("hermes.drivers.rabbitmq", reason="hermes-rabbitmq is not installed")

    line = assert_one_line_error(
        hermes("failed", "--url", "amqp://guest:s3cret@127.0.0.1:1/?queue=f", "list", cwd=project)
    )

    assert "cannot list or delete the messages it holds without taking them" in line
    assert "file://, redis:// or postgresql://" in line
    assert "s3cret" not in line


def test_failed_without_a_url_names_the_option_and_the_variable(project: Path) -> None:
    line = assert_one_line_error(hermes("failed", "list", cwd=project))

    assert "--url URL" in line and "$HERMES_FAILED_URL" in line


def test_a_worker_whose_failed_url_is_its_own_queue_is_refused(
    project: Path, queue_url: str
) -> None:
    result = hermes(
        "worker", "--url", queue_url, "--failed-url", queue_url, "--handlers", "jobs:register",
        cwd=project,
    )  # fmt: skip

    assert "--failed-url is the worker's own queue" in assert_one_line_error(result)


def test_very_verbose_errors_show_their_traceback(project: Path) -> None:
    result = hermes("failed", "--url", "nats://h/x", "list", "-vv", cwd=project)

    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("hermes: error: no installed Hermes driver")


# Stopping workers -------------------------------------------------------------------


def test_shutdown_file_stops_a_running_worker(project: Path, queue_url: str) -> None:
    stop_file = project / "stop"
    with running_hermes(
        "worker", "--url", queue_url, "--handlers", "jobs:register", "--shutdown-file",
        str(stop_file), cwd=project,
    ) as (worker, output):  # fmt: skip
        seed(queue_url, ("job", {"name": "first"}, 100))
        eventually(
            lambda: len(handled(project)) == 1, "the worker handling the first message", WORKER_S
        )

        stop = hermes("shutdown", "--file", str(stop_file), cwd=project)

        assert stop.returncode == 0, stop.stderr
        assert "Asked every worker watching" in stop.stdout
        assert worker.wait(timeout=30) == 0
    text = output.read_text()
    assert "NOTICE  Exiting hermes dispatcher - shutdown" in text
    assert text.splitlines()[-1].endswith("received 1, handled 1, failed 0, retried 0, gave up 0")


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
    assert text.splitlines()[-1].endswith("handled 1, failed 0, retried 0, gave up 0")


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
        assert stop.stdout.startswith("Set RedisShutdown(key='hermes_shutdown') on redis://")
        assert "the workers that watch it and started before" in stop.stdout
        assert worker.wait(timeout=30) == 0
    assert "NOTICE  Exiting hermes dispatcher - shutdown" in output.read_text()


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


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


#: Each mistake the README's list names, with what its one line must say.
README_MISTAKES = [
    pytest.param(["emit", "--url", "nats://localhost:4222/jobs", "job"],
                 "no installed Hermes driver handles nats://", id="unknown scheme"),
    pytest.param(["emit", "--url", "memory://cli", "job", "{not json"],
                 "PAYLOAD_JSON is not valid JSON", id="bad JSON"),
    pytest.param(["emit", "--url", "memory://cli", "job", "42"],
                 "must be a JSON object, an array or null", id="scalar payload"),
    pytest.param(["worker", "--url", "memory://cli", "--handlers", "missing:register"],
                 "cannot import handlers module 'missing'", id="handlers that do not import"),
    pytest.param(["worker", "--url", "memory://cli", "--handlers", "jobs:register", "--bogus"],
                 "unrecognized arguments: --bogus", id="unknown option"),
    pytest.param(["emit", "--url", "memory://cli", "job", "--count", "many"],
                 "argument --count: 'many' is not a whole number", id="bad option value"),
    pytest.param(["worker", "--url", "memory://cli"],
                 "the following arguments are required: --handlers", id="missing option"),
    pytest.param(["emit", "--url", "redis://127.0.0.1:1/0", "job"],
                 "unreachable", id="emit to an unreachable broker"),
    pytest.param(["worker", "--url", "memory://cli", "--handlers", "jobs:register",
                  "--metrics-port", "99999"],
                 "argument --metrics-port: 99999 must be <= 65535", id="metrics port too big"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "expected"), README_MISTAKES)
def test_every_mistake_the_readme_lists_is_one_line_and_exit_2(
    project: Path, command: list[str], expected: str
) -> None:
    if "redis://127.0.0.1:1/0" in command:
        pytest.importorskip("hermes.drivers.redis", reason="hermes-redis is not installed")

    result = hermes(*command, cwd=project)

    if "{not json" in command:  # the excerpt and a caret under the fault follow the line
        result.stderr = result.stderr.splitlines()[0] + "\n"
    line = assert_one_line_error(result)
    assert expected in line


def test_a_metrics_port_in_use_is_one_line_and_exit_2(project: Path, queue_url: str) -> None:
    pytest.importorskip("hermes.plugins.prometheus", reason="hermes-prometheus is not installed")
    import socket

    port = _free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        result = hermes(
            "worker", "--url", queue_url, "--handlers", "jobs:register",
            "--metrics-port", str(port), cwd=project,
        )  # fmt: skip

    line = assert_one_line_error(result)
    assert f"--metrics-port {port}: cannot serve metrics" in line
    assert "in use" in line


def test_a_bad_metrics_port_in_the_environment_is_one_line_and_exit_2(project: Path) -> None:
    line = assert_one_line_error(
        hermes("worker", "--url", "memory://cli", "--handlers", "jobs:register", cwd=project,
               env={"HERMES_METRICS_PORT": "70000"})
    )  # fmt: skip
    assert line == "hermes: error: $HERMES_METRICS_PORT: 70000 must be <= 65535"


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


def test_a_known_scheme_whose_driver_is_missing_names_the_pip_install(
    tmp_path: Path, core_only_env: dict[str, str]
) -> None:
    assert HERMES is not None
    result = subprocess.run(
        [sys.executable, "-S", HERMES, "emit", "--url", "amqp://guest:s3cret@localhost/", "job"],
        cwd=tmp_path,
        env=core_only_env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )

    line = assert_one_line_error(result)
    assert "no installed Hermes driver handles amqp://" in line
    assert "installed schemes: memory://;" in line
    assert "`pip install hermes-rabbitmq` adds it" in line
    assert "s3cret" not in line


@pytest.mark.parametrize("command", [["emit", "job"], ["worker", "--handlers", "jobs:register"]])
def test_without_hermes_filesystem_the_default_url_says_what_to_install_or_give(
    project: Path, core_only_env: dict[str, str], command: list[str]
) -> None:
    assert HERMES is not None
    result = subprocess.run(
        [sys.executable, "-S", HERMES, *command],
        cwd=project,
        env=core_only_env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )

    line = assert_one_line_error(result)
    assert line == (
        "hermes: error: no --url and no $HERMES_URL: the default queue, the directory "
        "./hermes-queue, needs hermes-filesystem, which is not installed; "
        "`pip install hermes-filesystem`, or give your broker's URL with --url or $HERMES_URL, "
        "e.g. redis://localhost:6379/0"
    )
    assert not (project / "hermes-queue").exists()


def test_an_unreachable_broker_names_its_host_and_port(tmp_path: Path) -> None:
    pytest.importorskip("hermes.drivers.redis", reason="hermes-redis is not installed")

    line = assert_one_line_error(
        hermes("emit", "--url", "redis://:s3cret@127.0.0.1:1/0", "job", cwd=tmp_path)
    )

    assert "unreachable" in line
    assert "127.0.0.1:1" in line
    assert "s3cret" not in line


def test_a_worker_whose_broker_is_unreachable_keeps_trying_and_names_its_host_and_port(
    project: Path, tmp_path: Path
) -> None:
    pytest.importorskip("hermes.drivers.rabbitmq", reason="hermes-rabbitmq is not installed")
    assert HERMES is not None
    log = tmp_path / "worker.log"
    environ = {k: v for k, v in os.environ.items() if k != "HERMES_URL"}
    with log.open("w") as stderr:
        worker = subprocess.Popen(
            [HERMES, "worker", "--url", "amqp://guest:s3cret@127.0.0.1:1/", "--handlers",
             "jobs:register"],
            cwd=project, env=environ, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
        try:
            # A worker may start before its broker (a deployment's order is not ours):
            # it says so and retries with backoff instead of exiting.
            eventually(
                lambda: "broker unavailable (attempt 2)" in log.read_text(),
                "the worker to retry its unreachable broker",
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            stdout, _ = worker.communicate(timeout=COMMAND_TIMEOUT_S)

    text = log.read_text()
    assert worker.returncode == 0, stdout + text
    assert "Traceback" not in text
    [attempt] = [line for line in text.splitlines() if "(attempt 1)" in line]
    assert "WARNING" in attempt and "127.0.0.1:1" in attempt
    assert "s3cret" not in stdout + text
    (counts,) = stdout.splitlines()  # stdout holds only the counts
    assert counts.endswith("received 0, handled 0, failed 0, retried 0, gave up 0")


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


@pytest.mark.parametrize(
    ("payload", "kind"),
    [("42", "a number (42)"), ('"just a string"', 'a string ("just a string")'),
     ("true", "a boolean (true)")],
)  # fmt: skip
def test_a_payload_that_is_not_an_object_an_array_or_null_is_refused_before_the_broker(
    tmp_path: Path, queue_url: str, payload: str, kind: str
) -> None:
    line = assert_one_line_error(hermes("emit", "--url", queue_url, "job", payload, cwd=tmp_path))

    assert line == (
        f"hermes: error: PAYLOAD_JSON must be a JSON object, an array or null, not {kind}; "
        f"wrap it in an object, e.g. '{{\"value\": {payload}}}'"
    )
    assert not (tmp_path / "queue").exists()


def test_an_empty_type_is_refused_in_one_line(tmp_path: Path) -> None:
    line = assert_one_line_error(hermes("emit", "--url", "memory://cli", "", "{}", cwd=tmp_path))
    assert line == "hermes: error: Message type must be a non-empty string, got ''"


def test_a_scalar_payload_on_stdin_is_refused_too(tmp_path: Path) -> None:
    line = assert_one_line_error(
        hermes("emit", "--url", "memory://cli", "job", "-", cwd=tmp_path, input="3.5\n")
    )
    assert "the payload on stdin must be a JSON object, an array or null, not a number" in line


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
        ("x = 1\n", "./jobs2.py:register",
         "--handlers './jobs2.py:register' names a file; give the module: "
         "--handlers jobs2:register, run from the directory that holds jobs2.py"),
        ("x = 1\n", "app/jobs2.py:register",
         "--handlers 'app/jobs2.py:register' names a file; give the module: "
         "--handlers app.jobs2:register, run from the directory that holds app/"),
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


# Functions as handlers through --handlers ----------------------------------------------

FUNCTIONS_MODULE = """
import json

from hermes.core import HandlerRegistry

handlers = HandlerRegistry()


def record(message):
    with open("handled.jsonl", "a") as file:
        file.write(json.dumps({"type": message.type, "retries": message.retries}) + "\\n")


@handlers.handler("job")
def send_email(message):
    record(message)


@handlers.handler("flaky", max_retry=3)
def charge_card(message):
    raise RuntimeError("card service down")


HANDLERS = {"job": send_email, "flaky": [charge_card]}
"""


@pytest.fixture
def functions_project(tmp_path: Path) -> Path:
    """A directory with fjobs.py: functions in a HandlerRegistry and in a dict."""
    (tmp_path / "fjobs.py").write_text(FUNCTIONS_MODULE)
    return tmp_path


@pytest.mark.parametrize(
    ("spec", "retried"),
    # The decorator returns the plain function: in the dict it is not retried.
    [("fjobs:handlers", 1), ("fjobs:HANDLERS", 0)],
)
def test_a_worker_runs_functions_from_a_registry_or_a_dict(
    functions_project: Path, queue_url: str, spec: str, retried: int
) -> None:
    seed(queue_url, ("job", None, 100), ("flaky", None, 100))

    worker = hermes(
        "worker", "--url", queue_url, "--handlers", spec, "--max-items", "2",
        cwd=functions_project,
    )  # fmt: skip

    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert handled(functions_project) == [{"type": "job", "retries": 0}]
    assert "Handlers: job -> fjobs.send_email; flaky -> fjobs.charge_card" in worker.stderr
    assert worker.stdout.splitlines()[-1].endswith(
        f"received 2, handled 1, failed 1, retried {retried}, gave up {1 - retried}"
    )


@pytest.mark.parametrize(
    ("module", "spec", "expected"),
    [
        ("def send_email(message):\n    pass\n", "jobs3:send_email",
         "--handlers jobs3:send_email looks like a handler function (it takes 'message'): "
         "a function named by --handlers is called once with the Dispatcher to register "
         "handlers; to run a function for every message, name a dict {'TYPE': send_email} or "
         "a hermes.core.HandlerRegistry whose @registry.handler('TYPE') decorates it"),
        ("def notify(event):\n    event.payload\n", "jobs3:notify",
         "raised AttributeError: 'Dispatcher' object has no attribute 'payload' (jobs3.py:2); "
         "if it is a handler rather than a registration: a function named by --handlers"),
        ("def notify(event):\n    return True\n", "jobs3:notify",
         "registered no handlers; a function named by --handlers is called once"),
        ("async def send(message):\n    yield True\nH = {'job': send}\n", "jobs3:H",
         "--handlers jobs3:H: handler function jobs3.send is an async generator"),
        ("H = {'job': lambda: None}\n", "jobs3:H",
         "must take the message as its argument, but its signature is ()"),
        ("from hermes.core import HandlerRegistry\nH = HandlerRegistry()\n", "jobs3:H",
         "--handlers jobs3:H registered no handlers"),
        ("H = {'job': 42}\n", "jobs3:H",
         "handler 42 for type 'job' is neither a function taking the message nor an object"),
    ],
)  # fmt: skip
def test_a_handlers_object_of_the_wrong_kind_is_one_line_that_says_the_fix(
    tmp_path: Path, queue_url: str, module: str, spec: str, expected: str
) -> None:
    (tmp_path / "jobs3.py").write_text(module)

    line = assert_one_line_error(
        hermes("worker", "--url", queue_url, "--handlers", spec, cwd=tmp_path)
    )

    assert expected in line


def test_worker_help_says_what_each_kind_of_handlers_object_means(tmp_path: Path) -> None:
    result = hermes("worker", "--help", cwd=tmp_path)

    text = " ".join(result.stdout.split())
    assert (
        "hermes.core.HandlerRegistry (functions decorated with @registry.handler('TYPE'))" in text
    )
    assert "a handler is a function taking the message, an object with handle(message)" in text
    assert "or a function taking the Dispatcher, called once to register handlers" in text


def test_failed_retry_sends_each_message_back_to_the_priority_it_failed_on(
    project: Path, queue_url: str, failed_url: str
) -> None:
    from hermes.core import FailedStore, Message, connect

    with FailedStore.connect(failed_url) as store:
        urgent = store.keep(Message("job", {"n": 1}), "gave up", priority=300)
        older = store.keep(Message("job", {"n": 2}), "gave up")  # no priority recorded

    result = hermes("failed", "--url", failed_url, "retry", "--to", queue_url, cwd=project)

    assert result.returncode == 0, result.stderr
    with connect(queue_url) as driver:
        driver.setup_priority_queue("urgent", 300)  # a worker of priority 300 reads there
        ready = {row.priority: row.ready for row in driver.queue_stats() if row.ready}
    assert ready == {300: 1, 100: 1}, (urgent.id, older.id)


def test_hermes_workers_pause_holds_a_priority_back_from_a_running_worker_until_resume(
    project: Path, queue_url: str
) -> None:
    args = ["--url", queue_url, "--handlers", "jobs:register", "--priority", "300"]
    with running_hermes(
        "worker", *args, "--priority", "100", "--heartbeat-interval", "0.2", cwd=project
    ) as (worker, output):
        paused = hermes("workers", "--url", queue_url, "--pause", "300", cwd=project)
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.startswith("Paused priority 300: each worker finishes")
        again = hermes("workers", "--url", queue_url, "--pause", "300", cwd=project)
        assert again.stdout.strip() == "Priority 300 was paused already"

        def skipping() -> bool:
            run = hermes("workers", "--url", queue_url, "--json", cwd=project)
            workers = json.loads(run.stdout)["workers"] if run.returncode == 0 else []
            return bool(workers) and workers[0]["paused"] == [300]

        eventually(skipping, "the worker skips 300", WORKER_S, 0.1, output.read_text)
        seed(queue_url, ("job", {"name": "high"}, 300), ("job", {"name": "default"}, 100))
        eventually(lambda: names(project) == ["default"], "default handled", WORKER_S)
        listed = hermes("workers", "--url", queue_url, cwd=project)
        assert listed.stdout.startswith("Priority 300 paused with hermes workers --pause\n")
        assert names(project) == ["default"]  # still: 300 waits while paused

        resumed = hermes("workers", "--url", queue_url, "--resume", "300", cwd=project)
        assert resumed.stdout.strip() == "Resumed priority 300: the workers take it again"
        eventually(lambda: names(project) == ["default", "high"], "high handled", WORKER_S)
        assert worker.poll() is None
    log = output.read_text()
    assert "Priority 300 paused with hermes workers --pause: finishing what runs" in log
    assert "Priority 300 resumed: taking it again" in log


def test_hermes_workers_pause_and_resume_at_once_is_a_one_line_error(
    project: Path, queue_url: str
) -> None:
    both = hermes("workers", "--url", queue_url, "--pause", "300", "--resume", "300", cwd=project)
    assert "--pause and --resume: give one of them" in assert_one_line_error(both)
    word = hermes("workers", "--url", queue_url, "--pause", "high", cwd=project)
    assert "--pause: invalid int value: 'high'" in assert_one_line_error(word)
