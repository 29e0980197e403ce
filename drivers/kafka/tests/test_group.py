"""Consumer-group behaviour: crashed workers, competing workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from hermes.core import Message, compat
from hermes.drivers.kafka import KafkaDriver

MakeDriver = Callable[..., KafkaDriver]

_CRASHING_WORKER = """
import sys, time
from hermes.core import Dispatcher, Worker, connect

class Stuck:
    def handle(self, message):
        print("handling", message.id, flush=True)
        time.sleep(120)
        return True

driver = connect(sys.argv[1])
dispatcher = Dispatcher(driver)
dispatcher.register_handler("job", Stuck())
Worker(driver, dispatcher).run()
"""


def test_a_message_whose_worker_was_killed_mid_handler_goes_to_a_fresh_worker(
    kafka_url: str, make_driver: MakeDriver, handle: Callable[..., Any]
) -> None:
    driver = make_driver()
    sent = Message("job", {"n": 1})
    driver.send(sent)
    with subprocess.Popen(
        [sys.executable, "-c", _CRASHING_WORKER, kafka_url], stdout=subprocess.PIPE, text=True
    ) as worker:
        try:
            assert worker.stdout is not None
            line = worker.stdout.readline()  # blocks until the handler runs (or the worker dies)
            assert line.split() == ["handling", sent.id]
        finally:
            os.kill(worker.pid, signal.SIGKILL)

    received = handle(make_driver(), 1, timeout_s=driver.capabilities.redelivery_timeout_s + 10)

    assert [m.id for m in received.messages] == [sent.id]


def test_workers_of_one_group_share_the_partitions_and_no_message_is_handled_twice(
    make_driver: MakeDriver, eventually: Callable[..., Any]
) -> None:
    emitter = make_driver()
    workers = [make_driver() for _ in range(3)]
    got: list[list[Any]] = [[] for _ in workers]
    stop = threading.Event()

    def run(index: int) -> None:
        def callback(message: Message, priority: int) -> bool:
            got[index].append(message.payload["v"])
            return True

        driver = workers[index]
        compat.set_shutdown(driver, _Until(stop))
        compat.wait(driver, callback)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    sent = 0
    try:
        # Keep sending until every worker got a share (joins and rebalances take seconds).
        deadline = time.monotonic() + 30
        while not all(got) and time.monotonic() < deadline:
            emitter.send(Message("work", {"v": sent}))
            sent += 1
            time.sleep(0.02)
        eventually(lambda: sum(map(len, got)) >= sent, f"all {sent} messages handled", 20.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    everything = [payload for share in got for payload in share]
    assert all(got), f"some worker got nothing: {[len(share) for share in got]}"
    assert sorted(everything) == list(range(sent))


class _Until:
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def should_shutdown(self, start_time: float) -> bool:
        return self.event.is_set()

    def shutdown(self, at: float | None = None) -> bool:
        self.event.set()
        return True
