"""``file://`` URLs: which directory they name, their options, and isolation for the kit."""

from __future__ import annotations

import os

import pytest

from hermes.core import ConfigurationError, Message, available_drivers, connect
from hermes.core.driver import DriverUrl
from hermes.core.drivertools import isolated_url
from hermes.drivers.filesystem import FileSystemDriver, directory_from_url


@pytest.mark.parametrize(
    ("url", "directory"),
    [
        ("file:///var/spool/hermes", "/var/spool/hermes"),
        ("file://localhost/var/spool/hermes", "/var/spool/hermes"),
        ("file://relative/path", "relative/path"),
        ("file://MixedCase/Dir", "MixedCase/Dir"),
        ("file://./queue", "./queue"),
        ("file:queue", "queue"),
        ("file:///with%20space", "/with space"),
        ("file://~/queue", "~/queue"),
    ],
)
def test_a_file_url_names_its_directory(url, directory):
    assert directory_from_url(DriverUrl.parse(url)) == directory


def test_a_relative_directory_is_made_absolute_at_connect(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    driver = connect("file://jobs/queue")
    assert isinstance(driver, FileSystemDriver)
    assert driver.path == str(tmp_path / "jobs" / "queue")


def test_a_home_directory_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert connect("file://~/queue").path == str(tmp_path / "queue")


def test_url_options_reach_the_driver(tmp_path):
    driver = connect(f"file://{tmp_path}?fsync=false&poll_interval_s=0.05&recovery_interval_s=2")
    assert (driver.fsync, driver.poll_interval_s, driver.recovery_interval_s) == (False, 0.05, 2.0)
    assert driver.capabilities.wake_up_s == 0.05  # an idle worker polls that often
    assert driver.capabilities.redelivery_timeout_s == 2.0


def test_keyword_options_of_connect_override_the_url(tmp_path):
    driver = connect(f"file://{tmp_path}?fsync=false", fsync=True)
    assert driver.fsync is True


def test_fsync_is_on_by_default(tmp_path):
    assert connect(f"file://{tmp_path}").fsync is True


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("file:///q?fsnyc=false", "unknown option(s) fsnyc"),
        ("file:///q?fsync=maybe", "must be true or false"),
        ("file:///q?poll_interval_s=fast", "must be a number"),
        ("file:///q?poll_interval_s=3", "poll_interval_s must be > 0 and <= 1"),
        ("file://", "names no queue directory"),
        ("file:///", "names no queue directory"),
        ("file://user:secret@host/q", "takes no user, password or port"),
        ("file://host:99/q", "takes no user, password or port"),
    ],
)
def test_bad_urls_fail_at_connect_saying_what_is_wrong(url, complaint):
    with pytest.raises(ConfigurationError) as info:
        connect(url)
    assert complaint in str(info.value)
    assert "secret" not in str(info.value)


def test_unknown_keyword_options_are_refused(tmp_path):
    with pytest.raises(ConfigurationError, match=r"unknown keyword option.*colour"):
        connect(f"file://{tmp_path}", colour="blue")


def test_the_plugin_is_registered_for_file_urls():
    [plugin] = [d for d in available_drivers() if d.name == "filesystem"]
    assert plugin.schemes == ("file",)
    assert plugin.capabilities == FileSystemDriver.capabilities
    assert plugin.distribution == "hermes-filesystem"


def test_isolation_gives_each_namespace_its_own_subdirectory_with_the_same_options(tmp_path):
    url = isolated_url(f"file://{tmp_path}?fsync=false", "test-1")
    assert url == f"file://{tmp_path}/test-1?fsync=false"
    driver = connect(url)
    assert driver.path == os.path.join(tmp_path, "test-1")
    assert driver.fsync is False


def test_isolation_of_a_relative_url_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert isolated_url("file://queue", "ns") == f"file://{tmp_path}/queue/ns"


@pytest.mark.parametrize("namespace", ["", "../escape", "a/b", "UPPER", "x" * 49])
def test_isolation_refuses_namespaces_that_are_not_plain_names(tmp_path, namespace):
    with pytest.raises(ConfigurationError, match="namespace"):
        isolated_url(f"file://{tmp_path}", namespace)


def test_isolated_queues_do_not_see_each_others_messages(tmp_path, receive, files):
    first = connect(isolated_url(f"file://{tmp_path}?fsync=false", "one"))
    second = connect(isolated_url(f"file://{tmp_path}?fsync=false", "two"))
    first.send_raw(b"{}")
    second.send(Message("mine"))
    assert receive(second, 1).types == ["mine"]
    assert files(tmp_path / "two" / "quarantine") == []
