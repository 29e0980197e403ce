"""FileSystemDriver in one process: order, delays, poison, purge, sending from threads and forks."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

import pytest
from hermes_test_support import DEADLINE_S

from hermes.core import (
    BrokerUnavailableError,
    ConfigurationError,
    DeliveryError,
    Emitter,
    Message,
    SerializeError,
    UnknownPriorityError,
    compat,
)
from hermes.core.compat import Dispatcher
from hermes.core.driver import SupportsPurge, SupportsTeardown
from hermes.core.spi._door import translate_errors
from hermes.drivers.filesystem import FileSystemDriver
from hermes.drivers.filesystem import _driver as driver_module


def test_a_sent_message_arrives_with_every_field_intact(driver, receive):
    sent = Message(
        "email", {"to": "a@example.com", "ü": [1, 2.5, None]}, created=1764480000.125, retries=3
    )
    driver.send(sent)
    received = receive(driver, 1)
    assert received.messages == [sent]
    assert received.priorities == [100]


def test_send_writes_one_file_in_new_and_nothing_is_left_in_tmp(driver, queue_dir, files):
    driver.send(Message("job"))
    assert len(files(queue_dir / "new")) == 1
    assert files(queue_dir / "tmp") == []


def test_a_handled_message_is_deleted_and_the_worker_directory_removed(
    driver, queue_dir, receive, files
):
    driver.send(Message("job"))
    receive(driver, 1)
    assert files(queue_dir / "new") == []
    assert files(queue_dir / "processing") == []


def test_a_message_whose_callback_returns_false_is_deleted_too(driver, queue_dir, receive, files):
    driver.send(Message("job"))
    receive(driver, 1, callback=lambda message, priority: False)
    assert files(queue_dir / "new") == []


def test_higher_priorities_come_first_and_fifo_within_a_priority(driver, receive):
    driver.setup_priority_queue("high", 200)
    driver.setup_priority_queue("low", 50)
    for name, priority in [("l1", 50), ("d1", 100), ("h1", 200), ("l2", 50), ("h2", 200)]:
        driver.send(Message(name), priority)
    driver.send(Message("d2"))
    received = receive(driver, 6)
    assert received.types == ["h1", "h2", "d1", "d2", "l1", "l2"]
    assert received.priorities == [200, 200, 100, 100, 50, 50]


def test_many_messages_of_one_priority_arrive_in_the_order_sent(driver, receive):
    names = [f"m{i}" for i in range(300)]
    for name in names:
        driver.send(Message(name))
    assert receive(driver, len(names)).types == names


def test_a_worker_restricted_to_some_priorities_leaves_the_others_queued(
    driver, queue_dir, receive, files
):
    driver.setup_priority_queue("high", 200)
    driver.send(Message("default"))
    driver.send(Message("high"), 200)
    assert receive(driver, 1, priorities=[200]).types == ["high"]
    remaining = files(queue_dir / "new")
    assert len(remaining) == 1 and remaining[0].startswith("100.")


def test_a_worker_that_does_not_know_a_priority_leaves_its_files_alone_and_says_so(
    queue_dir, receive, files, caplog
):
    emitter = FileSystemDriver(queue_dir, fsync=False)
    emitter.setup_priority_queue("urgent", 300)
    emitter.send(Message("urgent"), 300)
    emitter.send(Message("normal"))
    worker = FileSystemDriver(queue_dir, fsync=False)
    with caplog.at_level(logging.WARNING, logger="hermes.drivers.filesystem"):
        assert receive(worker, 1).types == ["normal"]
    assert [name.split(".")[0] for name in files(queue_dir / "new")] == ["300"]
    assert files(queue_dir / "quarantine") == []
    [warning] = [r.getMessage() for r in caplog.records]
    assert "priority 300, which this worker does not read" in warning


def test_a_worker_restricted_to_one_priority_does_not_warn_about_the_others(
    driver, receive, caplog
):
    driver.setup_priority_queue("high", 200)
    driver.send(Message("default"))
    driver.send(Message("high"), 200)
    with caplog.at_level(logging.WARNING, logger="hermes.drivers.filesystem"):
        assert receive(driver, 1, priorities=[200]).types == ["high"]
    assert caplog.records == []


def test_sending_to_an_unknown_priority_raises_and_writes_nothing(driver, queue_dir, files):
    with pytest.raises(UnknownPriorityError) as info:
        driver.send(Message("job"), 7)
    assert info.value.priority == 7
    assert files(queue_dir / "new") == []


def test_waiting_on_an_unknown_priority_raises(driver):
    with pytest.raises(UnknownPriorityError):
        compat.wait(driver, lambda message, priority: True, [7])


def test_a_payload_that_cannot_be_serialized_raises_before_any_file_is_written(
    driver, queue_dir, files
):
    with pytest.raises(SerializeError):
        driver.send(Message("job", {"bad": object()}))
    assert files(queue_dir / "tmp") == []
    assert files(queue_dir / "new") == []


def test_a_delayed_message_is_not_handed_out_before_it_is_due(driver, receive):
    execute_at = time.time() + 0.4
    driver.send(Message("later", execute_at=execute_at))
    received = receive(driver, 1)
    assert received.types == ["later"]
    assert received.times[0] >= execute_at
    assert received.messages[0].execute_at == execute_at


def test_a_delayed_message_does_not_hold_up_the_due_ones_behind_it(driver, receive):
    driver.setup_priority_queue("high", 200)
    driver.send(Message("later-high", execute_at=time.time() + 0.4), 200)
    driver.send(Message("now-low"))
    assert receive(driver, 2).types == ["now-low", "later-high"]


def test_a_message_due_in_the_past_runs_at_once_in_send_order(driver, receive):
    driver.send(Message("first"))
    driver.send(Message("overdue", execute_at=time.time() - 60))
    assert receive(driver, 2).types == ["first", "overdue"]


def test_a_message_sent_to_an_idle_worker_is_handled(driver, receive):
    compat.set_max_process_items(driver, 1)

    def send_later() -> None:
        time.sleep(0.2)  # let the worker go idle first; the result does not depend on it
        driver.send(Message("wake-up"))

    sender = threading.Thread(target=send_later)
    sender.start()
    received = receive(driver, 1)
    sender.join()
    assert received.types == ["wake-up"]


def test_wait_returns_after_max_items_and_leaves_the_rest(driver, queue_dir, receive, files):
    for i in range(5):
        driver.send(Message(f"m{i}"))
    assert receive(driver, 3).types == ["m0", "m1", "m2"]
    assert len(files(queue_dir / "new")) == 2


def test_a_shutdown_ends_an_idle_wait(driver):
    class Stop:
        def should_shutdown(self, start_time: float) -> bool:
            return time.time() >= start_time + 0.1

        def shutdown(self, at: float | None = None) -> bool:
            return True

    compat.set_shutdown(driver, Stop())
    errors: list[BaseException] = []
    handled: list[Message] = []

    def run() -> None:
        try:
            compat.wait(driver, lambda message, priority: handled.append(message) is None)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(DEADLINE_S)
    assert not worker.is_alive(), "wait() did not return after shutdown"
    assert errors == []
    assert handled == []


def test_a_callback_that_raises_puts_the_message_back_at_the_head_of_the_queue(
    driver, queue_dir, receive, files
):
    driver.send(Message("first"))
    driver.send(Message("second"))

    def interrupt(message: Message, priority: int) -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        receive(driver, 1, callback=interrupt)
    assert len(files(queue_dir / "new")) == 2
    assert files(queue_dir / "processing") == []
    assert receive(driver, 2).types == ["first", "second"]


def test_fsync_off_and_on_both_deliver(queue_dir, receive):
    fast = FileSystemDriver(queue_dir, fsync=False)
    safe = FileSystemDriver(queue_dir, fsync=True)
    fast.send(Message("fast"))
    safe.send(Message("safe"))
    assert receive(fast, 2).types == ["fast", "safe"]


def test_directories_are_created_on_first_use_only(queue_dir, files):
    driver = FileSystemDriver(queue_dir)
    assert not queue_dir.exists()
    driver.send(Message("job"))
    assert files(queue_dir) == ["new", "processing", "quarantine", "tmp"]


def test_send_batch_queues_every_message_in_order(driver, receive):
    batch = [Message(f"b{i}") for i in range(20)]
    driver.send_batch(batch)
    assert receive(driver, 20).messages == batch


def test_send_batch_serializes_all_before_writing_any(driver, queue_dir, files):
    with pytest.raises(SerializeError):
        driver.send_batch([Message("ok"), Message("bad", {"x": {1, 2}})])
    assert files(queue_dir / "new") == []


def test_a_send_that_cannot_write_raises_a_delivery_error(driver, queue_dir, monkeypatch):
    def no_fsync(fd):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(driver_module.os, "fsync", no_fsync)
    driver.fsync = True
    with pytest.raises(DeliveryError, match="failed while sending") as info:
        driver.send(Message("job"))
    assert isinstance(info.value.__cause__, OSError)
    assert list((queue_dir / "tmp").iterdir()) == []  # the partial file is gone


def test_sending_from_many_threads_at_once_loses_nothing(driver, receive):
    def send_many(thread: int) -> None:
        for i in range(50):
            driver.send(Message("job", {"thread": thread, "i": i}))

    threads = [threading.Thread(target=send_many, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    received = receive(driver, 400)
    assert len({m.id for m in received.messages}) == 400
    for thread in range(8):  # each thread's messages keep their order
        mine = [m.payload["i"] for m in received.messages if m.payload["thread"] == thread]
        assert mine == list(range(50))


def test_a_driver_created_before_fork_sends_from_parent_and_child(driver, queue_dir, receive):
    driver.send(Message("before-fork"))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            for i in range(30):
                driver.send(Message("child", {"i": i}))
        finally:
            os._exit(0)
    for i in range(30):
        driver.send(Message("parent", {"i": i}))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    origins = {name.split(".")[3] for name in os.listdir(queue_dir / "new")}
    assert len(origins) == 2  # the child names its files as itself, not as its parent
    received = receive(driver, 61)
    assert len({m.id for m in received.messages}) == 61
    child = [m.payload["i"] for m in received.messages if m.type == "child"]
    assert child == list(range(30))


def test_purge_deletes_what_waits_in_new_and_says_how_many(driver, queue_dir, files):
    assert isinstance(driver, SupportsPurge)
    driver.setup_priority_queue("high", 200)
    driver.send_batch([Message("a"), Message("b", execute_at=time.time() + 3600)])
    driver.send(Message("c"), 200)
    assert driver.purge(200) == 1
    assert len(files(queue_dir / "new")) == 2
    assert driver.purge() == 2
    assert files(queue_dir / "new") == []
    with pytest.raises(UnknownPriorityError, match="priority 7"):
        driver.purge(7)


def test_teardown_deletes_every_message_and_the_directory(driver, queue_dir):
    assert isinstance(driver, SupportsTeardown)
    driver.send(Message("queued"))
    driver.send_raw(b"poison")
    driver.send(Message("later", execute_at=time.time() + 3600))
    compat.set_max_process_items(driver, 1)
    compat.wait(driver, lambda message, priority: True)  # quarantines the poison on the way
    driver.teardown()
    assert not queue_dir.exists()
    driver.teardown()  # idempotent


def test_teardown_keeps_files_of_the_user_next_to_the_queue(driver, queue_dir, files):
    driver.send(Message("queued"))
    (queue_dir / "notes.txt").write_text("mine")
    driver.teardown()
    assert files(queue_dir) == ["notes.txt"]


def test_a_queue_torn_down_by_another_process_works_again_on_the_next_send(
    driver, queue_dir, receive
):
    driver.send(Message("old"))
    FileSystemDriver(queue_dir).teardown()
    driver.send(Message("new"))
    assert receive(driver, 1).types == ["new"]


def test_a_worker_whose_queue_is_torn_down_while_it_waits_goes_on_with_new_messages(
    driver, queue_dir, receive, files
):
    driver.send(Message("before"))
    seen: list[str] = []

    def tear_down_then_send(message: Message, priority: int) -> bool:
        seen.append(message.type)
        if message.type == "before":
            FileSystemDriver(queue_dir).teardown()  # removes this worker's own directory too
            FileSystemDriver(queue_dir, fsync=False).send(Message("after"))
        return True

    receive(driver, 2, callback=tear_down_then_send)
    assert seen == ["before", "after"]
    assert files(queue_dir / "processing") == []


def test_the_emitter_and_dispatcher_work_on_it(driver, receive):
    handled = []

    class Handler:
        def handle(self, message: Message) -> bool:
            handled.append(message.payload)
            return True

    Emitter(driver).emit(Message("greet", {"name": "Ada"}))
    dispatcher = Dispatcher(driver).register_handler("greet", Handler())
    compat.set_max_process_items(driver, 1)
    dispatcher.handle()
    assert handled == [{"name": "Ada"}]


# Poison ------------------------------------------------------------------------


def test_a_file_that_is_not_json_is_quarantined_with_its_reason_and_the_rest_still_arrive(
    driver, queue_dir, receive, files, caplog
):
    driver.send(Message("before"))
    driver.send_raw(b"{not json")
    driver.send(Message("after"))
    with caplog.at_level(logging.ERROR, logger="hermes.drivers.filesystem"):
        received = receive(driver, 2)
    assert received.types == ["before", "after"]
    quarantined = files(queue_dir / "quarantine")
    assert len(quarantined) == 2
    body, reason = quarantined
    assert reason == body + ".reason"
    assert (queue_dir / "quarantine" / body).read_bytes() == b"{not json"
    reason_text = (queue_dir / "quarantine" / reason).read_text()
    assert reason_text.startswith("Cannot unserialize message from '{not json'")
    assert f"file: new/{body}" in reason_text
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert body in record.getMessage() and "Cannot unserialize" in record.getMessage()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"message":{"id":"x","created":1}}', "Invalid message format"),
        (b"\xff\xfe not utf-8", "Cannot unserialize message"),
        (b"", "Cannot unserialize message"),
        (b"[1, 2]", "Cannot unserialize message"),
    ],
)
def test_bodies_that_are_not_messages_are_quarantined_with_the_reason(
    driver, queue_dir, receive, files, body, reason
):
    driver.send_raw(body)
    driver.send(Message("good"))
    assert receive(driver, 1).types == ["good"]
    [kept, why] = files(queue_dir / "quarantine")
    assert (queue_dir / "quarantine" / kept).read_bytes() == body
    assert (queue_dir / "quarantine" / why).read_text().startswith(reason)


def test_a_file_dropped_into_new_by_hand_is_quarantined_under_its_own_name(
    driver, queue_dir, receive, files, caplog
):
    driver.send(Message("good"))
    (queue_dir / "new" / "hello.txt").write_text("hi")
    (queue_dir / "new" / "a-directory").mkdir()
    with caplog.at_level(logging.ERROR, logger="hermes.drivers.filesystem"):
        assert receive(driver, 1).types == ["good"]
    quarantine = queue_dir / "quarantine"
    assert files(quarantine) == [
        "a-directory",
        "a-directory.reason",
        "hello.txt",
        "hello.txt.reason",
    ]
    assert (quarantine / "hello.txt").read_text() == "hi"
    assert "does not follow the Hermes scheme" in (quarantine / "hello.txt.reason").read_text()
    assert any("new/hello.txt" in r.getMessage() for r in caplog.records)
    assert files(queue_dir / "new") == []


def test_a_stray_named_like_a_priority_is_quarantined_when_it_reaches_the_head_of_its_queue(
    driver, queue_dir, receive, files
):
    # Sorted as text with the messages of priority 100 (its name begins "100."), and
    # before them: it is found out when the worker comes to it, and they still arrive.
    driver.send(Message("first"))
    (queue_dir / "new" / "100.-not-a-message.json").write_text("{}")
    driver.send(Message("second"))
    assert receive(driver, 2).types == ["first", "second"]
    assert "100.-not-a-message.json" in files(queue_dir / "quarantine")
    assert files(queue_dir / "new") == []


def test_a_second_stray_file_with_the_same_name_does_not_overwrite_the_first(
    driver, queue_dir, receive, files
):
    for content in ("one", "two"):
        (queue_dir / "new").mkdir(parents=True, exist_ok=True)
        (queue_dir / "new" / "notes").write_text(content)
        driver.send(Message("tick"))
        receive(driver, 1)
    quarantine = queue_dir / "quarantine"
    assert files(quarantine) == ["notes", "notes.1", "notes.1.reason", "notes.reason"]
    assert {(quarantine / "notes").read_text(), (quarantine / "notes.1").read_text()} == {
        "one",
        "two",
    }


def test_a_stray_file_named_like_the_lock_does_not_break_the_worker(
    driver, queue_dir, receive, files
):
    (queue_dir / "new").mkdir(parents=True)
    (queue_dir / "new" / ".lock").write_text("user data")
    driver.send(Message("good"))
    assert receive(driver, 1).types == ["good"]
    assert (queue_dir / "quarantine" / ".lock").read_text() == "user data"


@pytest.fixture
def open_fails_once(monkeypatch) -> list[str]:
    """The driver's first os.open() of a claimed file fails with EMFILE; the paths it failed."""
    failed: list[str] = []
    real_open = os.open

    def open_failing_once(path, *args, **kwargs):
        if not failed and os.sep + "processing" + os.sep in os.fspath(path):
            failed.append(path)
            raise OSError(errno.EMFILE, "Too many open files", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(driver_module.os, "open", open_failing_once)
    return failed


def test_a_read_error_puts_the_message_back_instead_of_quarantining_it(
    driver, queue_dir, files, open_fails_once
):
    driver.send(Message("job"))
    with driver.consumer(()) as consumer:
        with pytest.raises(BrokerUnavailableError, match="unavailable while receiving") as info:
            with translate_errors(driver, "receiving"):  # as the Worker calls it
                consumer.receive(1.0)
        assert info.value.__cause__.errno == errno.EMFILE
        assert files(queue_dir / "quarantine") == []
        assert len(files(queue_dir / "new")) == 1
    assert files(queue_dir / "processing") == []


def test_the_worker_retries_a_read_error_and_then_handles_the_message(
    driver, queue_dir, receive, files, open_fails_once, caplog
):
    driver.send(Message("job"))
    assert receive(driver, 1).types == ["job"]
    assert open_fails_once
    assert any("Too many open files" in r.getMessage() for r in caplog.records)
    assert files(queue_dir / "quarantine") == []


# Housekeeping ------------------------------------------------------------------


def test_files_claimed_by_a_worker_whose_lock_is_free_return_to_new(
    driver, queue_dir, receive, files
):
    driver.send(Message("claimed"))
    [name] = files(queue_dir / "new")
    ghost = queue_dir / "processing" / "12345-deadbeef"
    ghost.mkdir()
    (ghost / ".lock").touch()  # nobody holds it
    (queue_dir / "new" / name).rename(ghost / name)
    assert receive(driver, 1).types == ["claimed"]
    assert files(queue_dir / "processing") == []


def test_a_partial_file_left_in_tmp_for_over_an_hour_is_removed(driver, queue_dir, files, caplog):
    driver.send(Message("job"))
    stale = queue_dir / "tmp" / "100.1.1.abc.json"
    stale.write_bytes(b'{"mess')
    old = time.time() - 7200
    os.utime(stale, (old, old))
    fresh = queue_dir / "tmp" / "100.2.2.abc.json"
    fresh.write_bytes(b"being written")
    compat.set_max_process_items(driver, 1)
    with caplog.at_level(logging.WARNING, logger="hermes.drivers.filesystem"):
        compat.wait(driver, lambda message, priority: True)
    assert files(queue_dir / "tmp") == [fresh.name]
    assert any(stale.name in r.getMessage() for r in caplog.records)


def test_repr_names_the_directory(queue_dir):
    assert repr(FileSystemDriver(queue_dir)) == f"<FileSystemDriver file://{queue_dir}>"


@pytest.mark.parametrize(
    "options",
    [{"poll_interval_s": 0}, {"poll_interval_s": 5}, {"recovery_interval_s": -1}],
)
def test_nonsense_intervals_are_refused(queue_dir, options):
    with pytest.raises(ValueError, match="interval_s"):
        FileSystemDriver(queue_dir, **options)


def test_an_empty_path_is_refused_rather_than_taken_as_the_working_directory():
    with pytest.raises(ConfigurationError, match="empty path cannot be a queue directory"):
        FileSystemDriver("")


def test_the_message_file_is_plain_hermes_json(driver, queue_dir):
    driver.send(Message("job", {"a": 1}, id="fixed", created=1.5))
    [name] = os.listdir(queue_dir / "new")
    assert (queue_dir / "new" / name).read_text() == (
        '{"message":{"id":"fixed","type":"job","created":1.5,"payload":{"a":1},'
        '"execute_at":null,"retries":0}}'
    )


def test_a_big_message_arrives_whole(driver, receive):
    payload = {"blob": "x" * (4 * 1024 * 1024)}
    driver.send(Message("big", payload))
    assert receive(driver, 1).messages[0].payload == payload


def test_each_claim_counts_a_delivery_in_the_file_name_and_a_release_keeps_it(driver, queue_dir):
    assert driver.capabilities.counts_deliveries
    driver.send(Message("counted"))
    for expected in (1, 2, 3):
        consumer = driver.consumer([])
        received = consumer.receive(1)
        assert received is not None and received.delivery_count == expected
        consumer.release(received)
        consumer.close()
    [name] = os.listdir(queue_dir / "new")
    assert name.endswith(".d3.json")
    consumer = driver.consumer([])
    received = consumer.receive(1)
    assert received is not None and received.delivery_count == 4
    consumer.ack(received)
    consumer.close()
    assert os.listdir(queue_dir / "new") == []
