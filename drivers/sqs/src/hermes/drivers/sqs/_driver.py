"""AmazonSqsDriver: at-least-once delivery over Amazon SQS through boto3."""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from botocore.exceptions import ClientError

from hermes.core import (
    DEFAULT_PRIORITY,
    BrokerUnavailableError,
    Callback,
    ConfigurationError,
    Delay,
    DeliveryError,
    Driver,
    Message,
    NotSupportedError,
    SerializeError,
    redact_url,
)
from hermes.drivers.sqs._capabilities import CAPABILITIES, MAX_MESSAGE_BYTES
from hermes.drivers.sqs._client import (
    ForkSafeClient,
    error_code,
    is_missing_queue,
    translate_errors,
)
from hermes.drivers.sqs._heartbeat import BATCH_LIMIT, Heartbeat, Held, Queue

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
#: Longest pause between two receive attempts while the endpoint is unreachable.
MAX_BACKOFF_S = 10.0

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
# Characters an SQS body may not contain (outside XML 1.0's character range).
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True, slots=True)
class SqsDelivery:
    """The SQS side of the message a callback is handling right now.

    Read it from a handler with :func:`current_delivery` (or the driver's
    :attr:`AmazonSqsDriver.current_delivery`) to act on redeliveries, e.g.
    to give up early on a message SQS has already handed out many times.
    """

    #: The SQS queue the message came from.
    queue_name: str
    #: SQS's own message id (not the Hermes message id).
    message_id: str
    #: ``ApproximateReceiveCount``: 1 on the first delivery, more after a
    #: worker died, timed out or raised (and, in delay mode, after receipts
    #: that only held a not-yet-due message back).
    receive_count: int
    #: The priority whose queue delivered it.
    priority: int
    #: When SQS accepted it (``SentTimestamp``), as a UNIX time.
    sent_at: float | None


_current_delivery: ContextVar[SqsDelivery | None] = ContextVar("hermes_sqs_delivery", default=None)


