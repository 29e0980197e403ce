"""Helpers for testing your own handlers on the in-process ``memory://`` driver.

::

    from hermes.core import Dispatcher, Emitter, Message, connect
    from hermes.core.testing import drain, scheduled

    driver = connect("memory://test-signup")
    Emitter(driver).emit(Message("send-email", {"to": "ana@example.com"}))
    dispatcher = jobs.handlers.register(Dispatcher(driver))

    drain(dispatcher)                       # every due message handled, then it returns
    assert outbox == ["ana@example.com"]
    assert scheduled(driver) == []          # and no retry is waiting

Nothing here talks to a real broker: for that, run a worker against it (see
the README's "Testing your handlers").
"""

from __future__ import annotations

import time

from hermes.core.app._dispatcher import Dispatcher, DispatcherStats
from hermes.core.model._message import Message
from hermes.core.run._worker import Worker
from hermes.core.spi._consumer import decode
from hermes.core.spi._driver import Driver
from hermes.core.spi._memory import MemoryDriver

__all__ = ["drain", "due", "scheduled"]


def _memory(driver: Driver, what: str) -> MemoryDriver:
    if not isinstance(driver, MemoryDriver):
        raise TypeError(
            f"{what} needs a memory:// driver, not {driver!r}; on a real broker, run a "
            "worker and wait for what its handlers do"
        )
    return driver


def due(driver: Driver) -> int:
    """How many messages on a memory driver a worker would take now (every priority)."""
    broker = _memory(driver, "due()")._broker
    now = time.time()
    with broker.condition:
        waiting = sum(len(queue) for queue in broker.queues.values())
        return waiting + sum(1 for entry in broker.scheduled if entry[0] <= now)


def scheduled(driver: Driver) -> list[Message]:
    """The messages a memory driver holds until their ``execute_at``, soonest first.

    A retry copy lands here: it runs 16 s or more after the failure.
    """
    memory = _memory(driver, "scheduled()")
    broker = memory._broker
    now = time.time()
    with broker.condition:
        bodies = [body for at, _, _, body in sorted(broker.scheduled) if at > now]
    return [decode(body) for body in bodies]


def drain(dispatcher: Dispatcher, *, timeout_s: float = 10.0) -> DispatcherStats:
    """Run ``dispatcher`` on its memory driver until no message is due; return its stats.

    Messages its handlers emit meanwhile are handled too; messages held for
    later (retry copies, a future ``execute_at``) stay: see :func:`scheduled`.
    The stats count everything the dispatcher did, this call and earlier ones.
    Raises ``TimeoutError`` when messages are still due after ``timeout_s``
    (a handler that emits a message for every message it handles, say).
    """
    driver = _memory(dispatcher.driver, "drain()")
    deadline = time.monotonic() + timeout_s
    Worker(
        driver,
        dispatcher,
        handle_signals=False,
        stop_when=lambda: due(driver) == 0 or time.monotonic() >= deadline,
    ).run()
    left = due(driver)
    if left:
        raise TimeoutError(f"drain(): {left} message(s) still due after {timeout_s:g} s")
    return dispatcher.stats
