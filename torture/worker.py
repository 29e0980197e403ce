"""A soak-test worker: ``python -m torture.worker URL RECORD_FILE``.

Appends ``<n>\\t<pid>`` to RECORD_FILE for every message it handles, with one
``write()`` on an ``O_APPEND`` descriptor: a line written survives the
process being SIGKILLed, and several workers can share the file.
"""

from __future__ import annotations

import logging
import os
import sys

from hermes.core import Dispatcher, Message, connect


class Recorder:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.pid = os.getpid()

    def handle(self, message: Message) -> bool:
        os.write(self.fd, f"{message.payload['n']}\t{self.pid}\n".encode())
        return True


def main() -> None:
    url, record = sys.argv[1], sys.argv[2]
    logging.basicConfig(
        level=logging.WARNING, format=f"worker {os.getpid()} %(levelname)s %(message)s"
    )
    dispatcher = Dispatcher(connect(url))
    dispatcher.register_handler("torture", Recorder(record))
    dispatcher.handle()


if __name__ == "__main__":
    main()
