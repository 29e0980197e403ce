"""A soak-test worker: ``python -m torture.worker URL RECORD_FILE WORK_MS [CONCURRENCY]``.

Appends ``<n>\\t<pid>`` to RECORD_FILE for every message it handles, with one
``write()`` on an ``O_APPEND`` descriptor: a line written survives the
process being SIGKILLed, and several workers can share the file.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from hermes.core import Dispatcher, Message, Worker, connect


class Recorder:
    """Works ``work_s`` per message (so kills land mid-handler), then records it."""

    def __init__(self, path: str, work_s: float) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.pid = os.getpid()
        self.work_s = work_s

    def handle(self, message: Message) -> bool:
        time.sleep(self.work_s)
        os.write(self.fd, f"{message.payload['n']}\t{self.pid}\n".encode())
        return True


def main() -> None:
    url, record, work_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    concurrency = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    logging.basicConfig(
        level=logging.WARNING, format=f"worker {os.getpid()} %(levelname)s %(message)s"
    )
    driver = connect(url)
    dispatcher = Dispatcher(driver, concurrency=concurrency)
    dispatcher.register_handler("torture", Recorder(record, work_ms / 1000))
    Worker(driver, dispatcher).run()


if __name__ == "__main__":
    main()
