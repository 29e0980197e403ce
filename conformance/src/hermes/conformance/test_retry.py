"""Retry through the driver: a failed RetryableHandler's copy goes back on the broker.

The copy keeps id, type, payload and created, has ``retries + 1`` and an
``execute_at`` in the future (16..45 s for a first retry); it is sent
to the default priority. ``delay=NATIVE`` holds it back until then,
``delay=IGNORED`` delivers it at once. To see the copy come back on a NATIVE
driver without waiting 16 s, one test shortens the backoff by overriding
``Dispatcher.next_retry``.
"""

from __future__ import annotations

import time

import pytest

from hermes.conformance._harness import (
    DELAY_LATE_S,
    DELIVERY_S,
    EARLY_TOLERANCE_S,
    QUIET_S,
    Kit,
    KitDispatcher,
    scaled,
    stays_false,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.core import DEFAULT_PRIORITY, Message, RetryableHandler, RetryMixin
from hermes.core.driver import Delay

#: The shortened backoff (unscaled seconds).
_QUICK_RETRY_S = 1.0


class _FailFirstTry(RetryMixin, RetryableHandler):
    """Raises on a message that was never retried; succeeds on its copies."""

    def handle(self, message: Message) -> bool:
        if message.retries == 0:
            raise RuntimeError("first try fails (conformance kit)")
        return True


class _QuickRetryDispatcher(KitDispatcher):
    def next_retry(self, message: Message) -> float:
        return time.time() + scaled(_QUICK_RETRY_S)


def _copy_of(kit: Kit, message: Message) -> Message | None:
    copies = [e.message for e in kit.ledger.of(message.id) if e.message.retries > 0]
    return copies[0] if copies else None


def _check_copy(copy: Message, message: Message) -> None:
    assert (copy.id, copy.type, copy.payload, copy.created) == (
        message.id,
        message.type,
        message.payload,
        message.created,
    ), "the retry copy must keep id, type, payload and created"
    assert copy.retries == message.retries + 1, (
        f"the retry copy has retries={copy.retries}, not {message.retries + 1}"
    )


@pytest.mark.hermes_check("retry", "the copy of a failed handler with the real backoff")
def test_a_failed_retryable_handler_puts_a_copy_on_the_broker_held_back_by_its_backoff(
    hermes_kit: Kit,
) -> None:
    worker = hermes_kit.worker(handlers={JOB: [_FailFirstTry()]})
    sent_at = time.time()
    message = hermes_kit.emit(hermes_kit.message(1))
    assert wait_until(lambda: hermes_kit.ledger.has(message.id), DELIVERY_S), (
        f"message {message.id} was not delivered within {DELIVERY_S} s (scaled)"
    )
    assert wait_until(lambda: worker.dispatcher.stats.retried == 1, DELIVERY_S), (
        f"the failed handler's retry copy was not sent: {worker.dispatcher.stats}, "
        f"worker error {worker.error!r}"
    )

    if hermes_kit.capabilities.delay is Delay.NATIVE:
        hermes_kit.claim("copy held back by its 16..45 s backoff")
        assert stays_false(lambda: _copy_of(hermes_kit, message), QUIET_S), (
            f"delay=NATIVE: the retry copy, due in 16..45 s, arrived early: "
            f"{_copy_of(hermes_kit, message)}"
        )
    else:
        hermes_kit.claim("copy delivered at once with retries+1, same id")
        assert wait_until(lambda: _copy_of(hermes_kit, message), DELIVERY_S), (
            "delay=IGNORED: the retry copy did not arrive"
        )
        copy = _copy_of(hermes_kit, message)
        assert copy is not None, "the retry copy vanished from the ledger"
        _check_copy(copy, message)
        assert copy.execute_at is not None, "the retry copy lost its execute_at"
        assert sent_at + 16 <= copy.execute_at <= time.time() + 45, (
            f"execute_at was not kept: {copy.execute_at - sent_at:.1f} s after the send, not 16..45"
        )


@pytest.mark.hermes_check("retry", "the copy comes back (backoff shortened)")
def test_the_retry_copy_comes_back_with_retries_plus_one_and_the_same_id(hermes_kit: Kit) -> None:
    caps = hermes_kit.capabilities
    priority = DEFAULT_PRIORITY
    if caps.priorities:
        hermes_kit.setup_priority_queue("kit-high", 200)
        priority = 200
    hermes_kit.worker(handlers={JOB: [_FailFirstTry()]}, dispatcher_class=_QuickRetryDispatcher)
    message = hermes_kit.emit(hermes_kit.message(1), priority)

    assert wait_until(lambda: _copy_of(hermes_kit, message), DELIVERY_S + DELAY_LATE_S), (
        "the retry copy did not come back"
    )
    first, retried = hermes_kit.ledger.of(message.id)[:2]
    copy = retried.message
    _check_copy(copy, message)
    assert retried.priority == DEFAULT_PRIORITY, (
        f"the copy belongs on the default priority, not {retried.priority}"
    )
    assert copy.execute_at is not None, "the retry copy lost its execute_at"
    if caps.delay is Delay.NATIVE:
        hermes_kit.claim("copy held until its execute_at, then back with retries+1, same id")
        assert retried.at >= copy.execute_at - EARLY_TOLERANCE_S, (
            f"delay=NATIVE: the copy arrived {copy.execute_at - retried.at:.3f} s early"
        )
    else:
        hermes_kit.claim("copy back at once with retries+1, same id")
        assert retried.at - first.at <= scaled(DELIVERY_S), (
            f"delay=IGNORED: the copy came back {retried.at - first.at:.1f} s later, not at once"
        )
