"""A queue directory as a failed-message store: listed and deleted from without claiming."""

from __future__ import annotations

from pathlib import Path

from hermes_test_support import walk_pages

from hermes.core import FailedStore, Message
from hermes.core.drivertools import MessageSerializer
from hermes.drivers.filesystem import FileSystemDriver
from hermes.drivers.filesystem._browse import DirectoryBrowser


def test_the_browser_lists_new_in_dequeue_order_and_skips_strays(
    driver: FileSystemDriver, queue_dir: Path
) -> None:
    driver.setup_priority_queue("high", 200)
    low, high = Message("low"), Message("high")
    driver.send(low)
    driver.send(high, 200)
    (queue_dir / "new" / "not-a-message.txt").write_text("x")

    listed = [
        MessageSerializer().unserialize(body).id for _, body in DirectoryBrowser(driver).entries()
    ]

    assert listed == [high.id, low.id]


def test_remove_deletes_the_file_once(driver: FileSystemDriver, queue_dir: Path) -> None:
    driver.send(Message("job"))
    browser = DirectoryBrowser(driver)
    ((entry, _),) = browser.entries()

    assert browser.remove(entry) is True
    assert browser.remove(entry) is False
    assert list((queue_dir / "new").iterdir()) == []


def test_a_directory_nothing_was_sent_to_lists_nothing(tmp_path: Path) -> None:
    driver = FileSystemDriver(tmp_path / "never-used")

    assert list(DirectoryBrowser(driver).entries()) == []


def test_the_plugin_offers_the_browser_to_a_store(tmp_path: Path) -> None:
    queue = FileSystemDriver(tmp_path / "queue", fsync=False)
    message = Message("mail", {"to": "ana"}, retries=3)

    with FailedStore.connect((tmp_path / "failed").as_uri()) as store:
        store.keep(message, "Mail: can_retry() said no")
        (listed,) = store.messages()
        assert (listed.id, listed.failed_reason) == (message.id, "Mail: can_retry() said no")
        assert store.retry(queue) == [listed]
        assert store.messages() == []

    ((_, body),) = DirectoryBrowser(queue).entries()
    again = MessageSerializer().unserialize(body)
    assert (again.id, again.payload, again.retries) == (message.id, {"to": "ana"}, 0)


def test_pages_follow_the_dequeue_order_to_the_last_message(driver: FileSystemDriver) -> None:
    driver.setup_priority_queue("high", 200)
    sent = [Message("job", {"n": n}) for n in range(25)]
    for n, message in enumerate(sent):
        driver.send(message, 200 if n % 5 == 0 else 100)

    pages = walk_pages(DirectoryBrowser(driver), 7, 1 << 20)
    listed = [MessageSerializer().unserialize(body).id for page in pages for body in page]

    assert [len(page) for page in pages] == [7, 7, 7, 4]
    assert listed == [
        body_id
        for body_id in (
            MessageSerializer().unserialize(b).id for _, b in DirectoryBrowser(driver).entries()
        )
    ]
    assert DirectoryBrowser(driver).page(None, 100, 1).entries[0][1] is not None  # one at least
    assert len(DirectoryBrowser(driver).page(None, 100, 1).entries) == 1
