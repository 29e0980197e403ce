"""Headers through the broker: a message's headers, and its retry copy's, survive.

Headers are in the body (one more envelope key), so every driver carries them
without doing anything; these checks make sure no driver rewrites bodies
(a driver that decodes and re-encodes a delayed message, say, must keep
them). Generated headers hold unicode, JSON escapes and W3C trace context.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hermes.conformance._harness import (
    DELAY_LATE_S,
    DELIVERY_S,
    Kit,
    KitDispatcher,
    scaled,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.core import Message, RetryableHandler, RetryMixin

TRACE = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
}

headers = st.dictionaries(
    st.text(min_size=1, max_size=20), st.text(max_size=60), min_size=1, max_size=6
)


@pytest.mark.hermes_check("round trip", "headers survive, in order (Hypothesis)")
# Hypothesis compares the process-wide ``random`` state before and after each
# draw, to catch strategies that use it. This strategy does not, but the worker
# runs beside the draws, and a client library's own threads may use the global
# module meanwhile (psycopg_pool jitters each new connection's lifetime with
# it), which Hypothesis would report as this strategy's doing.
@pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module inside strategies"
    ":hypothesis.errors.HypothesisDeprecationWarning"
)
@settings(
    max_examples=10,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(given_headers=headers)
@example(given_headers=TRACE)
@example(given_headers={"ünï ✓": 'a/b "quoted" \\ \u202e 😀', "empty": ""})
def test_headers_survive_the_broker_in_order(
    hermes_kit: Kit, given_headers: dict[str, str]
) -> None:
    hermes_kit.default_worker()  # started by the first example, reused by the others
    before = len(hermes_kit.ledger)
    message = hermes_kit.emit(Message(JOB, {"n": 1}, headers=given_headers))

    assert wait_until(lambda: hermes_kit.ledger.has(message.id, after=before), DELIVERY_S), (
        f"message {message.id} was not delivered within {DELIVERY_S} s"
    )
    received = hermes_kit.ledger.of(message.id, after=before)[0].message
    assert list(received.headers.items()) == list(given_headers.items()), (
        f"message {message.id}'s headers changed on the broker"
    )


class _FailFirstTry(RetryMixin, RetryableHandler):
    def handle(self, message: Message) -> bool:
        if message.retries == 0:
            raise RuntimeError("first try fails (conformance kit)")
        return True


class _QuickRetryDispatcher(KitDispatcher):
    def next_retry(self, message: Message) -> float:
        return time.time() + scaled(1.0)


@pytest.mark.hermes_check("retry", "the copy keeps the headers")
def test_the_retry_copy_comes_back_with_the_same_headers(hermes_kit: Kit) -> None:
    hermes_kit.worker(handlers={JOB: [_FailFirstTry()]}, dispatcher_class=_QuickRetryDispatcher)
    message = hermes_kit.emit(Message(JOB, {"n": 1}, headers=TRACE))

    def copy() -> Message | None:
        copies = [e.message for e in hermes_kit.ledger.of(message.id) if e.message.retries]
        return copies[0] if copies else None

    assert wait_until(copy, DELIVERY_S + DELAY_LATE_S), "the retry copy did not come back"
    retried = copy()
    assert retried is not None, "the retry copy went from the ledger"
    assert dict(retried.headers) == TRACE, "the retry copy lost or changed the headers"
