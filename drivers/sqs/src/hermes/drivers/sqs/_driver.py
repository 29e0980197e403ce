"""AmazonSqsDriver: at-least-once delivery over Amazon SQS through boto3."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from email.utils import parsedate_to_datetime
from typing import Any

from botocore.exceptions import ClientError

from hermes.core import (
    DEFAULT_PRIORITY,
    ConfigurationError,
    DeliveryError,
    DriverError,
    Message,
    redact_url,
)
from hermes.core.driver import Consumer, Delay, Driver, Outgoing, QueueStats, Received
from hermes.core.drivertools import CertificateRefusedError, PerProcess, current_received
from hermes.drivers.sqs._capabilities import CAPABILITIES, MAX_MESSAGE_BYTES
from hermes.drivers.sqs._client import (
    CLIENT_ERRORS,
    REFUSED_ERRORS,
    UNAVAILABLE_ERRORS,
    certificate_refused,
    classify,
    clone_client,
    error_code,
    is_missing_queue,
)
from hermes.drivers.sqs._heartbeat import BATCH_LIMIT, Heartbeat, Held, Queue, SqsDelivery

logger = logging.getLogger("hermes.drivers.sqs")

#: The longest ``DelaySeconds`` SQS accepts.
MAX_DELAY_S = 900
#: The longest visibility timeout SQS accepts.
MAX_VISIBILITY_S = 12 * 60 * 60
#: Retention of a dead-letter queue the driver creates: the SQS maximum, 14 days,
#: because a standard queue's messages keep their original enqueue time there.
DEAD_LETTER_RETENTION_S = 14 * 24 * 60 * 60
#: ``maxReceiveCount`` when a dead-letter queue is named without one.
DEFAULT_MAX_RECEIVE_COUNT = 5
#: While messages of a lower priority wait in a consumer's buffer, the higher
#: queues are polled again at least this often, so a new urgent message does
#: not wait behind the whole buffered batch.
RECHECK_HIGHER_S = 0.5
#: A long poll may end this much after receive's ``timeout_s``: SQS waits whole
#: seconds, and a poll of 0 s (what rounding down would mostly give) never blocks.
LONG_POLL_SLACK_S = 0.25

#: How long ``purge`` hides a message between receiving and deleting it: a purge
#: cut short leaves them visible again soon, whatever the workers' timeout.
PURGE_VISIBILITY_S = 30
#: The counts of a queue that ``hermes stats`` and ``hermes purge`` read, in one call.
_READY = "ApproximateNumberOfMessages"
_DELAYED = "ApproximateNumberOfMessagesDelayed"
_NOT_VISIBLE = "ApproximateNumberOfMessagesNotVisible"
_COUNTS = (_READY, _DELAYED, _NOT_VISIBLE)
_PURGE_IN_PROGRESS = frozenset(
    {"PurgeQueueInProgress", "AWS.SimpleQueueService.PurgeQueueInProgress"}
)

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
# Characters an SQS body may not contain (outside XML 1.0's character range).
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def current_delivery() -> SqsDelivery | None:
    """The :class:`SqsDelivery` of the message being handled on this thread, else None.

    Core's worker loop marks the message whose handlers run on each thread
    (:func:`hermes.core.drivertools.current_received`); this reads its SQS facts, on any
    handler thread of a worker with several handlers at once.
    """
    received = current_received()
    item = received.token if received is not None else None
    return item.delivery if isinstance(item, Held) else None


def _check_queue_name(name: str, what: str) -> str:
    if name.endswith(".fifo"):
        raise ConfigurationError(
            f"{what} {name!r} is a FIFO queue; hermes-sqs drives standard queues only "
            "(FIFO queues have no per-message delay and need message groups)"
        )
    if not _QUEUE_NAME.match(name):
        raise ConfigurationError(
            f"{what} {name!r} is not a valid SQS queue name: 1 to 80 characters of "
            "letters, digits, '-' and '_'"
        )
    return name


def _check_range(name: str, value: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


def _sqs_text(body: bytes) -> str:
    """``body`` as the text SQS carries; DeliveryError, before any I/O, if it is not such text."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DeliveryError(
            f"SQS message bodies are text: these bytes are not UTF-8 ({exc})"
        ) from exc
    bad = _NOT_XML.search(text)
    if bad is not None:
        raise DeliveryError(
            f"SQS message bodies cannot contain the character {bad.group()!r} "
            f"(at {bad.start()}); SQS allows XML 1.0 characters only"
        )
    return text


def _redrive_max(policy: str | None) -> int | None:
    if not policy:
        return None
    try:
        return int(json.loads(policy)["maxReceiveCount"])
    except (ValueError, KeyError, TypeError):
        logger.warning("Ignoring an SQS RedrivePolicy that cannot be read: %r", policy)
        return None


def _dead_letter_target(policy: str | None) -> str | None:
    """The ARN of the dead-letter queue a ``RedrivePolicy`` names, else None."""
    if not policy:
        return None
    try:
        arn = json.loads(policy)["deadLetterTargetArn"]
    except (ValueError, KeyError, TypeError):
        return None
    return arn if isinstance(arn, str) else None


