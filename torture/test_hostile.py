"""Hostile input: nothing but SerializeError escapes the serializer, poison on every
driver is set aside while the good messages around it are handled, and secrets
(passwords, and query options such as ``sasl.password``) never leak into logs,
errors, reprs or CLI output on any driver.

Run by ``nox -s torture`` (``HERMES_TORTURE_EXAMPLES`` sets the fuzz size:
10,000 in the full run).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes.core import (
    DeliveryError,
    Dispatcher,
    HermesError,
    Message,
    NotSupportedError,
    SerializeError,
    SharedFileShutdown,
    Worker,
    connect,
)
from hermes.core.driver import DriverUrl, SupportsTeardown
from hermes.core.drivertools import MessageSerializer, isolated_url

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("HERMES_TORTURE_EXAMPLES", "1000"))
serializer = MessageSerializer()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "type": json_values,
        "created": json_values,
        "payload": json_values,
        "execute_at": json_values,
        "retries": json_values,
    },
).map(lambda body: {"message": body})


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.binary(), st.text(), envelopes.map(json.dumps)))
def test_unserialize_raises_nothing_but_serialize_error(data: str | bytes) -> None:
    try:
        message = serializer.unserialize(data)
    except SerializeError as exc:
        assert str(exc)
    else:
        assert serializer.unserialize(serializer.serialize(message)) == message


@pytest.mark.parametrize("depth", [10, 1_000, 100_000])
def test_deep_nesting_is_a_serialize_error_or_a_message(depth: int) -> None:
    nested = (
        '{"message":{"id":"x","type":"t","created":1,"payload":' + "[" * depth + "]" * depth + "}}"
    )
    try:
        serializer.unserialize(nested)
    except SerializeError as exc:
        assert "Cannot unserialize" in str(exc)


TARGETS = [
    name
    for name in ("filesystem", "redis", "rabbitmq", "sqs", "kafka")
    if (ROOT / "drivers" / name / "pyproject.toml").exists()
]
POISON = {
    "not JSON": b"this is not json",
    "wrong shape": b'{"message":{"id":"t"}}',
    "invalid UTF-8": b"\xff\xfe\xfa not utf-8",
    "10 MB": b"{" + b"x" * (10 * 1024 * 1024),
}


@pytest.fixture(params=TARGETS)
def driver_url(request: pytest.FixtureRequest) -> Iterator[str]:
    from hermes_test_services import service_url

    with service_url(request.param) as url:
        yield isolated_url(url, f"hostile-{uuid.uuid4().hex[:10]}")


def test_poison_is_set_aside_and_the_good_messages_around_it_are_handled(
    driver_url: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    driver = connect(driver_url)
    good: list[str] = []
    refused: dict[str, str] = {}
    sent_good: list[str] = []
    try:
        for name, body in POISON.items():
            message = Message("good", {"before": name})
            driver.send(message)
            sent_good.append(message.id)
            if len(body) > driver.capabilities.max_message_bytes:
                # Over the declared maximum the broker (or driver) must refuse it loudly.
                with pytest.raises(HermesError) as info:
                    driver.send_raw(body)
                refused[name] = f"{type(info.value).__name__}: {info.value}"[:200]
                continue
            try:
                driver.send_raw(body)
            except (NotSupportedError, DeliveryError) as exc:
                # A broker that carries only text (SQS) cannot even hold invalid UTF-8.
                refused[name] = str(exc)[:200]
        last = Message("good", {"last": True})
        driver.send(last)
        sent_good.append(last.id)

        class Collect:
            def handle(self, message: Message) -> bool:
                good.append(message.id)
                return True

        worker = connect(driver_url)
        stop = SharedFileShutdown(tmp_path / "stop")
        dispatcher = Dispatcher(worker, shutdown=stop)
        dispatcher.register_handler("good", Collect())
        thread = threading.Thread(target=Worker(worker, dispatcher).run, daemon=True)
        placed = len(POISON) - len(refused)

        def errors() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.levelno >= logging.ERROR]

        with caplog.at_level(logging.WARNING):
            thread.start()
            # A Redis set hands its members out in no particular order, so the last good
            # message can come out before a poison body: wait for both, not just the first.
            end = time.monotonic() + 60
            while time.monotonic() < end and (set(sent_good) - set(good) or len(errors()) < placed):
                time.sleep(0.1)
            stop.shutdown()
            thread.join(30)
        assert not thread.is_alive(), "the worker did not stop"
        assert set(sent_good) <= set(good), f"good messages lost: {set(sent_good) - set(good)}"
        logged = len(errors())
        assert logged >= placed, f"{placed} poison bodies but {logged} error log lines"
        worker.close()
    finally:
        if isinstance(driver, SupportsTeardown):
            driver.teardown()
        driver.close()


SECRET = "s3cr3t-pa55"
#: URLs that carry SECRET -- as a password, and as query options whose names mark a secret --
#: and that each driver refuses somewhere (an unknown option, an unreachable broker): the
#: error, every log line and every repr on the way must mask it.
SECRET_URLS = {
    "filesystem": [
        f"file:///tmp/hermes-hostile-secret?token={SECRET}",
        f"file:///tmp/hermes-hostile-secret?fsync=false&api_key={SECRET}&bogus=1",
    ],
    "redis": [
        f"redis://user:{SECRET}@127.0.0.1:1/0",
        f"redis://127.0.0.1:1/0?password={SECRET}&bogus=1",
        f"rediss://127.0.0.1:1/0?ssl_ca_certs=/nowhere&client_secret={SECRET}",
    ],
    "rabbitmq": [
        f"amqp://guest:{SECRET}@127.0.0.1:1/?queue=q",
        f"amqp://guest:guest@127.0.0.1:1/?queue=q&token={SECRET}",
        f"amqps://guest:guest@127.0.0.1:1/?queue=q&ssl.key.password={SECRET}",
    ],
    "sqs": [
        f"sqs://q?region=us-east-1&aws_secret_access_key={SECRET}",
        f"sqs://q?region=us-east-1&aws_session_token={SECRET}&wait_time=1",
    ],
    # An unreachable Kafka is given up on after message.timeout.ms (30 s by default).
    "kafka": [
        f"kafka://127.0.0.1:1/t?sasl.password={SECRET}&bogus=1",
        f"kafka://127.0.0.1:1/t?sasl.password={SECRET}&message.timeout.ms=2000",
        f"kafka://127.0.0.1:1/t?ssl.key.password={SECRET}&ssl.keystore.password={SECRET}"
        "&message.timeout.ms=2000",
        f"kafka://user:{SECRET}@127.0.0.1:1/t?message.timeout.ms=2000",
    ],
}
SECRET_CASES = [
    pytest.param(url, id=f"{dist}-{n}")
    for dist, urls in SECRET_URLS.items()
    if dist in TARGETS
    for n, url in enumerate(urls)
]


@pytest.mark.parametrize("url", SECRET_CASES)
def test_secrets_never_appear_in_reprs_errors_or_logs(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[BaseException] = []
    with caplog.at_level(logging.DEBUG):
        driver = None
        try:
            driver = connect(url)
            assert SECRET not in repr(driver)
            driver.send(Message("t"))
        except Exception as exc:
            errors.append(exc)
        finally:
            try:
                if driver is not None:
                    driver.close()
            except Exception as exc:
                errors.append(exc)
    assert errors, f"{url} was expected to fail somewhere"
    for exc in errors:
        chain = [exc, exc.__cause__, exc.__context__]
        text = " ".join(f"{e!r} {e}" for e in chain if e is not None)
        assert SECRET not in text, text
    assert SECRET not in caplog.text


def hermes_command() -> str:
    hermes = shutil.which("hermes") or str(Path(sys.executable).with_name("hermes"))
    if not Path(hermes).exists():
        pytest.skip("the hermes console script is not installed")
    return hermes


#: Lines after which a worker that runs on has shown what it will show: its retry of an
#: unreachable broker (the error names the broker), or the last start-up line, which
#: names the failed-message store.
_WORKER_SHOWN = ("broker unavailable (attempt 1)", "Messages given up on go to")
#: The longest a worker runs before it is stopped, whatever it printed.
_WORKER_MAX_S = 10.0


def run_until_done(args: list[str], cwd: Path, worker: bool) -> str:
    """Everything ``hermes ARGS`` printed: until it exits on its own (a refused URL, an
    unreachable broker), or -- a worker, which retries an unreachable broker -- until
    SIGTERM stops it once it printed one of :data:`_WORKER_SHOWN` (and what its
    shutdown prints)."""
    process = subprocess.Popen(
        args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if not worker:
        try:
            output, _ = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        return output
    lines: list[str] = []
    shown = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if any(mark in line for mark in _WORKER_SHOWN):
                shown.set()
        shown.set()  # it exited

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    shown.wait(_WORKER_MAX_S)
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    reader.join(10)
    assert process.stdout is not None
    process.stdout.close()
    return "".join(lines)


@pytest.mark.parametrize("url", SECRET_CASES)
def test_the_cli_masks_secrets_in_every_command(url: str, tmp_path: Path) -> None:
    hermes = hermes_command()
    (tmp_path / "jobs.py").write_text(
        "from hermes.core import EchoHandler\nH = {'t': EchoHandler()}\n"
    )
    queue = (tmp_path / "queue").as_uri()
    runs = {
        "emit": [hermes, "emit", "--url", url, "t", "{}", "-vv"],
        "worker": [hermes, "worker", "--url", url, "--handlers", "jobs:H", "-vv"],
        "worker --failed-url": [
            hermes, "worker", "--url", queue, "--failed-url", url, "--handlers", "jobs:H", "-vv",
        ],
        "failed list": [hermes, "failed", "--url", url, "list", "-vv"],
        "shutdown": [hermes, "shutdown", "--url", url],
    }  # fmt: skip
    for name, args in runs.items():
        output = run_until_done(args, tmp_path, worker=name.startswith("worker"))
        assert output, f"hermes {name} printed nothing"
        assert SECRET not in output, f"hermes {name}:\n{output}"


def test_a_worker_logs_its_url_with_the_secret_options_masked(tmp_path: Path) -> None:
    """The one URL here a broker accepts: the worker runs, and its start line shows the URL."""
    if "kafka" not in TARGETS:
        pytest.skip("drivers/kafka is not in this tree")
    from hermes_test_services import service_url

    hermes = hermes_command()
    (tmp_path / "jobs.py").write_text(
        "from hermes.core import EchoHandler\nH = {'t': EchoHandler()}\n"
    )
    with service_url("kafka") as base:
        url = DriverUrl.parse(isolated_url(base, f"secret-{uuid.uuid4().hex[:8]}")).with_options(
            **{"sasl.password": SECRET}
        )
        emitted = subprocess.run(
            [hermes, "emit", "--url", url, "t", "{}"], capture_output=True, text=True, timeout=120
        )
        assert emitted.returncode == 0, emitted.stdout + emitted.stderr
        worker = subprocess.run(
            [hermes, "worker", "--url", url, "--handlers", "jobs:H", "--max-items", "1", "-v"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    output = emitted.stdout + emitted.stderr + worker.stdout + worker.stderr
    assert worker.returncode == 0, output
    assert SECRET not in output, output
    assert "sasl.password=***" in worker.stderr
