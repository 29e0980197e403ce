"""A queue directory this process may not use: refused, not retried; ``hermes`` exits 2."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.core import (
    BrokerRefusedError,
    BrokerUnavailableError,
    DriverError,
    Message,
    Worker,
    connect,
)
from hermes.drivers.filesystem import FileSystemDriver

HERMES = shutil.which("hermes", path=str(Path(sys.executable).parent)) or shutil.which("hermes")


@pytest.fixture
def under_a_file(tmp_path: Path) -> Path:
    """A queue path whose parent is a regular file: no directory can be made there."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    return blocker / "queue"


def test_a_queue_under_a_regular_file_refuses_a_send(under_a_file):
    driver = FileSystemDriver(under_a_file)
    with pytest.raises(BrokerRefusedError, match="refused while sending") as info:
        driver.send(Message("job"))
    assert isinstance(info.value.__cause__, NotADirectoryError)
    assert "\n" not in str(info.value)


def test_a_worker_on_a_queue_under_a_regular_file_stops_at_once_instead_of_retrying(under_a_file):
    worker = Worker(FileSystemDriver(under_a_file), lambda m, p: True, handle_signals=False)
    with pytest.raises(BrokerRefusedError, match="a-file"):
        worker.run()


def test_a_file_where_the_new_directory_should_be_is_refused(tmp_path):
    queue = tmp_path / "queue"
    queue.mkdir()
    (queue / "new").write_text("in the way")
    with pytest.raises(BrokerRefusedError, match="in the way"):
        FileSystemDriver(queue).send(Message("job"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_directory_this_user_cannot_write_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(BrokerRefusedError) as info:
            FileSystemDriver(locked / "queue").send(Message("job"))
        assert isinstance(info.value.__cause__, PermissionError)
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (errno.EACCES, BrokerRefusedError),
        (errno.EROFS, BrokerRefusedError),
        (errno.EMFILE, BrokerUnavailableError),
        (errno.ENOSPC, BrokerUnavailableError),
        (errno.EINVAL, DriverError),
    ],
)
def test_os_errors_mean_refused_passing_or_failed_by_their_errno(tmp_path, code, kind):
    driver = FileSystemDriver(tmp_path)
    assert driver.classify_error(OSError(code, os.strerror(code))) is kind
    assert driver.classify_error(ValueError("not the filesystem's")) is None


def test_hermes_worker_on_a_queue_it_may_not_use_exits_2_with_one_line(under_a_file, tmp_path):
    assert HERMES is not None, "the hermes command is not installed"
    (tmp_path / "jobs.py").write_text(
        'from hermes.core import EchoHandler\n\nHANDLERS = {"job": EchoHandler()}\n'
    )
    done = subprocess.run(
        [HERMES, "worker", "--url", f"file://{under_a_file}", "--handlers", "jobs:HANDLERS"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # The worker's start-up INFO lines may come first; the mistake itself is one line.
    errors = [line for line in done.stderr.splitlines() if line.startswith("hermes: error:")]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(errors) == 1, done.stderr


def test_the_same_queue_somewhere_writable_works(tmp_path):
    driver = connect(f"file://{tmp_path / 'queue'}")
    driver.send(Message("job"))
    driver.close()