def _count(attributes: Mapping[str, str], name: str) -> int | None:
    value = attributes.get(name)
    return None if value is None else int(value)


def _server_time_ms(response: Mapping[str, Any]) -> int:
    """SQS's clock when it answered (its ``Date`` header, whole seconds), else this machine's."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return int(parsedate_to_datetime(date).timestamp() * 1000)
    except (TypeError, ValueError):
        return int(time.time() * 1000)


@dataclass
class _Purged:
    """What ``purge`` did so far: messages deleted, and what it had to leave, with why."""

    deleted: int = 0
    left: list[str] = field(default_factory=list)


def _same_attribute(name: str, current: str | None, wanted: str) -> bool:
    if current is None:
        return False
    if name == "RedrivePolicy":
        try:
            have, want = json.loads(current), json.loads(wanted)
        except ValueError:
            return current == wanted
        return {k: str(v) for k, v in have.items()} == {k: str(v) for k, v in want.items()}
    return current == wanted


class AmazonSqsDriver(Driver):
    """Messages on Amazon SQS standard queues: deleted only after the callback returns.

    ``client`` is a boto3 SQS client (``boto3.client("sqs", ...)``); credentials
    come from it, i.e. from the standard AWS chain, and are never logged. The
    queue ``queue_name`` is found, or created with ``queue_attributes``
    (plus ``VisibilityTimeout``); attributes the driver is asked for
    (``queue_attributes``, ``retention_s``, the redrive policy) are set on an
    existing queue whose values differ.

    Core's :class:`~hermes.core.Worker` reads through :meth:`consumer`: each
    ReceiveMessage takes as many messages as the worker has free handlers
    (its ``concurrency``), at most ``batch_size`` (1-10), hidden for
    ``visibility_timeout_s``, and long-polls at most ``wait_time_s`` (0-20)
    and never past the worker's one-second receive. The consumer keeps the
    batch and hands the messages out one at a time. A message is deleted
    after its callback returns, whatever it returned; deletes are batched
    (at-least-once: a worker that dies before the delete gets its messages
    delivered again after the visibility timeout). A callback that raises
    makes its message visible again at once; when the worker stops, so does
    whatever it had received but not handed out yet. A message whose handler
    still runs when the worker's grace period ends is left as it is: it
    becomes visible once its visibility timeout runs out, not before.

    With ``heartbeat`` (the default) core's :class:`~hermes.core.drivertools.LeaseKeeper`
    renews the visibility of every message the worker holds -- buffered or
    in a handler -- whenever less than half of the timeout is left, so a
    long handler is never handed to a second worker; a dead worker stops
    renewing. SQS caps a message's visibility at 12 h from its receipt,
    which bounds a hung handler too.

    ``ApproximateReceiveCount`` is requested with every message; a count above
    1 is logged, it is the ``delivery_count`` of what the consumer hands
    over, and :func:`current_delivery` exposes it to handlers.

    ``dead_letter_queue`` (with ``max_receive_count``, default 5) creates that
    queue and sets the ``RedrivePolicy`` of this driver's queues: SQS moves a
    message there once it was received more than ``max_receive_count`` times.
    ``retention_s`` sets ``MessageRetentionPeriod`` (60 s to 14 days).

    A body that is not a Hermes message is logged with the reason (by core)
    and its receive count. With a redrive policy it is left alone, so SQS
    moves it to the dead-letter queue after ``max_receive_count`` receipts;
    without one it is deleted after the log.

    ``execute_at`` is ignored by default (delivered at once, kept in the
    message). ``delay=True`` honours it: ``put`` sets ``DelaySeconds`` (up to
    900 s, rounded up), and a message received before it is due -- longer
    delays, clock skew -- is hidden again for the time left (at most 12 h at
    a time) instead of being handled early. Each such receipt counts towards
    ``maxReceiveCount``, so once a message nears that limit it is re-sent
    (same body, fresh count) rather than hidden again.

    Priorities: the default priority uses ``queue_name``;
    ``setup_priority_queue(name, priority)`` adds the queue
    ``<queue_name>-<name>``. A receive short-polls the higher priorities and
    long-polls only the lowest, so a new high-priority message may wait up to
    a second behind an idle long poll; while lower-priority messages wait in
    the consumer's buffer, the higher queues are polled again at least every
    :data:`RECHECK_HIGHER_S`.

    Errors: boto3's are declared (:attr:`refused_errors`,
    :attr:`unavailable_errors`, :attr:`client_errors`) and a ClientError is
    sorted by its code (:meth:`classify_error`): rejected credentials or a
    missing permission stop the worker, throttling and unreachable endpoints
    make it back off and retry, a missing queue is a :class:`DriverError`.

    ``put`` is safe from many threads. After ``os.fork()``
    the child builds its own client (``client_factory()`` if given, otherwise a
    copy of ``client``'s region, endpoint, config and explicit keys) and
    leaves the parent's alone.
    """

    capabilities = CAPABILITIES
    refused_errors = REFUSED_ERRORS
    unavailable_errors = UNAVAILABLE_ERRORS
    client_errors = CLIENT_ERRORS

    def __init__(
        self,
        client: Any,
        queue_name: str,
        queue_attributes: Mapping[str, str] | None = None,
        *,
        wait_time_s: int = 1,
        batch_size: int = 10,
        visibility_timeout_s: int = 30,
        heartbeat: bool = True,
        dead_letter_queue: str | None = None,
        max_receive_count: int | None = None,
        retention_s: int | None = None,
        delay: bool = False,
        client_factory: Callable[[], Any] | None = None,
        close_client: bool = False,
    ) -> None:
        #: The queue of the default priority.
        self.queue_name = _check_queue_name(queue_name, "queue_name")
        #: Seconds one ReceiveMessage long-polls.
        self.wait_time_s = _check_range("wait_time_s", wait_time_s, 0, 20)
        #: Messages asked for per ReceiveMessage.
        self.batch_size = _check_range("batch_size", batch_size, 1, BATCH_LIMIT)
        #: Seconds a received message stays hidden from other workers (renewed by the heartbeat).
        self.visibility_timeout_s = _check_range(
            "visibility_timeout_s", visibility_timeout_s, 1, MAX_VISIBILITY_S
        )
        self.heartbeat = bool(heartbeat)
        #: Whether ``execute_at`` holds messages back (delay ``NATIVE``).
        self.delay = bool(delay)
        self.queue_attributes = {str(k): str(v) for k, v in (queue_attributes or {}).items()}
        if dead_letter_queue is not None:
            _check_queue_name(dead_letter_queue, "dead_letter_queue")
            if dead_letter_queue == queue_name:
                raise ConfigurationError("dead_letter_queue must differ from queue_name")
            if "RedrivePolicy" in self.queue_attributes:
                raise ConfigurationError(
                    "give either dead_letter_queue or a RedrivePolicy in queue_attributes, not both"
                )
            if max_receive_count is None:
                max_receive_count = DEFAULT_MAX_RECEIVE_COUNT
        elif max_receive_count is not None:
            raise ConfigurationError(
                "max_receive_count needs dead_letter_queue: the queue SQS moves messages to"
            )
        #: Where SQS moves a message received more than ``max_receive_count`` times.
        self.dead_letter_queue = dead_letter_queue
        self.max_receive_count = (
            None
            if max_receive_count is None
            else _check_range("max_receive_count", max_receive_count, 1, 1000)
        )
        self.retention_s = (
            None if retention_s is None else _check_range("retention_s", retention_s, 60, 1209600)
        )
        self.capabilities = replace(
            type(self).capabilities,
            delay=Delay.NATIVE if self.delay else Delay.IGNORED,
            redelivery_timeout_s=float(self.visibility_timeout_s),
        )
        self._given_client = client
        self._given_pid = os.getpid()
        self._client_factory = client_factory
        self._close_given_client = close_client
        #: This process's client: ``client`` where the driver was made, a new one after fork().
        self._client: PerProcess[Any] = PerProcess(self._make_client, self._close_client)
        meta = getattr(client, "meta", None)
        self._where = (
            f" region={meta.region_name} endpoint={redact_url(meta.endpoint_url)}" if meta else ""
        )
        self._names: dict[int, str] = {DEFAULT_PRIORITY: self.queue_name}
        self._queues: dict[str, Queue] = {}
        self._setup_lock = threading.Lock()
        #: The dead-letter queue's ARN, found once under ``_setup_lock`` (reset by ``teardown``).
        self._dead_letter_arn: str | None = None
        #: URLs of queues looked up (never created) by ``queue_stats`` and ``purge``.
        self._urls: dict[str, str] = {}
        #: Queues found missing by ``queue_stats`` or ``purge``, logged once each.
        self._missing: set[str] = set()

    def classify_error(self, exc: BaseException) -> type[DriverError] | None:
        """A ClientError by its code (credentials refused, throttled, ...); the rest by type."""
        if isinstance(exc, ClientError):
            return classify(exc)
        if certificate_refused(exc):
            return CertificateRefusedError
        return super().classify_error(exc)

    def _make_client(self) -> Any:
        if os.getpid() == self._given_pid:
            return self._given_client
        if self._client_factory is not None:
            return self._client_factory()
        return clone_client(self._given_client)

    def _close_client(self, client: Any) -> None:
        # The client passed in is the caller's unless close_client says otherwise.
        if client is not self._given_client or self._close_given_client:
            client.close()

    # Queues ------------------------------------------------------------------

    def setup_priority_queue(self, name: str, priority: int) -> None:
        """Send ``priority`` to (and read it from) the SQS queue ``<queue_name>-<name>``.

        The default priority always uses ``queue_name``; naming it is accepted
        and changes nothing. The queue is created on first use.
        """
        if priority == DEFAULT_PRIORITY:
            return
        self._names[priority] = _check_queue_name(f"{self.queue_name}-{name}", "priority queue")

    def _queue(self, priority: int) -> Queue:
        name = self._names.get(priority)
        if name is None:
            raise self.unknown_priority(priority, self._names)
        queue = self._queues.get(name)
        if queue is None:
            with self._setup_lock:
                queue = self._queues.get(name)
                if queue is None:
                    queue = self._setup_queue(name, priority)
                    self._queues[name] = queue
        return queue

    def _setup_queue(self, name: str, priority: int) -> Queue:
        wanted = dict(self.queue_attributes)
        if self.retention_s is not None:
            wanted["MessageRetentionPeriod"] = str(self.retention_s)
        if self.dead_letter_queue is not None:
            if self._dead_letter_arn is None:
                dead_url, dead_attributes = self._find_or_create(
                    self.dead_letter_queue,
                    {"MessageRetentionPeriod": str(DEAD_LETTER_RETENTION_S)},
                    {},
                )
                arn = dead_attributes.get("QueueArn")
                if arn is None:  # just created: CreateQueue answers with the URL only
                    arn = self._client.get().get_queue_attributes(
                        QueueUrl=dead_url, AttributeNames=["QueueArn"]
                    )["Attributes"]["QueueArn"]
                self._dead_letter_arn = arn
            wanted["RedrivePolicy"] = json.dumps(
                {
                    "deadLetterTargetArn": self._dead_letter_arn,
                    "maxReceiveCount": str(self.max_receive_count),
                }
            )
        url, attributes = self._find_or_create(
            name, {"VisibilityTimeout": str(self.visibility_timeout_s)}, wanted
        )
        return Queue(name, url, priority, _redrive_max(attributes.get("RedrivePolicy")))

    def _find_or_create(
        self, name: str, on_create: Mapping[str, str], wanted: Mapping[str, str]
    ) -> tuple[str, dict[str, str]]:
        """The URL and attributes of queue ``name``, created or updated to ``wanted``."""
        client = self._client.get()
        try:
            url: str | None = client.get_queue_url(QueueName=name)["QueueUrl"]
        except ClientError as exc:
            if not is_missing_queue(exc):
                raise
            url = None
        if url is None:
            attributes = {**on_create, **wanted}
            try:
                url = client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
                logger.info("Created SQS queue %r", name)
                return str(url), attributes
            except ClientError as exc:
                # Created meanwhile by another process with other attributes:
                # use it like any existing queue.
                if error_code(exc) not in ("QueueAlreadyExists", "QueueNameExists"):
                    raise
                url = client.get_queue_url(QueueName=name)["QueueUrl"]
        current: dict[str, str] = client.get_queue_attributes(
            QueueUrl=url, AttributeNames=["All"]
        ).get("Attributes", {})
        changed = {k: v for k, v in wanted.items() if not _same_attribute(k, current.get(k), v)}
        if changed:
            client.set_queue_attributes(QueueUrl=url, Attributes=changed)
            logger.info("Updated attributes %s of SQS queue %r", ", ".join(sorted(changed)), name)
            current.update(changed)
        return str(url), current

    # Sending -----------------------------------------------------------------

    def _delay_seconds(self, execute_at: float | None) -> int:
        if not self.delay or execute_at is None:
            return 0
        return max(0, min(MAX_DELAY_S, math.ceil(execute_at - time.time())))

    def _send_body(self, queue: Queue, body: str, delay_s: int) -> None:
        extra = {"DelaySeconds": delay_s} if delay_s else {}
        self._client.get().send_message(QueueUrl=queue.url, MessageBody=body, **extra)

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        """One SendMessage for one item, SendMessageBatch (ten, at most 256 KiB a call) for more.

        Every body is checked before the first call: SQS bodies are text, so
        bytes that are not UTF-8, or that contain characters outside XML 1.0
        (most control characters), raise :class:`DeliveryError` and nothing
        is sent. Raises :class:`DeliveryError` naming the messages SQS
        refused in a batch; the others were sent.
        """
        if priority not in self._names:
            raise self.unknown_priority(priority, self._names)
        entries = [
            (item, _sqs_text(item.body), self._delay_seconds(item.execute_at)) for item in items
        ]
        if not entries:
            return
        queue = self._queue(priority)
        if len(entries) == 1:
            _, body, delay_s = entries[0]
            self._send_body(queue, body, delay_s)
            return
        refused: list[str] = []
        for chunk in self._batch_chunks(entries):
            request: list[dict[str, Any]] = []
            for n, (_, body, delay_s) in enumerate(chunk):
                entry: dict[str, Any] = {"Id": str(n), "MessageBody": body}
                if delay_s:
                    entry["DelaySeconds"] = delay_s
                request.append(entry)
            response = self._client.get().send_message_batch(QueueUrl=queue.url, Entries=request)
            for failed in response.get("Failed", []):
                item = chunk[int(failed["Id"])][0]
                name = f"#{item.message_id}" if item.message_id else "a raw body"
                refused.append(f"{name} ({failed.get('Code')}: {failed.get('Message', '')})")
        if refused:
            raise DeliveryError(
                f"SQS queue {queue.name!r} refused {len(refused)} of {len(entries)} "
                f"messages: {'; '.join(refused)}"
            )

    @staticmethod
    def _batch_chunks(
        entries: list[tuple[Outgoing, str, int]],
    ) -> list[list[tuple[Outgoing, str, int]]]:
        chunks: list[list[tuple[Outgoing, str, int]]] = [[]]
        size = 0
        for entry in entries:
            body_bytes = len(entry[1].encode())
            if chunks[-1] and (
                len(chunks[-1]) == BATCH_LIMIT or size + body_bytes > MAX_MESSAGE_BYTES
            ):
                chunks.append([])
                size = 0
            chunks[-1].append(entry)
            size += body_bytes
        return chunks

    # Receiving ---------------------------------------------------------------

    @property
    def current_delivery(self) -> SqsDelivery | None:
        """The :class:`SqsDelivery` of the message this thread is handling, else None."""
        return current_delivery()

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        return _SqsConsumer(self, self.check_priorities(self._names, priorities), concurrency)

    # Counting and purging ----------------------------------------------------

    def queue_stats(self) -> list[QueueStats]:
        """Counts from one GetQueueAttributes call per queue; approximate, as SQS's are.

        ready: ``ApproximateNumberOfMessages``; scheduled:
        ``ApproximateNumberOfMessagesDelayed``; in flight:
        ``ApproximateNumberOfMessagesNotVisible`` -- in delay mode that
        includes messages due more than 15 minutes from now which a worker
        hid again until they are due. set aside: every message in the
        dead-letter queue of the queue's redrive policy (one more call per
        dead-letter queue), shown on one row only -- the default priority's
        if its queue has that dead-letter queue, else the highest priority's
        that has -- and None on the other rows and on queues without a
        redrive policy. A queue that does not exist yet (nothing was sent to
        it) counts as empty and is not created.
        """
        return self._stats_rows()

    def _stats_rows(self) -> list[QueueStats]:
        order = sorted(self._names, reverse=True)
        found: dict[str, Mapping[str, str] | None] = {}
        for priority in order:
            name = self._names[priority]
            if name not in found:
                answer = self._attributes(name, [*_COUNTS, "RedrivePolicy"])
                found[name] = None if answer is None else answer[1].get("Attributes", {})
        targets = {
            priority: _dead_letter_target((found[self._names[priority]] or {}).get("RedrivePolicy"))
            for priority in order
        }
        # A dead-letter queue shared by several priorities is counted once.
        owners: dict[str, int] = {}
        for priority in sorted(order, key=lambda p: p != DEFAULT_PRIORITY):
            target = targets[priority]
            if target is not None:
                owners.setdefault(target, priority)
        dead_letters = {target: self._dead_letter_count(target) for target in owners}
        rows = []
        for priority in order:
            name = self._names[priority]
            attributes = found[name]
            if attributes is None:
                rows.append(QueueStats(priority, name, ready=0, scheduled=0, in_flight=0))
                continue
            target = targets[priority]
            rows.append(
                QueueStats(
                    priority,
                    name,
                    ready=_count(attributes, _READY),
                    scheduled=_count(attributes, _DELAYED),
                    in_flight=_count(attributes, _NOT_VISIBLE),
                    set_aside=(
                        dead_letters[target]
                        if target is not None and owners[target] == priority
                        else None
                    ),
                )
            )
        return rows

    def _dead_letter_count(self, arn: str) -> int | None:
        """Every message in the dead-letter queue ``arn``: visible, delayed and being read.

        A message someone is looking at (in the AWS console, say) is still set aside.
        """
        parts = arn.split(":")
        if len(parts) != 6:
            logger.warning("SQS redrive policy names %r, which is not a queue's ARN", arn)
            return None
        answer = self._attributes(parts[5], list(_COUNTS), account=parts[4])
        if answer is None:
            return None
        counts = [_count(answer[1].get("Attributes", {}), name) for name in _COUNTS]
        return None if None in counts else sum(c for c in counts if c is not None)

    def purge(self, priority: int | None = None) -> int:
        """Delete what waits in the queue of ``priority`` (every queue: None); how many.

        Visible messages are received ten at a time and deleted, and counted
        exactly; messages in flight are left alone. Messages sent once this
        started may go too; it stops at a receive that brings none sent
        before. Delayed messages can only be deleted with PurgeQueue, which
        deletes every message of the queue, those in flight too: it is used
        only when SQS counted none in flight just before, and its share of
        the count is SQS's approximate count of delayed messages read then.

        When delayed messages have to stay (some are in flight, or SQS's
        limit of one PurgeQueue per queue every 60 s), it raises
        :class:`DriverError` saying how many it deleted and what is left and why.
        """
        priorities = self.check_priorities(self._names, () if priority is None else [priority])
        purged = _Purged()
        for name in dict.fromkeys(self._names[p] for p in priorities):
            try:
                self._purge_queue(name, purged)
            except DriverError as exc:
                raise type(exc)(
                    f"{exc} (after deleting {purged.deleted} waiting message(s))"
                ) from exc
            except Exception as exc:
                # Core's translation keeps the note in the error's line.
                exc.add_note(f"purging SQS queue {name!r}, after deleting {purged.deleted}")
                raise
        if purged.left:
            raise DriverError(
                f"deleted {purged.deleted} waiting message(s), but not all: "
                + "; ".join(purged.left)
            )
        return purged.deleted

    def _purge_queue(self, name: str, purged: _Purged) -> None:
        answer = self._attributes(name, list(_COUNTS))
        if answer is None:
            return  # nothing was ever sent there
        url, response = answer
        attributes = response.get("Attributes", {})
        delayed, in_flight = _count(attributes, _DELAYED), _count(attributes, _NOT_VISIBLE)
        # Date is whole seconds: one more keeps every message sent before it.
        self._delete_visible(name, url, _server_time_ms(response) + 1000, purged)
        if delayed == 0:
            return
        if delayed is None:
            purged.left.append(
                f"SQS did not say how many delayed messages queue {name!r} holds, so "
                "PurgeQueue, which would delete them, was not tried"
            )
            return
        about = f"SQS queue {name!r} still holds about {delayed} delayed message(s)"
        if in_flight != 0:
            hidden = " (in delay mode, also messages hidden until due)" if self.delay else ""
            purged.left.append(
                f"{about}: SQS deletes those only with PurgeQueue, which would also delete "
                f"the {'uncounted' if in_flight is None else in_flight} message(s) in "
                f"flight{hidden}; stop the workers and purge again, or delete every "
                f"message of the queue with: aws sqs purge-queue --queue-url {url}"
            )
            return
        client = self._client.get()
        try:
            client.purge_queue(QueueUrl=url)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            if not {error.get("Code"), error.get("QueryErrorCode")} & _PURGE_IN_PROGRESS:
                raise
            purged.left.append(
                f"{about}: SQS allows one PurgeQueue per queue every 60 s and one ran "
                "less than 60 s ago; purge again in a minute"
            )
            return
        purged.deleted += delayed
        logger.info(
            "SQS queue %r: PurgeQueue for %d delayed message(s) (SQS's approximate count)",
            name,
            delayed,
        )

    def _delete_visible(self, name: str, url: str, before_ms: int, purged: _Purged) -> None:
        """Receive and delete until a receive brings nothing sent before ``before_ms``."""
        client = self._client.get()
        while True:
            # A long poll asks every SQS server: an empty answer means empty.
            messages = client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=BATCH_LIMIT,
                WaitTimeSeconds=1,
                VisibilityTimeout=PURGE_VISIBILITY_S,
                MessageSystemAttributeNames=["SentTimestamp"],
            ).get("Messages", [])
            if not messages:
                return
            entries = [
                {"Id": str(n), "ReceiptHandle": raw["ReceiptHandle"]}
                for n, raw in enumerate(messages)
            ]
            response = client.delete_message_batch(QueueUrl=url, Entries=entries)
            purged.deleted += len(response.get("Successful", []))
            for failed in response.get("Failed", []):
                purged.left.append(
                    f"SQS queue {name!r} refused to delete a message ({failed.get('Code')}: "
                    f"{failed.get('Message', '')}); it is visible again after "
                    f"{PURGE_VISIBILITY_S} s"
                )
            sent = [int(raw.get("Attributes", {}).get("SentTimestamp", 0)) for raw in messages]
            if min(sent) >= before_ms:
                return  # only messages sent since clear() began: what waited is gone

    def _attributes(
        self, name: str, attributes: list[str], *, account: str | None = None
    ) -> tuple[str, Mapping[str, Any]] | None:
        """The URL of queue ``name`` and SQS's answer to GetQueueAttributes for ``attributes``.

        None (logged once) if the queue does not exist; it is never created here.
        """
        key = f"{account}:{name}" if account else name
        known = self._queues.get(name) if account is None else None
        url = known.url if known is not None else self._urls.get(key)
        client = self._client.get()
        if url is None:
            extra = {"QueueOwnerAWSAccountId": account} if account else {}
            try:
                url = str(client.get_queue_url(QueueName=name, **extra)["QueueUrl"])
            except ClientError as exc:
                if not is_missing_queue(exc):
                    raise
                self._gone(key, name)
                return None
            self._urls[key] = url
        try:
            response = client.get_queue_attributes(QueueUrl=url, AttributeNames=attributes)
        except ClientError as exc:
            if not is_missing_queue(exc):
                raise
            self._gone(key, name)
            return None
        self._missing.discard(key)
        return url, response

    def _gone(self, key: str, name: str) -> None:
        self._urls.pop(key, None)
        if key not in self._missing:
            self._missing.add(key)
            logger.warning(
                "SQS queue %r does not exist (nothing was sent to it yet, it was deleted, "
                "or the name is wrong): nothing to count or delete there",
                name,
            )

    # Cleaning up -------------------------------------------------------------

    def teardown(self) -> None:
        """Delete this driver's queues (every priority's, and the dead-letter queue)."""
        names = list(dict.fromkeys(self._names.values()))
        if self.dead_letter_queue is not None:
            names.append(self.dead_letter_queue)
        client = self._client.get()
        with self._setup_lock:
            self._dead_letter_arn = None
            self._urls.clear()
            for name in names:
                known = self._queues.pop(name, None)
                try:
                    url = known.url if known else client.get_queue_url(QueueName=name)["QueueUrl"]
                    client.delete_queue(QueueUrl=url)
                except ClientError as exc:
                    if not is_missing_queue(exc):
                        raise

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"<AmazonSqsDriver sqs://{self.queue_name}{self._where}>"


class _SqsConsumer(Consumer):
    """One worker run on the driver's queues: a small buffer of received messages.

    A ReceiveMessage takes as many messages as the worker has handlers free
    (``concurrency`` less those it holds), at most ``batch_size``, so a worker
    never holds more than it can run; :meth:`receive`
    hands them out one per call, highest priority first, and polls again once
    the buffer is empty. Every message taken and not yet settled -- buffered
    or in a handler -- is held by the :class:`Heartbeat`, which keeps it
    invisible. ``ack`` deletes (batched), ``release`` makes the message
    visible at once, ``reject`` deletes it or, under a redrive policy, leaves
    it for SQS to move to the dead-letter queue; ``close`` gives back what was
    buffered and never handed out, and leaves what a handler still runs
    hidden until its visibility timeout runs out (no other worker gets it while
    the handler may still be running it).

    ``ack``, ``release`` and ``reject`` may be called from any thread: they
    only touch the heartbeat (which serializes its SQS calls under one lock)
    and this consumer's count under its own lock. They do not raise: a failed
    delete or give-back is logged, and SQS delivers the message again after
    its visibility timeout. ``receive`` and ``close`` are called by one thread at
    a time (core's worker may receive on another thread each time).
    """

    def __init__(self, driver: AmazonSqsDriver, order: list[int], concurrency: int = 1) -> None:
        self.driver = driver
        #: The priorities read, highest first.
        self.order = order
        #: Handlers the worker runs at once: the most this consumer holds.
        self.concurrency = max(1, concurrency)
        #: Resolved on the first receive (it may need to create them).
        self.queues: list[Queue] = []
        self.heartbeat = Heartbeat(
            driver._client.get,
            driver.visibility_timeout_s,
            driver,
            enabled=driver.heartbeat,
            what=f"the visibility of messages held from SQS queue {driver.queue_name!r}",
        )
        #: Received and not handed out yet, per priority.
        self.buffer: dict[int, deque[Held]] = {priority: deque() for priority in order}
        #: Handed out and not settled yet.
        self.out: set[Held] = set()
        self.lock = threading.Lock()
        #: When the queues above the highest buffered priority were last polled.
        self.checked_at = 0.0
        #: Seconds between those polls (see :data:`RECHECK_HIGHER_S`).
        self.recheck_higher_s = RECHECK_HIGHER_S
        self.closed = False

    # Receiving ---------------------------------------------------------------

    def receive(self, timeout_s: float) -> Received | None:
        deadline = time.monotonic() + timeout_s
        if not self.queues:
            self.queues = [self.driver._queue(priority) for priority in self.order]
            self.heartbeat.start()
        self.heartbeat.flush_stale()
        while True:
            item = self._next_buffered()
            if item is None:
                self.heartbeat.flush()  # the batch is handed out: delete what was acknowledged
                if not self._poll(self.queues, self._wait_s(deadline)):
                    return None
                continue
            received = Received(
                item.body,
                item.queue.priority,
                item,
                origin=f"SQS message {item.message_id} on queue {item.queue.name}",
                delivery_count=item.receive_count,
            )
            delayed = False
            if self.driver.delay:
                message = received.decoded()  # None: poison, which core logs and rejects
                delayed = message is not None and message.execute_at is not None
                if message is not None and self._postponed(item, message):
                    if time.monotonic() >= deadline and not self._buffered():
                        return None
                    continue
            return self._hand_out(received, delayed)

    def _next_buffered(self) -> Held | None:
        """The first buffered message of the highest priority, after a look above it if due."""
        top = next((priority for priority in self.order if self.buffer[priority]), None)
        if top is None:
            return None
        higher = [queue for queue in self.queues if queue.priority > top]
        if higher and time.monotonic() - self.checked_at >= self.recheck_higher_s:
            self._poll(higher, 0)
            top = next(priority for priority in self.order if self.buffer[priority])
        return self.buffer[top].popleft()

    def _buffered(self) -> int:
        return sum(len(queue) for queue in self.buffer.values())

    def _wait_s(self, deadline: float) -> int:
        """Whole seconds the last ReceiveMessage may long-poll, ending about at ``deadline``."""
        left_s = deadline - time.monotonic() + LONG_POLL_SLACK_S
        return max(0, min(self.driver.wait_time_s, math.floor(left_s)))

    def _poll(self, queues: Sequence[Queue], wait_s: int) -> bool:
        """Receive from the first of ``queues`` that has messages into the buffer.

        Every queue but the last is short-polled; the last long-polls ``wait_s``.
        """
        self.checked_at = time.monotonic()
        client = self.driver._client.get()
        limit = self._batch_size()
        for index, queue in enumerate(queues):
            started = time.monotonic()
            response = client.receive_message(
                QueueUrl=queue.url,
                MaxNumberOfMessages=limit,
                WaitTimeSeconds=wait_s if index == len(queues) - 1 else 0,
                VisibilityTimeout=self.driver.visibility_timeout_s,
                MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
            )
            messages = response.get("Messages", [])
            if messages:
                batch = [self._held(queue, raw, started) for raw in messages]
                self.heartbeat.hold(batch)
                self.buffer[queue.priority].extend(batch)
                return True
        return False

    def _batch_size(self) -> int:
        # No more than the worker's free handlers: a message that waits in the
        # buffer while another worker idles is a slower run, and every message
        # received and given back counts towards the redrive limit. At least
        # one, for the look at higher queues while the buffer holds some.
        with self.lock:
            held = len(self.out)
        free = self.concurrency - held - self._buffered()
        return max(1, min(self.driver.batch_size, free))

    def _held(self, queue: Queue, raw: Mapping[str, Any], started: float) -> Held:
        attributes = raw.get("Attributes", {})
        sent = attributes.get("SentTimestamp")
        return Held(
            queue=queue,
            receipt=raw["ReceiptHandle"],
            message_id=raw.get("MessageId", "?"),
            body=raw.get("Body", ""),
            receive_count=int(attributes.get("ApproximateReceiveCount", 1)),
            sent_at=int(sent) / 1000 if sent else None,
            visible_until=started + self.driver.visibility_timeout_s,
        )

    def _postponed(self, item: Held, message: Message) -> bool:
        """Delay mode: True (and ``item`` hidden or re-sent) when ``message`` is not due yet."""
        left_s = 0.0 if message.execute_at is None else message.execute_at - time.time()
        if left_s <= 0:
            return False
        try:
            self._postpone(item, message.id, left_s)
        except BaseException:
            self.buffer[item.queue.priority].appendleft(item)  # still held: tried again next time
            raise
        return True

    def _postpone(self, item: Held, message_id: str, left_s: float) -> None:
        """Keep ``item``, due in ``left_s``, away from workers until then."""
        limit = item.queue.max_receive_count
        if limit is not None and item.receive_count >= max(1, limit - 1):
            # Hiding it again would let the redrive policy take it: send it anew.
            self.driver._send_body(item.queue, item.body, min(MAX_DELAY_S, math.ceil(left_s)))
            self.heartbeat.finish(item)
            logger.debug(
                "SQS queue %r: re-sent message #%s, due in %.1f s, with a fresh receive count",
                item.queue.name,
                message_id,
                left_s,
            )
        else:
            self.heartbeat.hide(item, min(MAX_VISIBILITY_S, max(1, math.ceil(left_s))))
            logger.debug(
                "SQS queue %r: hid message #%s again, due in %.1f s",
                item.queue.name,
                message_id,
                left_s,
            )

    def _hand_out(self, received: Received, held_back: bool) -> Received:
        """``received`` for core; ``held_back``: delay mode may have hidden it before."""
        item: Held = received.token
        with self.lock:
            self.out.add(item)
        if item.receive_count > 1:
            logger.log(
                logging.INFO if held_back else logging.WARNING,
                "SQS queue %r: message %s received %d times%s",
                item.queue.name,
                item.message_id,
                item.receive_count,
                " (delay mode: earlier receipts may have held it back)"
                if held_back
                else " - delivered again: a worker died, timed out or released it, "
                "or set it aside for the redrive policy",
            )
        return received

    # Settling, from any thread ---------------------------------------------

    def ack(self, received: Received) -> None:
        self.heartbeat.finish(self._settle(received))

    def release(self, received: Received) -> None:
        self.heartbeat.give_back([self._settle(received)])

    def reject(self, received: Received, reason: str) -> None:
        item = self._settle(received)
        limit = item.queue.max_receive_count
        if limit is not None:
            self.heartbeat.forget(item)
            logger.info(
                "SQS queue %r: left message %s (received %d times) for the redrive policy, "
                "which moves it to the dead-letter queue after %d receives",
                item.queue.name,
                item.message_id,
                item.receive_count,
                limit,
            )
            return
        self.heartbeat.finish(item)
        logger.warning(
            "SQS queue %r: deleted message %s (received %d times); no redrive policy keeps it",
            item.queue.name,
            item.message_id,
            item.receive_count,
        )

    def _settle(self, received: Received) -> Held:
        item: Held = received.token
        with self.lock:
            self.out.discard(item)
        return item

    # Ending the run ------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.heartbeat.stop()
        unused = [item for priority in self.order for item in self.buffer[priority]]
        for queue in self.buffer.values():
            queue.clear()
        self.heartbeat.give_back(unused)
        with self.lock:
            unsettled = len(self.out)
        if unsettled:
            # Their handlers outlived the worker's grace period. Giving them back
            # would hand them to a second worker while a handler may still run
            # them; SQS shows them again once their visibility timeout runs out.
            logger.warning(
                "SQS consumer closed with %d message(s) whose handlers still run: left "
                "hidden until their visibility timeout runs out, no longer renewed",
                unsettled,
            )
