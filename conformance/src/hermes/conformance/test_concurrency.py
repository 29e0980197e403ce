"""Threads and fork(): how web servers use a driver.

``send()`` is safe to call from many threads at once: 8 threads share one
driver object and emit 100 messages each; every message is delivered exactly
as sent, once. A driver object used before ``os.fork()`` (a pre-fork server's
master) works in the child without sharing the parent's sockets: the child
emits and consumes through it, and the parent keeps using it afterwards. And
as a pre-fork server runs it: three children and the parent send through it
at the same time, 40 messages each, and no send fails.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

import pytest

from hermes.conformance._harness import (
    DELIVERY_S,
    QUIET_S,
    Kit,
    TotalQueue,
    fields,
    scaled,
    wait_for_progress,
    wait_quiet,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.core import Emitter, Message, Worker
from hermes.core.driver import Driver, SupportsRecords

_THREADS = 8
_PER_THREAD = 100
_CHILDREN = 3
_PER_PROCESS = 40


@pytest.mark.hermes_check("concurrent send", "8 threads x 100 messages through one driver")
def test_eight_threads_sharing_one_driver_emit_800_messages_delivered_exactly_as_sent(
    hermes_kit: Kit,
) -> None:
    emitter = Emitter(hermes_kit.sender)
    start = threading.Barrier(_THREADS)
    batches = [
        [
            Message(JOB, {"n": t * _PER_THREAD + i, "thread": t, "text": f"{t}/{i} ✓"})
            for i in range(_PER_THREAD)
        ]
        for t in range(_THREADS)
    ]
    errors: list[BaseException] = []

    def emit_batch(batch: list[Message]) -> None:
        try:
            start.wait()
            for message in batch:
                emitter.emit(message)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=emit_batch, args=(batch,)) for batch in batches]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + scaled(6 * DELIVERY_S)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "concurrent send() calls hang"
    assert not errors, f"concurrent send() raised: {errors[:3]}"

    sent = {m.id: m for batch in batches for m in batch}
    ledger = hermes_kit.ledger
    hermes_kit.worker()
    wait_for_progress(ledger.distinct, len(sent), DELIVERY_S)
    wait_quiet(lambda: len(ledger), QUIET_S / 2, DELIVERY_S)

    check = TotalQueue.of(sent, ledger.ids())
    hermes_kit.report(check.summary())
    assert (len(check.lost), len(check.duplicated), len(check.unexpected)) == (0, 0, 0), (
        f"what {_THREADS} threads sent through one driver: {check.summary()}"
    )
    changed = [
        e.message.id for e in ledger.entries() if fields(e.message) != fields(sent[e.message.id])
    ]
    assert not changed, f"{len(changed)} messages arrived different from how they were sent"


class _Until:
    """A Shutdown that stops once ``done()`` is true or the deadline passed."""

    def __init__(self, done: Any, timeout_s: float) -> None:
        self.done = done
        self.deadline = time.monotonic() + scaled(timeout_s)

    def should_shutdown(self, start_time: float) -> bool:
        return bool(self.done()) or time.monotonic() >= self.deadline

    def shutdown(self, at: float | None = None) -> bool:
        self.deadline = 0.0
        return True


def _report_and_exit(fd: int, work: Callable[[], dict[str, Any]]) -> NoReturn:
    """In a forked child: run ``work``, write what it returned (or the traceback) to ``fd``
    as JSON, and exit, 0 when it returned; never return."""
    code = 1
    result: dict[str, Any] = {}
    try:
        result = work()
        code = 0
    except BaseException:
        result = {"error": traceback.format_exc()[-30_000:]}
    finally:
        try:
            os.write(fd, json.dumps(result).encode())
        finally:
            os._exit(code)


def _in_child(driver: Driver, message: Message, fd: int) -> NoReturn:
    """Emit and consume ``message`` through ``driver``; report on ``fd``; never return."""

    def work() -> dict[str, Any]:
        Emitter(driver).emit(message)
        seen: list[str] = []

        def callback(received: Message, priority: int) -> bool:
            seen.append(received.id)
            return True

        stop = _Until(lambda: message.id in seen, DELIVERY_S)
        Worker(driver, callback, shutdown=stop, handle_signals=False).run()
        driver.close()
        return {"seen": seen}

    _report_and_exit(fd, work)


def _child_result(pid: int, fd: int, timeout_s: float) -> tuple[int | None, dict[str, Any]]:
    """The child's exit code (None if it had to be killed) and the JSON it wrote."""
    statuses: list[int] = []

    def exited() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            statuses.append(status)
        return bool(done)

    code: int | None = None
    if wait_until(exited, timeout_s):
        code = os.waitstatus_to_exitcode(statuses[0])
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    with os.fdopen(fd, "rb") as pipe:  # the child is gone: read() ends at EOF
        text = pipe.read().decode()
    return code, (json.loads(text) if text else {})


