"""A worker process for the crash tests: ``python fs_worker.py URL MODE OUT_DIR``.

MODE ``record`` appends each handled message id to ``OUT_DIR/handled-<pid>``;
MODE ``block`` appends it to ``OUT_DIR/started-<pid>`` and then never returns
(the test SIGKILLs it inside the handler). ``OUT_DIR/ready-<pid>`` appears once
the worker waits for messages; SIGTERM then stops a recording worker.

MODE ``outlive`` blocks in the handler of its one message like ``block``, but
its worker gives the handler a grace period of 0.1 s and closes its consumer
without it, then writes ``OUT_DIR/closed-<pid>``; the process (the handler
still running) exits once ``OUT_DIR/exit`` appears.
"""

from __future__ import annotations

import os
import sys
import time

from hermes.core import Message, Worker, connect
from hermes.core.compat import Dispatcher


class Record:
    def __init__(self, path: str) -> None:
        self.path = path

    def handle(self, message: Message) -> bool:
        with open(self.path, "a") as file:
            file.write(message.id + "\n")
        return True


class Block(Record):
    def handle(self, message: Message) -> bool:
        super().handle(message)
        while True:
            time.sleep(60)


class MarkReady:
    """A Shutdown that never asks to stop; its first check writes ``OUT_DIR/ready-<pid>``.

    The driver first checks it inside ``handle()``, once SIGTERM is handled gracefully.
    """

    def __init__(self, path: str) -> None:
        self.path: str | None = path

    def should_shutdown(self, start_time: float) -> bool:
        if self.path is not None:
            open(self.path, "w").close()
            self.path = None
        return False

    def shutdown(self, at: float | None = None) -> bool:
        return False


def main(url: str, mode: str, out_dir: str) -> None:
    pid = os.getpid()
    if mode == "outlive":
        blocked = Block(os.path.join(out_dir, f"started-{pid}"))
        worker = Worker(connect(url), {"job": blocked}, concurrency=2, grace_s=0.1, max_items=1)
        worker.run()
        open(os.path.join(out_dir, f"closed-{pid}"), "w").close()
        while not os.path.exists(os.path.join(out_dir, "exit")):
            time.sleep(0.02)
        return
    if mode == "block":
        handler: Record = Block(os.path.join(out_dir, f"started-{pid}"))
    else:
        handler = Record(os.path.join(out_dir, f"handled-{pid}"))
    ready = MarkReady(os.path.join(out_dir, f"ready-{pid}"))
    Dispatcher(connect(url), shutdown=ready).register_handler("job", handler).handle()


if __name__ == "__main__":
    main(*sys.argv[1:4])
