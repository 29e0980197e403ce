"""Malformed input on the broker: logged, set aside, and the worker keeps going.

The kit puts bodies that are not Hermes messages where a worker will find
them, through ``send_raw(body, priority)``, which every driver has (core
puts the bytes through the driver's ``put``). Between two good messages: both good
ones are handled, each bad body is logged at WARNING or above, and none is
delivered again (no crash loop) -- a fresh worker on the queue sees only new
messages. A driver may refuse a body its broker cannot carry at all with a
DeliveryError or NotSupportedError raised before any I/O (SQS refuses bytes
that are not UTF-8); that body is then skipped and named in the summary.
"""

from __future__ import annotations

import logging

import pytest

from hermes.conformance._harness import (
    DELIVERY_S,
    QUIET_S,
    Kit,
    stays_false,
    wait_quiet,
    wait_until,
)
from hermes.core import DeliveryError, NotSupportedError

_BAD_BODIES = {
    "not JSON": b"this is not a hermes message",
    "JSON without 'message'": b'{"job": {"id": "1"}}',
    "a message without a type": b'{"message": {"id": "x", "created": 1700000000}}',
    "a wrong type for created": b'{"message":{"id":"x","type":"t","created":"yesterday"}}',
    "bytes that are not UTF-8": b"\xff\xfe\x00\x80 not utf-8",
    "truncated JSON": b'{"message":{"id":"x","type":"t","created":17',
}


@pytest.mark.hermes_check("malformed input", "bodies that are not messages, via send_raw")
def test_a_body_that_is_not_a_message_is_set_aside_and_the_worker_keeps_going(
    hermes_kit: Kit, caplog: pytest.LogCaptureFixture
) -> None:
    sender = hermes_kit.sender
    ledger = hermes_kit.ledger
    caplog.set_level(logging.WARNING)

    before = hermes_kit.emit(hermes_kit.message(1))
    sent, refused = [], []
    for what, body in _BAD_BODIES.items():
        try:
            sender.send_raw(body)
        except (DeliveryError, NotSupportedError):
            refused.append(what)
        else:
            sent.append(what)
    after = hermes_kit.emit(hermes_kit.message(2))
    worker = hermes_kit.worker()

    assert wait_until(lambda: ledger.has(before.id) and ledger.has(after.id), DELIVERY_S), (
        f"good messages around bad bodies were not handled: {ledger.ids()}"
        + (f"; the worker died: {worker.error!r}" if worker.error else "")
    )
    assert worker.running, f"a bad body stopped the worker: {worker.error!r}"
    assert len(ledger) == 2, f"bad bodies reached the handler: {ledger.entries()}"

    def complaints() -> int:
        return sum(1 for r in caplog.records if r.levelno >= logging.WARNING)

    assert wait_until(lambda: complaints() >= len(sent), DELIVERY_S), (
        f"{len(sent)} bad bodies but {complaints()} log records at WARNING or above"
    )
    # A driver may log more than one line per body (the loop's and its own), so
    # reaching len(sent) records does not mean every body was seen: the worker
    # runs on until its complaints stop coming, then the fresh worker must add none.
    wait_quiet(complaints, QUIET_S, DELIVERY_S)
    worker.stop()
    logged = complaints()

    sentinel = hermes_kit.emit(hermes_kit.message(3))
    hermes_kit.worker()
    assert wait_until(lambda: ledger.has(sentinel.id), DELIVERY_S), (
        f"a message sent to a fresh worker was not delivered within {DELIVERY_S} s (scaled)"
    )
    assert stays_false(lambda: complaints() > logged, QUIET_S), (
        "bad bodies were delivered again after they were logged: they must be set aside"
    )
    assert sorted(ledger.ids()) == sorted([before.id, after.id, sentinel.id]), (
        f"the handler got other messages than the 3 good ones: {ledger.entries()}"
    )
    hermes_kit.claim(
        f"{len(sent)} bad bodies logged and set aside"
        + (f" (refused by the broker: {', '.join(refused)})" if refused else "")
    )