@pytest.mark.hermes_check("fork", "a driver used before fork()")
def test_a_driver_used_before_fork_emits_and_consumes_in_the_child(hermes_kit: Kit) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("not verified: os.fork() is not available on this platform")
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    driver = hermes_kit.driver()
    emitter = Emitter(driver)
    first = hermes_kit.message(1)
    emitter.emit(first)  # the parent has used the driver: its connections exist
    in_child = hermes_kit.message(2)
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+ warns when threads exist
        pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _in_child(driver, in_child, write_fd)
    os.close(write_fd)

    code, result = _child_result(pid, read_fd, DELIVERY_S + caps.redelivery_timeout_s)
    assert "error" not in result, f"in the forked child:\n{result['error']}"
    assert code == 0, f"the forked child did not finish in time (exit code {code})"
    child_seen: list[str] = result["seen"]
    assert in_child.id in child_seen, "the child did not receive what it emitted"

    last = hermes_kit.message(3)
    emitter.emit(last)  # the parent keeps using the driver after the child closed it
    hermes_kit.worker(driver=driver)
    if caps.cross_process:
        hermes_kit.claim("child emits and consumes, the parent goes on; nothing lost or doubled")
        left = {first.id, last.id} - set(child_seen)
        bound = DELIVERY_S + caps.redelivery_timeout_s
        assert wait_until(lambda: left <= set(ledger.ids()), bound), (
            f"the parent's worker did not receive {len(left - set(ledger.ids()))} of the "
            f"{len(left)} messages the child left within {bound} s (unscaled)"
        )
        wait_quiet(lambda: len(ledger), QUIET_S / 2, DELIVERY_S)
        check = TotalQueue.of([first.id, in_child.id, last.id], child_seen + ledger.ids())
        assert (len(check.lost), len(check.duplicated), len(check.unexpected)) == (0, 0, 0), (
            f"what the parent and a forked child sent: {check.summary()}"
        )
    else:
        hermes_kit.claim("child emits and consumes (on its copy of the broker), the parent goes on")
        mine = {first.id, last.id}
        assert wait_until(lambda: mine <= set(ledger.ids()), DELIVERY_S), (
            f"the parent's worker did not receive {len(mine - set(ledger.ids()))} of the 2 "
            f"messages the parent sent around the fork within {DELIVERY_S} s (scaled)"
        )


def _send_all(driver: Driver, messages: list[Message]) -> list[str]:
    """Emit each of ``messages``; what each failed send raised."""
    emitter = Emitter(driver)
    errors = []
    for message in messages:
        try:
            emitter.emit(message)
        except Exception as exc:
            errors.append(f"message {message.id}: {exc!r}")
    return errors


def _sending_child(
    driver: Driver, messages: list[Message], go_fd: int, fd: int, consume: bool
) -> NoReturn:
    """Wait for the go, send ``messages`` through ``driver``; report on ``fd``; never return."""

    def work() -> dict[str, Any]:
        os.read(go_fd, 1)
        errors = _send_all(driver, messages)
        seen: list[str] = []
        if consume:  # an in-process broker: the child's copy holds what it sent
            wanted = {m.id for m in messages}

            def callback(received: Message, priority: int) -> bool:
                seen.append(received.id)
                return True

            stop = _Until(lambda: wanted <= set(seen), DELIVERY_S)
            Worker(driver, callback, shutdown=stop, handle_signals=False).run()
        driver.close()
        return {"errors": errors, "seen": seen}

    _report_and_exit(fd, work)


