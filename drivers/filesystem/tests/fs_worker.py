"""A worker process for the crash tests: ``python fs_worker.py URL MODE OUT_DIR``.

MODE ``record`` appends each handled message id to ``OUT_DIR/handled-<pid>``;
MODE ``block`` appends it to ``OUT_DIR/started-<pid>`` and then never returns
(the test SIGKILLs it inside the handler). ``OUT_DIR/ready-<pid>`` appears once
the worker waits for messages; SIGTERM then stops a recording worker.
"""

from __future__ import annotations

import os
import sys
import time

from hermes.core import Dispatcher, Message, connect


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
    if mode == "block":
        handler: Record = Block(os.path.join(out_dir, f"started-{pid}"))
    else:
        handler = Record(os.path.join(out_dir, f"handled-{pid}"))
    ready = MarkReady(os.path.join(out_dir, f"ready-{pid}"))
    Dispatcher(connect(url), shutdown=ready).register_handler("job", handler).handle()


if __name__ == "__main__":
    main(*sys.argv[1:4])
