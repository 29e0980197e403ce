"""Ack ordering: when the broker forgets a message, relative to the handler.

``delivery=AT_LEAST_ONCE``: a worker that dies inside a handler gets its
message delivered again (to a fresh worker, within the declared
``redelivery_timeout_s``). ``AT_MOST_ONCE``: it is gone. Either way a message
whose handler returned is never delivered again.

A death is simulated two ways. In-process (every driver): the handler raises
a ``BaseException`` that is not an ``Exception``; the Dispatcher lets it
through, so it escapes the run exactly like a crash, and the
driver object is then closed as a dying process's connections would be. Out
of process (``cross_process`` drivers): a worker subprocess blocks inside its
handler and the kit SIGKILLs it.

An ordinary ``Exception`` escaping the callback (the Dispatcher's own
failure, say a retry copy the broker refused) is no death: the run must
let it out at once -- never log it and go on -- and an at-least-once driver
gives the message back for the next worker.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from hermes.conformance._harness import (
    DELIVERY_S,
    QUIET_S,
    WORKER_START_S,
    Kit,
    KitDispatcher,
    fields,
    stays_false,
    wait_until,
)
from hermes.conformance._worker import JOB
from hermes.core import Message
from hermes.core.driver import Delivery


class _WorkerCrash(BaseException):
    """Stands for the worker process dying mid-handler: not an Exception, so not caught."""


class _CrashOnce:
    def __init__(self) -> None:
        self.crashed = threading.Event()

    def handle(self, message: Message) -> bool:
        if not self.crashed.is_set():
            self.crashed.set()
            raise _WorkerCrash(message.id)
        return True


class _RetrySendFailed(RuntimeError):
    """Stands for the Dispatcher failing after the handlers ran: an ordinary Exception."""


class _FailsOnceDispatcher(KitDispatcher):
    """Its callback raises an ordinary Exception for the first message, as if a retry
    copy could not be sent; handles every later message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raised = False

    def handle_message(self, message: Message, priority: int) -> bool:
        ok = super().handle_message(message, priority)
        if not self.raised:
            self.raised = True
            raise _RetrySendFailed(f"the retry copy of message {message.id} could not be sent")
        return ok


@pytest.mark.hermes_check("delivery", "handler crash (in-process)")
def test_a_message_whose_worker_crashed_mid_handler_follows_the_declared_delivery(
    hermes_kit: Kit,
) -> None:
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    message = hermes_kit.emit(hermes_kit.message(1))
    crashing = hermes_kit.worker(handlers={JOB: [_CrashOnce()]})

    assert wait_until(lambda: ledger.has(message.id), DELIVERY_S), (
        f"message {message.id} was not delivered within {DELIVERY_S} s (scaled)"
    )
    assert crashing.join(DELIVERY_S), (
        "an exception escaping the callback must propagate out of the run; "
        f"the worker kept running {DELIVERY_S} s (scaled) later instead"
    )
    crashing.stop(expect=_WorkerCrash)
    assert isinstance(crashing.error, _WorkerCrash), (
        f"the run ended with {crashing.error!r}, not the crash the handler raised"
    )
    crashing.driver.close()

    if caps.delivery is Delivery.AT_LEAST_ONCE:
        hermes_kit.claim("handler crash (in-process): delivered again")
        fresh = hermes_kit.worker()
        bound = caps.redelivery_timeout_s + DELIVERY_S
        assert wait_until(lambda: len(ledger.of(message.id)) >= 2, bound), (
            f"AT_LEAST_ONCE: the message of a crashed worker was not delivered again within "
            f"redelivery_timeout_s + {DELIVERY_S} = {bound} s (unscaled)"
        )
        again = ledger.of(message.id)[1]
        assert again.worker == fresh.name, (
            f"delivered again to {again.worker}, not to the fresh worker {fresh.name}"
        )
        assert fields(again.message) == fields(message), f"message {message.id} came back changed"
    else:
        hermes_kit.claim("handler crash (in-process): not delivered again")
        sentinel = hermes_kit.emit(hermes_kit.message(2))
        hermes_kit.worker()
        assert wait_until(lambda: ledger.has(sentinel.id), DELIVERY_S), (
            f"a message sent after the crash was not delivered within {DELIVERY_S} s (scaled)"
        )
        assert stays_false(lambda: len(ledger.of(message.id)) > 1, QUIET_S), (
            "AT_MOST_ONCE: the message of a crashed worker was delivered again"
        )