@pytest.mark.hermes_check("fork", "3 children and the parent send at once")
def test_children_forked_from_a_used_driver_send_at_once_with_the_parent(hermes_kit: Kit) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("not verified: os.fork() is not available on this platform")
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    driver = hermes_kit.driver()
    first = hermes_kit.message(0)
    Emitter(driver).emit(first)  # the parent has used the driver: its connections exist
    batches = [
        [hermes_kit.message(1 + p * _PER_PROCESS + i) for i in range(_PER_PROCESS)]
        for p in range(_CHILDREN + 1)
    ]
    go_read, go_write = os.pipe()
    children: list[tuple[int, int]] = []
    for batch in batches[1:]:
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+ warns when threads exist
            pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _sending_child(driver, batch, go_read, write_fd, consume=not caps.cross_process)
        os.close(write_fd)
        children.append((pid, read_fd))
    os.close(go_read)
    os.write(go_write, b"x" * _CHILDREN)  # the children start sending ...
    os.close(go_write)
    errors = {"the parent": _send_all(driver, batches[0])}  # ... and so does the parent

    results = []
    for n, (pid, read_fd) in enumerate(children, 1):
        code, result = _child_result(pid, read_fd, DELIVERY_S + caps.redelivery_timeout_s)
        assert "error" not in result, f"in forked child {n}:\n{result['error']}"
        assert code == 0, f"forked child {n} did not finish in time (exit code {code})"
        errors[f"child {n}"] = result["errors"]
        results.append(result)
    failed = {who: e for who, e in errors.items() if e}
    assert not failed, (
        f"{sum(len(e) for e in failed.values())} of {(_CHILDREN + 1) * _PER_PROCESS} sends "
        f"failed while {_CHILDREN} forked children and the parent sent at once: "
        + "; ".join(f"{who}: {e[0]}" for who, e in failed.items())
    )

    hermes_kit.worker(driver=driver)
    if caps.cross_process:
        hermes_kit.claim(
            f"{_CHILDREN} children and the parent, {_PER_PROCESS} each at once: "
            "none failed, each delivered once"
        )
        sent = [first.id] + [m.id for batch in batches for m in batch]
        bound = DELIVERY_S + caps.redelivery_timeout_s
        wait_for_progress(ledger.distinct, len(sent), bound)
        wait_quiet(lambda: len(ledger), QUIET_S / 2, DELIVERY_S)
        check = TotalQueue.of(sent, ledger.ids())
        hermes_kit.report(f"sent at once after fork: {check.summary()}")
        assert (len(check.lost), len(check.duplicated), len(check.unexpected)) == (0, 0, 0), (
            f"what {_CHILDREN} forked children and the parent sent at once: {check.summary()}"
        )
    else:
        hermes_kit.claim(
            f"{_CHILDREN} children (on their copies of the broker) and the parent, "
            f"{_PER_PROCESS} each at once: none failed"
        )
        for n, (result, batch) in enumerate(zip(results, batches[1:], strict=True), 1):
            unseen = {m.id for m in batch} - set(result["seen"])
            assert not unseen, f"forked child {n} did not receive {len(unseen)} it sent"
        mine = {first.id} | {m.id for m in batches[0]}
        assert wait_until(lambda: mine <= set(ledger.ids()), DELIVERY_S), (
            f"the parent lost {len(mine - set(ledger.ids()))} of the {len(mine)} it sent"
        )


#: Reads each process makes of its own record while the others read theirs.
_READS = 60


def _reads_own_record(driver: SupportsRecords, who: int) -> list[str]:
    """Write a record of this process's own, read it back ``_READS`` times, each after a
    new write; what came back that was not what this process had just written."""
    key = f"kit-fork-{who}"
    wrong = []
    stored: bytes | None = driver.record_get(key)
    for n in range(_READS):
        body = f'{{"process":{who},"write":{n}}}'.encode()
        if not driver.record_put(key, body, 60.0, stored):
            wrong.append(f"write {n} refused: the record was not what this process last read")
        stored = driver.record_get(key)
        if stored != body:
            wrong.append(f"read {n}: {stored!r}, not {body!r}")
    return wrong


def _reading_child(driver: SupportsRecords, who: int, go_fd: int, fd: int) -> NoReturn:
    """Wait for the go, read this child's own record; report on ``fd``; never return."""

    def work() -> dict[str, Any]:
        os.read(go_fd, 1)
        return {"wrong": _reads_own_record(driver, who)}

    _report_and_exit(fd, work)


@pytest.mark.hermes_check("fork", "children and the parent each get their own replies", new=True)
def test_children_forked_from_a_used_driver_each_read_back_what_they_wrote_at_once(
    hermes_kit: Kit,
) -> None:
    """Sends pass when replies cross (every send's reply looks alike); a read of a
    record of one's own does not: a child reading on the parent's connection gets
    another process's bytes."""
    if not hasattr(os, "fork"):
        pytest.skip("not verified: os.fork() is not available on this platform")
    driver = hermes_kit.driver()
    if not isinstance(driver, SupportsRecords):
        pytest.skip(
            "not verified: the driver has no record_get()/record_put(), the kit's call "
            "whose reply tells processes apart"
        )
    _reads_own_record(driver, 0)  # the parent has used the driver: its connections exist
    go_read, go_write = os.pipe()
    children: list[tuple[int, int]] = []
    for who in range(1, _CHILDREN + 1):
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+ warns when threads exist
            pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _reading_child(driver, who, go_read, write_fd)
        os.close(write_fd)
        children.append((pid, read_fd))
    os.close(go_read)
    os.write(go_write, b"x" * _CHILDREN)
    os.close(go_write)
    wrong = {"the parent": _reads_own_record(driver, 0)}
    for who, (pid, read_fd) in enumerate(children, 1):
        code, result = _child_result(pid, read_fd, DELIVERY_S)
        assert "error" not in result, f"in forked child {who}:\n{result['error']}"
        assert code == 0, f"forked child {who} did not finish in time (exit code {code})"
        wrong[f"child {who}"] = result["wrong"]
    crossed = {who: w for who, w in wrong.items() if w}
    assert not crossed, (
        f"{sum(len(w) for w in crossed.values())} wrong replies in {(_CHILDREN + 1) * _READS} "
        f"rounds of writing and reading a record of the process's own, while {_CHILDREN} "
        "forked children and the parent did so at once (replies crossed between processes "
        "sharing a connection): " + "; ".join(f"{who}: {w[0]}" for who, w in crossed.items())
    )
    hermes_kit.claim(
        f"{_CHILDREN} children and the parent, {_READS} reads each of their own record: "
        "each got its own"
    )
