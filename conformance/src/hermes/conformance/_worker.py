"""A worker process for the kit's cross-process tests.

::

    python -m hermes.conformance._worker URL RECORD [--type T] [--max-items N]
                                         [--shutdown-file PATH] [--block]
                                         [--concurrency N] [--grace S]
                                         [--plugin MODULE ...]

It connects with ``hermes.core.connect(URL)`` and runs a :class:`Dispatcher`
whose handler appends one line per message to the file ``RECORD``::

    <message id> TAB <pid> TAB <payload["n"]>

Lines are written with ``O_APPEND`` and fsync'd one by one, so several workers
can share one record file and a line is on disk before the handler returns.
Status lines start with ``#``: ``#ready`` just before ``handle()`` is called,
``#stopped`` as soon as it returns (before the driver is closed), ``#failed``
when it raised. With ``--block`` the handler writes its line and then sleeps
forever: the line is the "started" marker after which the kit SIGKILLs it.
``--concurrency N`` runs N handlers at once (N blocked ones with ``--block``).

``--plugin MODULE`` registers a Hermes plugin that is not installed as an
entry point (the kit passes on its own ``--hermes-plugin`` options). Kept
free of pytest so it starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hermes.core import Dispatcher, Message, SharedFileShutdown, Worker, connect, redact_url
from hermes.core.spi._registry import plugin_manager

#: The message type the kit's workers handle unless told otherwise.
JOB = "hermes.kit.job"


@dataclass(frozen=True)
class Record:
    """One line of a record file."""

    #: The message id, or the status (``#ready``, ``#stopped``, ``#failed``).
    id: str
    pid: int
    #: ``payload["n"]`` as written, ``-`` for status lines and payloads without one.
    n: str

    @property
    def is_status(self) -> bool:
        return self.id.startswith("#")


def read_records(path: Path) -> list[Record]:
    """Every complete line of the record file at ``path`` (none if it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    records = []
    for line in text.split("\n")[:-1]:  # the last piece is "" or a line still being written
        id_, pid, n = line.split("\t")
        records.append(Record(id_, int(pid), n))
    return records


def register_plugins(modules: Sequence[str]) -> None:
    """Import each module and register it as a Hermes plugin (once per process)."""
    manager = plugin_manager()
    for name in modules:
        module = importlib.import_module(name)
        if not manager.is_registered(module):
            manager.register(module)


class _RecordFile:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._pid = os.getpid()

    def write(self, id_: str, n: object = "-") -> None:
        line = f"{id_}\t{self._pid}\t{n}\n".encode()
        os.write(self._fd, line)  # one write of < PIPE_BUF bytes: never interleaved
        os.fsync(self._fd)


class _RecordingHandler:
    def __init__(self, record: _RecordFile, block: bool, block_n: int | None = None) -> None:
        self.record = record
        self.block = block
        self.block_n = block_n

    def handle(self, message: Message) -> bool:
        payload = message.payload
        n = payload.get("n", "-") if isinstance(payload, dict) else "-"
        self.record.write(message.id, n)
        while self.block or (self.block_n is not None and n == self.block_n):  # killed here
            time.sleep(3600)
        return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hermes.conformance._worker")
    parser.add_argument("url", help="broker URL, as given to hermes.core.connect()")
    parser.add_argument("record", help="file to append one line per handled message to")
    parser.add_argument("--type", default=JOB, help="message type to handle")
    parser.add_argument("--max-items", type=int, default=0, help="return after N messages")
    parser.add_argument("--shutdown-file", help="stop when SharedFileShutdown(PATH) asks")
    parser.add_argument("--block", action="store_true", help="record, then sleep in the handler")
    parser.add_argument(
        "--block-n", type=int, help="sleep in the handler of the message whose payload n is this"
    )
    parser.add_argument("--concurrency", type=int, default=1, help="handlers at once")
    parser.add_argument(
        "--grace", type=float, default=30.0, help="seconds handlers get to finish on a stop"
    )
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE and register it with hermes.core.plugin_manager() first",
    )
    args = parser.parse_args(argv)
    register_plugins(args.plugin)

    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format=f"worker {os.getpid()} %(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    record = _RecordFile(args.record)
    shutdown = SharedFileShutdown(args.shutdown_file) if args.shutdown_file else None
    driver = connect(args.url)
    try:
        dispatcher = Dispatcher(
            driver, shutdown=shutdown, concurrency=args.concurrency, grace_s=args.grace
        )
        dispatcher.register_handler(args.type, _RecordingHandler(record, args.block, args.block_n))
        record.write("#ready")
        try:
            Worker(driver, dispatcher, max_items=args.max_items).run()
        except BaseException:
            record.write("#failed")
            logging.getLogger("hermes.conformance").exception(
                "worker on %s failed", redact_url(args.url)
            )
            return 1
        record.write("#stopped")
    finally:
        driver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