@pytest.mark.hermes_check("delivery", "an Exception escaping the callback")
def test_an_exception_escaping_the_callback_ends_wait_and_follows_the_declared_delivery(
    hermes_kit: Kit,
) -> None:
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    message = hermes_kit.emit(hermes_kit.message(1))
    failing = hermes_kit.worker(dispatcher_class=_FailsOnceDispatcher)

    assert wait_until(lambda: ledger.has(message.id), DELIVERY_S), (
        f"message {message.id} was not delivered within {DELIVERY_S} s (scaled)"
    )
    assert failing.join(DELIVERY_S), (
        "an Exception escaping the callback must propagate out of the run; the worker kept "
        f"running {DELIVERY_S} s (scaled) later, after {len(ledger)} deliveries: "
        "the error was swallowed, and with it the message"
    )
    failing.stop(expect=_RetrySendFailed)
    assert isinstance(failing.error, _RetrySendFailed), (
        f"the run ended with {failing.error!r}, not the Exception the callback raised"
    )

    if caps.delivery is Delivery.AT_LEAST_ONCE:
        hermes_kit.claim("an Exception escaping the callback: raised, delivered again")
        fresh = hermes_kit.worker()
        bound = caps.redelivery_timeout_s + DELIVERY_S
        assert wait_until(lambda: len(ledger.of(message.id)) >= 2, bound), (
            f"AT_LEAST_ONCE: a message whose callback raised an Exception was not delivered "
            f"again within redelivery_timeout_s + {DELIVERY_S} = {bound} s (unscaled)"
        )
        again = ledger.of(message.id)[1]
        assert again.worker == fresh.name, (
            f"delivered again to {again.worker}, not to the fresh worker {fresh.name}"
        )
    else:
        hermes_kit.claim("an Exception escaping the callback: raised, not delivered again")
        sentinel = hermes_kit.emit(hermes_kit.message(2))
        hermes_kit.worker()
        assert wait_until(lambda: ledger.has(sentinel.id), DELIVERY_S), (
            f"a message sent after the failure was not delivered within {DELIVERY_S} s"
        )
        assert stays_false(lambda: len(ledger.of(message.id)) > 1, QUIET_S), (
            "AT_MOST_ONCE: a message whose callback raised was delivered again"
        )


@pytest.mark.hermes_check("delivery", "SIGKILL mid-handler")
def test_a_message_whose_worker_was_sigkilled_mid_handler_follows_the_declared_delivery(
    hermes_kit: Kit,
) -> None:
    hermes_kit.require_cross_process()
    caps = hermes_kit.capabilities
    message = hermes_kit.emit(hermes_kit.message(1))
    blocked = hermes_kit.spawn_worker(block=True)

    def delivered_to(pid: int, message_id: str) -> bool:
        return any(r.id == message_id and r.pid == pid for r in hermes_kit.records())

    assert wait_until(lambda: delivered_to(blocked.pid, message.id), WORKER_START_S + DELIVERY_S), (
        f"the blocking worker never started the handler\n{hermes_kit.process_output()}"
    )
    blocked.kill()
    fresh = hermes_kit.spawn_worker()
    assert wait_until(lambda: hermes_kit.statuses(fresh.pid), WORKER_START_S), (
        f"the fresh worker did not start\n{hermes_kit.process_output()}"
    )

    if caps.delivery is Delivery.AT_LEAST_ONCE:
        hermes_kit.claim("SIGKILL mid-handler: delivered again")
        bound = caps.redelivery_timeout_s + DELIVERY_S
        assert wait_until(lambda: delivered_to(fresh.pid, message.id), bound), (
            f"AT_LEAST_ONCE: the message of a SIGKILLed worker was not delivered again "
            f"within {bound} s (unscaled)\n{hermes_kit.process_output()}"
        )
    else:
        hermes_kit.claim("SIGKILL mid-handler: not delivered again")
        sentinel = hermes_kit.emit(hermes_kit.message(2))
        assert wait_until(lambda: delivered_to(fresh.pid, sentinel.id), DELIVERY_S), (
            f"the fresh worker handled nothing\n{hermes_kit.process_output()}"
        )
        assert stays_false(lambda: delivered_to(fresh.pid, message.id), QUIET_S), (
            "AT_MOST_ONCE: the message of a SIGKILLed worker was delivered again"
        )


