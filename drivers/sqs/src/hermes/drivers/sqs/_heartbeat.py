"""The messages a worker holds, kept invisible while it works and deleted when it is done."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hermes.core.driver import Driver
from hermes.core.drivertools import LeaseKeeper, error_text

logger = logging.getLogger("hermes.drivers.sqs")

#: SQS takes at most ten entries per batch call.
BATCH_LIMIT = 10
#: A finished message waits at most this long for the rest of its batch before it is deleted.
FLUSH_AFTER_S = 1.0


@dataclass(frozen=True)
class Queue:
    """One SQS queue the driver reads or writes, resolved to its URL."""

    name: str
    url: str
    priority: int
    #: ``maxReceiveCount`` of the queue's redrive policy; None without one.
    max_receive_count: int | None


@dataclass(frozen=True, slots=True)
class SqsDelivery:
    """The SQS side of the message a callback is handling right now.

    Read it from a handler with :func:`~hermes.drivers.sqs.current_delivery`
    to act on redeliveries, e.g. to give up early on a message SQS has
    already handed out many times.
    """

    #: The SQS queue the message came from.
    queue_name: str
    #: SQS's own message id (not the Hermes message id).
    message_id: str
    #: ``ApproximateReceiveCount``: 1 on the first delivery, more after a
    #: worker died, timed out or released it (and, in delay mode, after
    #: receipts that only held a not-yet-due message back).
    receive_count: int
    #: The priority whose queue delivered it.
    priority: int
    #: When SQS accepted it (``SentTimestamp``), as a UNIX time.
    sent_at: float | None


@dataclass(eq=False)
class Held:
    """A received message this worker has not yet deleted or given back.

    It is the ``token`` of the :class:`~hermes.core.driver.Received` a consumer hands out.
    """

    queue: Queue
    receipt: str
    message_id: str
    body: str
    receive_count: int
    #: SentTimestamp as a UNIX time, when SQS reported it.
    sent_at: float | None
    #: ``time.monotonic()`` at which SQS makes it visible again unless extended.
    visible_until: float
    #: When it was acknowledged; it then waits to be deleted.
    done_at: float | None = None
    #: What a handler of this message sees through ``current_delivery()``.
    delivery: SqsDelivery = field(init=False)

    def __post_init__(self) -> None:
        self.delivery = SqsDelivery(
            queue_name=self.queue.name,
            message_id=self.message_id,
            receive_count=self.receive_count,
            priority=self.queue.priority,
            sent_at=self.sent_at,
        )


class Heartbeat:
    """Tracks held messages; core's :class:`LeaseKeeper` keeps them invisible while the worker runs.

    Every received message is held from receipt until it is deleted (it was
    acknowledged, or it was not a Hermes message and there is no redrive
    policy), given back, hidden until due, or left for the redrive policy --
    whether it waits in the consumer's buffer or a handler runs it. While
    held, the keeper's thread renews its visibility whenever less than two
    thirds of ``visibility_timeout_s`` is left (a third of it gone), so a
    renewal late by up to half the timeout -- a busy machine, a slow answer
    -- still lands in time, and neither a long handler nor the
    messages buffered behind it are handed to a second worker. A worker that
    dies takes the thread with it, and SQS hands its messages out again once
    their visibility runs out.

    Acknowledged messages are deleted in batches: when the consumer has
    handed out its buffer and polls again, or by the thread about
    :data:`FLUSH_AFTER_S` after they were acknowledged if handlers run long.
    Failures of deletes and give-backs are logged, never raised: the worst
    outcome is that SQS delivers a message again, which at-least-once allows.
    A renewal that cannot reach SQS raises, so the keeper logs the outage
    once and its recovery once. One lock serializes every call, from any
    thread, so a renewal can never land after a handler's thread gave the
    same message back.
    """

    def __init__(
        self,
        client: Callable[[], Any],
        visibility_timeout_s: int,
        driver: Driver,
        *,
        enabled: bool,
        what: str = "the visibility of held SQS messages",
    ) -> None:
        self._client = client
        self._visibility_timeout_s = visibility_timeout_s
        self._driver = driver
        self._enabled = enabled
        self._lock = threading.RLock()
        self._held: list[Held] = []
        self._keeper: LeaseKeeper | None = None
        self._what = what

    # The worker's side -------------------------------------------------------

    def start(self) -> None:
        if self._enabled and self._keeper is None:
            tick_s = min(1.0, self._visibility_timeout_s / 6)
            self._keeper = LeaseKeeper(
                self._tick, tick_s, self._what, driver=self._driver, name="hermes-sqs-heartbeat"
            )
            self._keeper.start()

    def stop(self) -> None:
        """Stop renewing and delete what was acknowledged; the rest stays held."""
        if self._keeper is not None:
            self._keeper.stop(timeout_s=self._visibility_timeout_s)
            self._keeper = None
        self.flush()

    def hold(self, items: Iterable[Held]) -> None:
        with self._lock:
            self._held.extend(items)

    def finish(self, item: Held) -> None:
        """``item`` was acknowledged: delete it with the next flush."""
        with self._lock:
            item.done_at = time.monotonic()

    def forget(self, item: Held) -> None:
        """Stop renewing ``item``; SQS shows it again when its visibility runs out."""
        with self._lock:
            self._untrack([item])

    def hide(self, item: Held, seconds: int) -> None:
        """Stop holding ``item`` and keep it invisible for ``seconds`` from now."""
        with self._lock:
            self._untrack([item])
            self._change_visibility([item], seconds, "hold back")

    def give_back(self, items: Sequence[Held]) -> None:
        """Make ``items`` visible at once, so any worker receives them again."""
        if not items:
            return
        with self._lock:
            self._untrack(items)
            self._change_visibility(items, 0, "give back")

    def flush(self, older_than_s: float | None = None) -> None:
        """Delete finished messages (only those finished ``older_than_s`` ago, if given)."""
        with self._lock:
            now = time.monotonic()
            done = [
                item
                for item in self._held
                if item.done_at is not None
                and (older_than_s is None or now - item.done_at >= older_than_s)
            ]
            if not done:
                return
            self._untrack(done)
            for queue, items in _by_queue(done):
                for chunk in _chunks(items):
                    self._delete(queue, chunk)

    def flush_stale(self) -> None:
        """Delete messages that finished a while ago (the thread does this when it runs)."""
        if not self._enabled:
            self.flush(FLUSH_AFTER_S)

    # The keeper's side -------------------------------------------------------

    def _tick(self) -> None:
        self.flush(FLUSH_AFTER_S)
        self._renew_due()

    def _renew_due(self) -> None:
        with self._lock:
            now = time.monotonic()
            due = [
                item
                for item in self._held
                if item.visible_until - now < self._visibility_timeout_s * 2 / 3
            ]
            if due:
                self._change_visibility(
                    due, self._visibility_timeout_s, "extend visibility of", raising=True
                )

    # Calls to SQS, under the lock -------------------------------------------

    def _untrack(self, items: Iterable[Held]) -> None:
        gone = {id(item) for item in items}
        self._held = [item for item in self._held if id(item) not in gone]

    def _change_visibility(
        self, items: Sequence[Held], seconds: int, what: str, *, raising: bool = False
    ) -> None:
        """ChangeMessageVisibilityBatch; ``raising``: a failed call raises instead of logging."""
        for queue, group in _by_queue(items):
            for chunk in _chunks(group):
                started = time.monotonic()
                entries = [
                    {"Id": str(n), "ReceiptHandle": item.receipt, "VisibilityTimeout": seconds}
                    for n, item in enumerate(chunk)
                ]
                try:
                    response = self._client().change_message_visibility_batch(
                        QueueUrl=queue.url, Entries=entries
                    )
                except self._driver.broker_errors as exc:
                    if raising:
                        exc.add_note(f"{what} messages on SQS queue {queue.name!r}")
                        raise
                    logger.warning(
                        "Could not %s %d SQS message(s) on queue %r - %s",
                        what,
                        len(chunk),
                        queue.name,
                        error_text(exc),
                        exc_info=exc,
                    )
                    continue
                failed = {entry["Id"]: entry for entry in response.get("Failed", [])}
                for n, item in enumerate(chunk):
                    entry = failed.get(str(n))
                    if entry is None:
                        item.visible_until = started + seconds
                        continue
                    logger.warning(
                        "Could not %s SQS message %s on queue %r - %s: %s",
                        what,
                        item.message_id,
                        queue.name,
                        entry.get("Code"),
                        entry.get("Message", ""),
                    )
                    # A receipt SQS refuses once will be refused again.
                    self._untrack([item])

    def _delete(self, queue: Queue, chunk: Sequence[Held]) -> None:
        entries = [{"Id": str(n), "ReceiptHandle": item.receipt} for n, item in enumerate(chunk)]
        try:
            response = self._client().delete_message_batch(QueueUrl=queue.url, Entries=entries)
        except self._driver.broker_errors as exc:
            logger.warning(
                "Could not delete %d handled SQS message(s) from queue %r; "
                "SQS will deliver them again - %s",
                len(chunk),
                queue.name,
                error_text(exc),
                exc_info=exc,
            )
            return
        for entry in response.get("Failed", []):
            item = chunk[int(entry["Id"])]
            logger.warning(
                "Could not delete handled SQS message %s from queue %r; "
                "SQS will deliver it again - %s: %s",
                item.message_id,
                queue.name,
                entry.get("Code"),
                entry.get("Message", ""),
            )


def _by_queue(items: Iterable[Held]) -> list[tuple[Queue, list[Held]]]:
    groups: dict[str, tuple[Queue, list[Held]]] = {}
    for item in items:
        groups.setdefault(item.queue.url, (item.queue, []))[1].append(item)
    return list(groups.values())


def _chunks(items: Sequence[Held]) -> list[Sequence[Held]]:
    return [items[i : i + BATCH_LIMIT] for i in range(0, len(items), BATCH_LIMIT)]
