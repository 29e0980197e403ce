"""The handlers the browser tests' ``hermes worker`` runs; they talk back through files.

``$DASH_TEST_DIR/handled.jsonl`` gets a line per message handled; a
``flaky`` message fails (and goes to the failed-message store) until the
file ``fixed`` exists; a ``slow`` one runs until ``release`` exists; a
``card.charge`` one raises :class:`CardDeclined` (and goes to the store); a
``mend`` one fails until the file ``fixed-<its id>`` exists.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hermes.core import HandlerRegistry, Message

handlers = HandlerRegistry()
HERE = Path(os.environ.get("DASH_TEST_DIR", "."))


def _record(message: Message) -> None:
    with (HERE / "handled.jsonl").open("a") as file:
        file.write(json.dumps({"type": message.type, "id": message.id}) + "\n")


@handlers.handler("ok")
def ok(message: Message) -> None:
    _record(message)


@handlers.handler("flaky")
def flaky(message: Message) -> bool:
    if not (HERE / "fixed").exists():
        return False
    _record(message)
    return True


@handlers.handler("mend")
def mend(message: Message) -> bool:
    if not (HERE / f"fixed-{message.id}").exists():
        return False
    _record(message)
    return True


class CardDeclined(Exception):
    pass


@handlers.handler("card.charge")
def charge(message: Message) -> None:
    raise CardDeclined(f"card declined for order {message.payload['order']}")


@handlers.handler("slow")
def slow(message: Message) -> None:
    deadline = time.monotonic() + 60
    while not (HERE / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    _record(message)


handlers.every(seconds=3600, type="ok", name="hourly-report")


#: Handlers with values as long as real ones get, for the layout tests.
hostile = HandlerRegistry()
#: A 400-character type, with no space to break at.
LONG_TYPE = ("billing." + "invoice-reconciliation-" * 18)[:399] + "x"


@hostile.handler(LONG_TYPE)
def long_and_failing(message: Message) -> None:
    if message.payload.get("hold"):
        deadline = time.monotonic() + 60
        while not (HERE / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    raise RuntimeError("upstream refused: https://payments.example.com/v2/" + "A" * 300)


hostile.every(seconds=3600, type=LONG_TYPE, name="nightly-" + "reconciliation-of-every-tenant-" * 4)