def current_delivery() -> SqsDelivery | None:
    """The :class:`SqsDelivery` of the message being handled in this thread, else None."""
    return _current_delivery.get()


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
    """``body`` as the text SQS carries, or NotSupportedError if it is not such text."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotSupportedError(
            f"SQS message bodies are text: these bytes are not UTF-8 ({exc})"
        ) from exc
    bad = _NOT_XML.search(text)
    if bad is not None:
        raise NotSupportedError(
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

    ``wait()`` long-polls up to ``wait_time_s`` (0-20; shutdown and max items
    are checked between polls), receives up to ``batch_size`` (1-10) messages,
    hides them for ``visibility_timeout_s`` and hands them to the callback one
    by one. A message is deleted after its callback returns, whatever it
    returned; deletes are batched per received batch (at-least-once: a worker
    that dies before the delete gets its messages delivered again after the
    visibility timeout). A callback that raises makes its message and the rest
    of the batch visible again at once and the exception propagates; so do
    the unhandled rest of a batch when shutdown or max items stop the loop.

    With ``heartbeat`` (the default) a thread renews the visibility of held
    messages whenever less than half of the timeout is left, so a long
    handler is never handed to a second worker; a dead worker stops renewing.
    SQS caps a message's visibility at 12 h from its receipt, which bounds a
    hung handler too.

    ``ApproximateReceiveCount`` is requested with every message; a count above
    1 is logged, and :func:`current_delivery` exposes it to handlers.

    ``dead_letter_queue`` (with ``max_receive_count``, default 5) creates that
    queue and sets the ``RedrivePolicy`` of this driver's queues: SQS moves a
    message there once it was received more than ``max_receive_count`` times.
    ``retention_s`` sets ``MessageRetentionPeriod`` (60 s to 14 days).

    A body that is not a Hermes message is logged with the reason and its
    receive count. With a redrive policy it is left alone, so SQS moves it
    to the dead-letter queue after ``max_receive_count`` receipts; without one
    it is deleted after the log.

    ``execute_at`` is ignored by default (delivered at once, kept in the
    message). ``delay=True`` honours it: ``send`` sets ``DelaySeconds`` (up to
    900 s, rounded up), and a message received before it is due -- longer
    delays, clock skew -- is hidden again for the time left (at most 12 h at
    a time) instead of being handled early. Each such receipt counts towards
    ``maxReceiveCount``, so once a message nears that limit it is re-sent
    (same body, fresh count) rather than hidden again.

    Priorities: the default priority uses ``queue_name``;
    ``setup_priority_queue(name, priority)`` adds the queue
    ``<queue_name>-<name>``. ``wait()`` short-polls the higher priorities and
    long-polls only the lowest, so a new high-priority message may wait up to
    ``wait_time_s`` behind an idle long poll.

    ``send`` and ``send_batch`` are safe from many threads. After ``os.fork()``
    the child builds its own client (``client_factory()`` if given, otherwise a
    copy of ``client``'s region, endpoint, config and explicit keys).
    """

    capabilities = CAPABILITIES

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
        super().__init__()
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
        self._client = ForkSafeClient(client, client_factory, owned=close_client)
        self._names: dict[int, str] = {DEFAULT_PRIORITY: self.queue_name}
        self._queues: dict[str, Queue] = {}
        self._setup_lock = threading.Lock()
        #: The dead-letter queue's ARN, found once under ``_setup_lock`` (reset by ``purge``).
        self._dead_letter_arn: str | None = None

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
                    with translate_errors("GetQueueAttributes", self.dead_letter_queue):
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
        with translate_errors("GetQueueUrl", name):
            try:
                url: str | None = client.get_queue_url(QueueName=name)["QueueUrl"]
            except ClientError as exc:
                if not is_missing_queue(exc):
                    raise
                url = None
        if url is None:
            attributes = {**on_create, **wanted}
            with translate_errors("CreateQueue", name):
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
        with translate_errors("GetQueueAttributes", name):
            current: dict[str, str] = client.get_queue_attributes(
                QueueUrl=url, AttributeNames=["All"]
            ).get("Attributes", {})
        changed = {k: v for k, v in wanted.items() if not _same_attribute(k, current.get(k), v)}
        if changed:
            with translate_errors("SetQueueAttributes", name):
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
        with translate_errors("SendMessage", queue.name, DeliveryError):
            self._client.get().send_message(QueueUrl=queue.url, MessageBody=body, **extra)

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        body = self.serializer.serialize(message)
        self._send_body(self._queue(priority), body, self._delay_seconds(message.execute_at))

    def send_raw(self, body: bytes, priority: int = DEFAULT_PRIORITY) -> None:
        """Put ``body`` on the queue as it is.

        SQS bodies are text: bytes that are not UTF-8, or that contain
        characters outside XML 1.0 (most control characters), raise
        :class:`NotSupportedError` -- no such body can be on an SQS queue.
        """
        self._send_body(self._queue(priority), _sqs_text(body), 0)

    def send_batch(self, messages: Sequence[Message], priority: int = DEFAULT_PRIORITY) -> None:
        """Send ``messages`` with SendMessageBatch, ten (and at most 256 KiB) per call.

        All are serialized before the first call. Raises :class:`DeliveryError`
        naming the Hermes ids SQS refused; the other messages were sent.
        """
        entries = [
            (message, self.serializer.serialize(message), self._delay_seconds(message.execute_at))
            for message in messages
        ]
        if not entries:
            return
        queue = self._queue(priority)
        refused: list[str] = []
        for chunk in self._batch_chunks(entries):
            request: list[dict[str, Any]] = []
            for n, (_, body, delay_s) in enumerate(chunk):
                entry: dict[str, Any] = {"Id": str(n), "MessageBody": body}
                if delay_s:
                    entry["DelaySeconds"] = delay_s
                request.append(entry)
            with translate_errors("SendMessageBatch", queue.name, DeliveryError):
                response = self._client.get().send_message_batch(
                    QueueUrl=queue.url, Entries=request
                )
            for failed in response.get("Failed", []):
                message = chunk[int(failed["Id"])][0]
                refused.append(f"{message.id} ({failed.get('Code')}: {failed.get('Message', '')})")
        if refused:
            raise DeliveryError(
                f"SQS queue {queue.name!r} refused {len(refused)} of {len(entries)} "
                f"messages: {'; '.join(refused)}"
            )

    @staticmethod
    def _batch_chunks(
        entries: list[tuple[Message, str, int]],
    ) -> list[list[tuple[Message, str, int]]]:
        chunks: list[list[tuple[Message, str, int]]] = [[]]
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

    def wait(self, callback: Callback, priorities: Sequence[int] = ()) -> None:
        order = self.check_priorities(self._names, priorities)
        queues = [self._queue(priority) for priority in order]
        held = Heartbeat(self._client.get, self.visibility_timeout_s, enabled=self.heartbeat)
        held.start()
        backoff_s = 0.0
        try:
            while not self.should_stop():
                try:
                    batch = self._receive(queues)
                except BrokerUnavailableError as exc:
                    backoff_s = min(MAX_BACKOFF_S, max(0.5, backoff_s * 2))
                    logger.warning(
                        "SQS receive failed, retrying in %.1f s - %s",
                        backoff_s,
                        exc,
                        exc_info=exc.__cause__,
                    )
                    self.pause(backoff_s)
                    continue
                backoff_s = 0.0
                if batch:
                    self._handle_batch(batch, callback, held)
        finally:
            held.stop()

    def _receive(self, queues: Sequence[Queue]) -> list[Held]:
        limit = self.batch_size
        if self.max_process_items:
            limit = max(1, min(limit, self.max_process_items - self.processed_items))
        client = self._client.get()
        for index, queue in enumerate(queues):
            started = time.monotonic()
            with translate_errors("ReceiveMessage", queue.name):
                response = client.receive_message(
                    QueueUrl=queue.url,
                    MaxNumberOfMessages=limit,
                    WaitTimeSeconds=self.wait_time_s if index == len(queues) - 1 else 0,
                    VisibilityTimeout=self.visibility_timeout_s,
                    MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
                )
            messages = response.get("Messages", [])
            if messages:
                return [self._held(queue, raw, started) for raw in messages]
        return []

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
            visible_until=started + self.visibility_timeout_s,
        )

    def _handle_batch(self, batch: list[Held], callback: Callback, held: Heartbeat) -> None:
        held.hold(batch)
        pending = deque(batch)
        current: Held | None = None
        try:
            while pending and not self.should_stop():
                current = pending.popleft()
                message = self._accept(current, held)
                if message is not None:
                    delivery = SqsDelivery(
                        queue_name=current.queue.name,
                        message_id=current.message_id,
                        receive_count=current.receive_count,
                        priority=current.queue.priority,
                        sent_at=current.sent_at,
                    )
                    token = _current_delivery.set(delivery)
                    try:
                        callback(message, current.queue.priority)
                    finally:
                        _current_delivery.reset(token)
                    held.finish(current)
                    self.processed_items += 1
                current = None
                held.flush_stale()
        except BaseException:
            held.give_back(([current] if current is not None else []) + list(pending))
            pending.clear()
            raise
        finally:
            held.give_back(list(pending))
            held.flush()

    def _accept(self, item: Held, held: Heartbeat) -> Message | None:
        """The message in ``item``, or None when it is set aside or not yet due."""
        queue = item.queue
        try:
            message = self.serializer.unserialize(item.body)
        except SerializeError as exc:
            if queue.max_receive_count is not None:
                held.forget(item)
                logger.error(
                    "SQS queue %r: message %s is not a Hermes message (received %d times); "
                    "left for the redrive policy, which moves it to the dead-letter queue "
                    "after %d receives - %s",
                    queue.name,
                    item.message_id,
                    item.receive_count,
                    queue.max_receive_count,
                    exc,
                )
            else:
                held.finish(item)
                logger.error(
                    "SQS queue %r: deleted message %s, which is not a Hermes message "
                    "(received %d times; no redrive policy keeps it) - %s",
                    queue.name,
                    item.message_id,
                    item.receive_count,
                    exc,
                )
            return None
        if self.delay and message.execute_at is not None:
            left_s = message.execute_at - time.time()
            if left_s > 0:
                self._postpone(item, message, left_s, held)
                return None
        if item.receive_count > 1:
            held_back = self.delay and message.execute_at is not None
            logger.log(
                logging.INFO if held_back else logging.WARNING,
                "SQS queue %r: message #%s (%s) received %d times%s",
                queue.name,
                message.id,
                message.type,
                item.receive_count,
                " (delayed: earlier receipts may have held it back)"
                if held_back
                else " - delivered again after a worker died, timed out or raised",
            )
        return message

    def _postpone(self, item: Held, message: Message, left_s: float, held: Heartbeat) -> None:
        limit = item.queue.max_receive_count
        if limit is not None and item.receive_count >= max(1, limit - 1):
            # Hiding it again would let the redrive policy take it: send it anew.
            self._send_body(item.queue, item.body, min(MAX_DELAY_S, math.ceil(left_s)))
            held.finish(item)
            logger.debug(
                "SQS queue %r: re-sent message #%s, due in %.1f s, with a fresh receive count",
                item.queue.name,
                message.id,
                left_s,
            )
        else:
            held.hide(item, min(MAX_VISIBILITY_S, max(1, math.ceil(left_s))))
            logger.debug(
                "SQS queue %r: hid message #%s again, due in %.1f s",
                item.queue.name,
                message.id,
                left_s,
            )

    # Cleaning up -------------------------------------------------------------

    def purge(self) -> None:
        """Delete this driver's queues (every priority's, and the dead-letter queue)."""
        names = list(dict.fromkeys(self._names.values()))
        if self.dead_letter_queue is not None:
            names.append(self.dead_letter_queue)
        client = self._client.get()
        with self._setup_lock:
            self._dead_letter_arn = None
            for name in names:
                known = self._queues.pop(name, None)
                with translate_errors("DeleteQueue", name):
                    try:
                        url = (
                            known.url if known else client.get_queue_url(QueueName=name)["QueueUrl"]
                        )
                        client.delete_queue(QueueUrl=url)
                    except ClientError as exc:
                        if not is_missing_queue(exc):
                            raise

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        meta = getattr(self._client.get(), "meta", None)
        where = (
            f" region={meta.region_name} endpoint={redact_url(meta.endpoint_url)}" if meta else ""
        )
        return f"<AmazonSqsDriver sqs://{self.queue_name}{where}>"
