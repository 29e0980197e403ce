"""Wake-up: how soon an idle worker sees a message sent to it.

Every driver states it in ``Capabilities.wake_up_s``: about 0 for a broker
that pushes messages or answers a blocking wait (Redis, RabbitMQ, PostgreSQL
with NOTIFY), the poll interval for one that is polled. The kit keeps a
worker idle for a second and a half, sends one message, and repeats; the
median time from the send to the handler must be within ``wake_up_s`` and a
margin for the round trips (scaled). One late wake-up on a busy machine does
not fail the row; a driver that polls while it declares a push does.
"""

from __future__ import annotations

import functools
import statistics
import time

import pytest

from hermes.conformance._harness import DELIVERY_S, Kit, scaled, wait_until

#: Idle spells, each ended by one message.
_WAKES = 5
#: How long the worker is idle before each message (scaled).
_IDLE_S = 1.5
#: What the send, the take and the handler call may add to the declared wake-up (scaled).
_MARGIN_S = 0.2


@pytest.mark.hermes_check("wake-up", "an idle worker sees a new message in time", new=True)
def test_an_idle_worker_sees_a_new_message_within_the_declared_wake_up(hermes_kit: Kit) -> None:
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    hermes_kit.worker()
    # The worker has handled one message before the clock starts: a consumer's first
    # connection or a group join is not a wake-up.
    first = hermes_kit.emit(hermes_kit.message(0))
    assert wait_until(lambda: ledger.has(first.id), DELIVERY_S), (
        f"a message was not delivered within {DELIVERY_S} s (scaled)"
    )
    waits: list[float] = []
    for n in range(1, _WAKES + 1):
        time.sleep(scaled(_IDLE_S))
        sent_at = time.time()
        message = hermes_kit.emit(hermes_kit.message(n))
        assert wait_until(functools.partial(ledger.has, message.id), caps.wake_up_s + DELIVERY_S), (
            f"message {n} of {_WAKES}, sent to a worker idle for {scaled(_IDLE_S):.1f} s, did "
            f"not arrive within wake_up_s + {DELIVERY_S} s (scaled)"
        )
        waits.append(ledger.of(message.id)[0].at - sent_at)
    median = statistics.median(waits)
    bound = caps.wake_up_s + scaled(_MARGIN_S)
    shown = ", ".join(f"{w * 1000:.0f}" for w in waits)
    hermes_kit.report(f"send to handler after {_WAKES} idle spells: {shown} ms")
    assert median <= bound, (
        f"an idle worker took {median * 1000:.0f} ms (median of {_WAKES}: {shown} ms) to see a "
        f"new message; the driver declares wake_up_s={caps.wake_up_s:g}, so at most "
        f"{bound * 1000:.0f} ms with the margin: declare what the driver does (its poll "
        "interval), or wake on the broker's signal"
    )
    hermes_kit.claim(
        f"median {median * 1000:.0f} ms from send to handler, within wake_up_s="
        f"{caps.wake_up_s:g} + {scaled(_MARGIN_S):.1f} s"
    )