#: Sent once the fresh worker runs, so that it handles one while the blocked worker
#: lives: more than a driver pushing messages ahead to a busy consumer holds back.
_SENTINELS = 20
#: How long the second worker runs before the kill, unless it handles one sooner.
_RUNNING_S = 3.0


@pytest.mark.hermes_check(
    "delivery", "SIGKILL mid-handler, recovered by a running worker", new=True
)
def test_a_sigkilled_worker_s_message_is_delivered_again_to_a_worker_already_running(
    hermes_kit: Kit,
) -> None:
    """The worker that gets the message again was running before the death: a driver
    that recovers a dead peer's messages only when a consumer starts fails."""
    hermes_kit.require_cross_process()
    caps = hermes_kit.capabilities
    if caps.delivery is not Delivery.AT_LEAST_ONCE:
        pytest.skip("n/a: driver declares AT_MOST_ONCE (the message is not delivered again)")
    if not caps.competing_consumers:
        pytest.skip("n/a: driver declares competing_consumers=False (one worker at a time)")
    message = hermes_kit.emit(hermes_kit.message(1))
    blocked = hermes_kit.spawn_worker(block=True)

    def delivered_to(pid: int, message_id: str | None = None) -> bool:
        return any(
            r.pid == pid and (message_id is None or r.id == message_id)
            for r in hermes_kit.records()
        )

    assert wait_until(lambda: delivered_to(blocked.pid, message.id), WORKER_START_S + DELIVERY_S), (
        f"the blocking worker never started the handler\n{hermes_kit.process_output()}"
    )
    running = hermes_kit.spawn_worker()
    assert wait_until(lambda: hermes_kit.statuses(running.pid), WORKER_START_S), (
        f"the second worker did not start\n{hermes_kit.process_output()}"
    )
    for n in range(_SENTINELS):
        hermes_kit.emit(hermes_kit.message(100 + n))
    # Running: it handles one of these, or -- on a broker that gives each partition to
    # one consumer, which the blocked worker holds -- it has had its consumer this long.
    wait_until(lambda: delivered_to(running.pid), _RUNNING_S)
    blocked.kill()

    bound = caps.redelivery_timeout_s + DELIVERY_S
    assert wait_until(lambda: delivered_to(running.pid, message.id), bound), (
        f"AT_LEAST_ONCE: the message of a worker SIGKILLed mid-handler never reached the "
        f"worker already running beside it within {bound} s (scaled; "
        f"redelivery_timeout_s={caps.redelivery_timeout_s:g}): a dead peer's messages must "
        f"be recovered while workers run, not only when one starts\n{hermes_kit.process_output()}"
    )
    hermes_kit.claim("SIGKILL mid-handler: delivered again to a worker already running")


@pytest.mark.hermes_check("delivery", "a handled message is never delivered again")
def test_a_handled_message_is_never_delivered_again(hermes_kit: Kit) -> None:
    caps = hermes_kit.capabilities
    ledger = hermes_kit.ledger
    message = hermes_kit.emit(hermes_kit.message(1))
    first = hermes_kit.worker()
    assert wait_until(lambda: ledger.has(message.id), DELIVERY_S), (
        f"message {message.id} was not delivered within {DELIVERY_S} s (scaled)"
    )
    first.stop()
    first.driver.close()

    sentinel = hermes_kit.emit(hermes_kit.message(2))
    hermes_kit.worker()

    assert wait_until(lambda: ledger.has(sentinel.id), DELIVERY_S), (
        f"a message sent to a fresh worker was not delivered within {DELIVERY_S} s (scaled)"
    )
    window = caps.redelivery_timeout_s + QUIET_S
    assert stays_false(lambda: len(ledger.of(message.id)) > 1, window), (
        f"a message whose handler returned True was delivered again: "
        f"{[(e.worker, e.at) for e in ledger.of(message.id)]}"
    )
