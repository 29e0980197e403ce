"""LazyRabbitMqDriver: RabbitMQ through pika, acknowledged after the handler."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pika
from pika import exceptions as pika_exc

from hermes.core import (
    DEFAULT_PRIORITY,
    Callback,
    ConfigurationError,
    Delay,
    Driver,
    DriverError,
    Message,
    SerializeError,
)
from hermes.drivers.rabbitmq._capabilities import CAPABILITIES
from hermes.drivers.rabbitmq._delay import (
    DELAY_SUFFIX_LEN,
    DUE_TOLERANCE_S,
    EXPIRY_MARGIN_MS,
    bucket_ms,
    delay_queue_arguments,
    delay_queue_name,
)
from hermes.drivers.rabbitmq._errors import RECOVERABLE, describe, translate

logger = logging.getLogger("hermes.drivers.rabbitmq")

#: How long an idle worker waits for the broker between two checks of
#: shutdown and max items, unless ``refresh_interval`` says otherwise.
DEFAULT_IDLE_WAIT_S = 0.5

#: AMQP's limit on a queue name, in UTF-8 bytes.
MAX_QUEUE_NAME_BYTES = 255

#: The first pause before reconnecting; it doubles up to ``reconnect_max_delay_s``.
FIRST_RECONNECT_DELAY_S = 0.5


@dataclass(frozen=True)
class _QueueSpec:
    """A queue the driver declares before it publishes to or reads from it."""

    name: str
    arguments: Mapping[str, Any]
    #: Declare it again when the last declaration is older than this (a delay
    #: queue's expiry lease); None: once per connection.
    redeclare_after_s: float | None = None
    #: The queue it dead-letters into, declared first so nothing is dropped.
    dead_letters_to: _QueueSpec | None = None


@dataclass
class _Delivery:
    priority: int
    queue: str
    tag: int
    body: bytes


class _Publisher:
    """The sending side: one connection per process, used under the driver's send lock."""

    def __init__(self, connection: Any, confirm: bool) -> None:
        self.connection = connection
        self.channel = connection.channel()
        if confirm:
            self.channel.confirm_delivery()
        #: A channel in transaction mode for ``send_batch`` (one commit per batch).
        self.batch_channel: Any = None
        #: (queue, body) of the batch messages the broker returned as unroutable.
        self.batch_returned: list[tuple[str, bytes]] = []
        #: Queue name -> ``time.monotonic()`` of its last declaration on this connection.
        self.declared: dict[str, float] = {}

    def close(self) -> None:
        _close_quietly(self.connection)


def _close_quietly(connection: Any) -> None:
    if connection is None or not connection.is_open:
        return
    try:
        connection.close()
    except pika_exc.AMQPError as exc:
        # The connection is being abandoned; the broker cleans up after it.
        logger.debug("closing a RabbitMQ connection failed - %s", describe(exc))


#: Every driver object, so a forked child can forget its parent's connections.
_drivers: weakref.WeakSet[LazyRabbitMqDriver] = weakref.WeakSet()


def _forget_connections_in_child() -> None:
    for driver in list(_drivers):
        driver._after_fork()


os.register_at_fork(after_in_child=_forget_connections_in_child)


class LazyRabbitMqDriver(Driver):
    """Messages in RabbitMQ queues; removed with ``basic_ack`` after the callback returns.

    * Connects on the first ``send()``/``wait()``, not in the constructor.
    * Queues are durable and messages persistent unless ``durable=False``;
      with ``confirm=True`` (the default) ``send()`` waits for the broker's
      publisher confirm and raises :class:`DeliveryError` for a nack or an
      unroutable message.
    * At-least-once: a message is acknowledged after the callback returns.
      A callback that raises gets its message requeued (and the exception
      propagates); a worker that dies leaves its unacknowledged messages to
      the broker, which hands them out again at once.
    * Priorities: ``setup_priority_queue(name, p)`` adds the queue
      ``<queue>.<name>``. A worker reading one queue consumes it with
      ``prefetch``; a worker reading several takes the next message with
      ``basic_get`` from the highest non-empty queue, and while all are empty
      consumes them all (one message each) so it wakes when one arrives.
    * ``delay=False`` (default): ``execute_at`` is kept in the message and
      ignored. ``delay=True``: a message due later waits in a TTL queue that
      dead-letters back to its work queue (see ``_delay``); workers must use
      ``delay=True`` too, so a message that came back early goes round again.
    * A body that is not a Hermes message is logged and rejected without
      requeue: a dead-letter exchange configured through ``queue_arguments``
      (``x-dead-letter-exchange``) catches it.
    * A worker that loses its connection after it started logs it and
      reconnects with a growing pause (up to ``reconnect_max_delay_s``),
      checking shutdown meanwhile; a first connection that fails raises
      :class:`BrokerUnavailableError`.
    * ``send()`` is thread-safe (one publishing connection per process,
      behind a lock) and fork-safe (a child opens its own connections).
      One ``wait()`` at a time per driver object.
    * pika answers heartbeats only between messages: a handler that runs
      longer than the heartbeat timeout (60 s unless the URL says
      ``heartbeat=``) loses the connection, and its message is delivered
      again. Raise ``heartbeat`` for long handlers.
    """

    capabilities = CAPABILITIES

    def __init__(
        self,
        parameters: pika.ConnectionParameters,
        queue: str,
        message_properties: pika.BasicProperties | Mapping[str, Any] | None = None,
        refresh_interval: float = 0,
        consumer_tag: str = "hermes",
        prefetch: int = 1,
        *,
        durable: bool = True,
        confirm: bool = True,
        delay: bool = False,
        queue_arguments: Mapping[str, Any] | None = None,
        reconnect_max_delay_s: float = 30.0,
    ) -> None:
        super().__init__()
        _check_queue_name(queue, "queue")
        if (
            isinstance(prefetch, bool)
            or not isinstance(prefetch, int)
            or not 1 <= prefetch <= 65535
        ):
            raise ConfigurationError(
                f"prefetch must be an integer from 1 to 65535, got {prefetch!r}"
            )
        if refresh_interval < 0:
            raise ConfigurationError(
                f"refresh_interval must be >= 0 seconds (0 = {DEFAULT_IDLE_WAIT_S} s), "
                f"got {refresh_interval!r}"
            )
        if reconnect_max_delay_s <= 0:
            raise ConfigurationError(
                f"reconnect_max_delay_s must be > 0 seconds, got {reconnect_max_delay_s!r}"
            )
        if not consumer_tag:
            raise ConfigurationError("consumer_tag must not be empty")
        #: How to reach the broker.
        self.parameters = parameters
        #: The queue of the default priority; every other queue name derives from it.
        self.queue = queue
        self.refresh_interval = refresh_interval
        self.consumer_tag = consumer_tag
        self.prefetch = prefetch
        self.durable = durable
        self.confirm = confirm
        self.delay = delay
        #: Arguments of every work queue (dead-lettering, TTL, quorum type ...).
        self.queue_arguments: dict[str, Any] = dict(queue_arguments or {})
        self.reconnect_max_delay_s = reconnect_max_delay_s
        self.message_properties = _properties(message_properties, durable)
        if delay:
            self.capabilities = dataclasses.replace(type(self).capabilities, delay=Delay.NATIVE)
        #: Priority -> work queue name.
        self._queues: dict[int, str] = {DEFAULT_PRIORITY: queue}
        #: Delay queues this object declared, deleted by :meth:`purge`.
        self._delay_queues: set[str] = set()
        self._where = _describe_parameters(parameters)
        self._pid = os.getpid()
        self._send_lock = threading.Lock()
        self._publisher: _Publisher | None = None
        _drivers.add(self)

    # Queues ------------------------------------------------------------------

    def setup_priority_queue(self, name: str, priority: int) -> None:
        """Read and send ``priority`` through the queue ``<queue>.<name>``."""
        full = name if name == self.queue else f"{self.queue}.{name}"
        _check_queue_name(full, f"priority queue {name!r}")
        for other, queue in self._queues.items():
            if queue == full and other != priority:
                raise ConfigurationError(
                    f"{self._where}: queue {full!r} already holds priority {other}; "
                    f"give priority {priority} its own name"
                )
        self._queues[priority] = full

    def priority_queues(self) -> dict[int, str]:
        """Priority -> the RabbitMQ queue that holds it."""
        return dict(self._queues)

    def _work_queue(self, priority: int) -> _QueueSpec:
        try:
            name = self._queues[priority]
        except KeyError:
            raise self.unknown_priority(priority, self._queues) from None
        return _QueueSpec(name, self.queue_arguments)

    def _delay_queue(self, work: _QueueSpec, ttl_ms: int) -> _QueueSpec:
        return _QueueSpec(
            delay_queue_name(work.name, ttl_ms),
            delay_queue_arguments(work.name, ttl_ms),
            redeclare_after_s=EXPIRY_MARGIN_MS / 2000,
            dead_letters_to=work,
        )

    def _target(self, priority: int, execute_at: float | None) -> _QueueSpec:
        work = self._work_queue(priority)
        if self.delay and execute_at is not None:
            ttl_ms = bucket_ms(execute_at - time.time())
            if ttl_ms > 0:
                return self._delay_queue(work, ttl_ms)
        return work

    # Sending -----------------------------------------------------------------

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        target = self._target(priority, message.execute_at)
        body = self.serializer.serialize(message).encode("utf-8")
        self._publish([(target, body)], f"sending message #{message.id} to {target.name!r}")

    def send_raw(self, body: bytes, priority: int = DEFAULT_PRIORITY) -> None:
        """Publish ``body`` as it is to the work queue of ``priority`` (no delay)."""
        target = self._work_queue(priority)
        self._publish([(target, bytes(body))], f"sending raw bytes to {target.name!r}")

    def send_batch(self, messages: Sequence[Message], priority: int = DEFAULT_PRIORITY) -> None:
        """Publish ``messages`` in one transaction: one round trip to the broker for all."""
        items = [
            (self._target(priority, m.execute_at), self.serializer.serialize(m).encode("utf-8"))
            for m in messages
        ]
        if items:
            self._publish(items, f"sending a batch of {len(items)} messages")

    def _publish(self, items: Sequence[tuple[_QueueSpec, bytes]], doing: str) -> None:
        def publish(publisher: _Publisher) -> None:
            for spec in {spec.name: spec for spec, _ in items}.values():
                self._declare(publisher, spec)
            if len(items) == 1 or not self.confirm:
                for spec, body in items:
                    self._basic_publish(publisher.channel, spec, body)
            else:
                self._publish_transaction(publisher, items)

        self._with_publisher(publish, doing)

    def _with_publisher(self, action: Callable[[_Publisher], None], doing: str) -> None:
        """Run ``action`` on the publishing connection, under the send lock.

        A connection that died while idle (heartbeat timeout, broker restart)
        is replaced and ``action`` runs once more; so does a publish to a queue
        that vanished after it was declared. Anything else raises, translated.
        """
        self._check_process()
        with self._send_lock, translate(doing, self._where):
            for attempt in (1, 2):
                fresh = self._publisher is None or not self._publisher.connection.is_open
                publisher = self._publisher_link()
                try:
                    # Reads what the broker sent meanwhile (heartbeats, a close),
                    # so a connection it dropped is noticed before using it.
                    publisher.connection.process_data_events(0)
                    action(publisher)
                    return
                except pika_exc.UnroutableError:
                    if attempt == 2:
                        raise
                    logger.warning(
                        "%s: a queue was missing while %s; declaring it again", self._where, doing
                    )
                    publisher.declared.clear()
                except pika_exc.AMQPConnectionError as exc:
                    self._drop_publisher()
                    # A blocked broker (memory/disk alarm) would block the retry too.
                    if fresh or attempt == 2 or isinstance(exc, pika_exc.ConnectionBlockedTimeout):
                        raise
                    logger.warning(
                        "%s: the connection had closed (%s) before %s; using a new one",
                        self._where,
                        describe(exc),
                        doing,
                    )
                except pika_exc.AMQPChannelError:
                    # A channel the broker closed is unusable; start afresh next time.
                    self._drop_publisher()
                    raise

    def _basic_publish(self, channel: Any, spec: _QueueSpec, body: bytes) -> None:
        channel.basic_publish(
            "", spec.name, body, properties=self.message_properties, mandatory=self.confirm
        )

    def _publish_transaction(
        self, publisher: _Publisher, items: Sequence[tuple[_QueueSpec, bytes]]
    ) -> None:
        channel = publisher.batch_channel
        if channel is None or not channel.is_open:
            channel = publisher.connection.channel()
            channel.tx_select()
            returned = publisher.batch_returned
            channel.add_on_return_callback(
                lambda _channel, method, _props, body: returned.append((method.routing_key, body))
            )
            publisher.batch_channel = channel
        publisher.batch_returned.clear()
        for spec, body in items:
            self._basic_publish(channel, spec, body)
        channel.tx_commit()
        publisher.connection.process_data_events(0)  # dispatches Basic.Return, if any
        if not publisher.batch_returned:
            return
        # The rest is committed; these found no queue (it vanished after its
        # declaration). Declare again and send each with a confirm, which
        # raises if it is still unroutable.
        again = list(publisher.batch_returned)
        publisher.batch_returned.clear()
        logger.warning(
            "%s: %d message(s) of a batch were unroutable; sending them again",
            self._where,
            len(again),
        )
        publisher.declared.clear()
        specs = {spec.name: spec for spec, _ in items}
        for name, body in again:
            self._declare(publisher, specs[name])
            self._basic_publish(publisher.channel, specs[name], body)

    def _declare(self, publisher: _Publisher, spec: _QueueSpec) -> None:
        if spec.dead_letters_to is not None:
            self._declare(publisher, spec.dead_letters_to)
        last = publisher.declared.get(spec.name)
        now = time.monotonic()
        if last is not None and (
            spec.redeclare_after_s is None or now - last < spec.redeclare_after_s
        ):
            return
        publisher.channel.queue_declare(
            spec.name, durable=self.durable, arguments=dict(spec.arguments)
        )
        publisher.declared[spec.name] = now
        if spec.dead_letters_to is not None:
            self._delay_queues.add(spec.name)

    def _publisher_link(self) -> _Publisher:
        publisher = self._publisher
        if publisher is None or not publisher.connection.is_open:
            if publisher is not None:
                publisher.close()
            publisher = self._publisher = _Publisher(self._connect(), self.confirm)
        return publisher

    def _drop_publisher(self) -> None:
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.close()

    def _connect(self) -> Any:
        return pika.BlockingConnection(self.parameters)

    # Process ownership -------------------------------------------------------

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            self._after_fork()

    def _after_fork(self) -> None:
        # The parent's sockets are not ours: never write to or close them.
        self._pid = os.getpid()
        self._publisher = None
        self._send_lock = threading.Lock()

    # Waiting -----------------------------------------------------------------

    @property
    def idle_wait_s(self) -> float:
        """The longest wait for the broker between two checks of shutdown and max items."""
        return self.refresh_interval or DEFAULT_IDLE_WAIT_S

    def wait(self, callback: Callback, priorities: Sequence[int] = ()) -> None:
        order = self.check_priorities(self._queues, priorities)
        self._check_process()
        session = _Session(self, order)
        try:
            with translate(f"opening queue(s) {session.queue_names()} to wait on", self._where):
                session.open()
            while not self.should_stop():
                delivery = session.next(self.idle_wait_s)
                if delivery is not None:
                    self._handle(session, delivery, callback)
        finally:
            session.close()

    def _handle(self, session: _Session, delivery: _Delivery, callback: Callback) -> None:
        try:
            message = self.serializer.unserialize(delivery.body)
        except SerializeError as exc:
            logger.error(
                "%s: rejected a body in queue %r that is not a Hermes message "
                "(%d bytes; a dead-letter exchange on the queue keeps it) - %s",
                self._where,
                delivery.queue,
                len(delivery.body),
                exc,
            )
            session.settle(delivery, "reject")
            return
        if self.delay and message.execute_at is not None:
            remaining = message.execute_at - time.time()
            if remaining >= DUE_TOLERANCE_S:
                self._delay_again(session, delivery, message, remaining)
                return
        try:
            callback(message, delivery.priority)
        except BaseException:
            session.settle(delivery, "requeue")
            raise
        self.processed_items += 1
        session.settle(delivery, "ack")

    def _delay_again(
        self, session: _Session, delivery: _Delivery, message: Message, remaining_s: float
    ) -> None:
        """A message back from a delay queue before it is due goes through a shorter one."""
        work = self._work_queue(delivery.priority)
        target = self._delay_queue(work, max(1, bucket_ms(remaining_s)))
        try:
            self._publish(
                [(target, delivery.body)],
                f"delaying message #{message.id} by another {remaining_s:.3f} s",
            )
        except DriverError as exc:
            session.settle(delivery, "requeue")
            session.lost = exc
            return
        session.settle(delivery, "ack")

    # Cleaning up -------------------------------------------------------------

    def purge(self) -> None:
        """Delete every work queue of this driver and the delay queues it declared."""
        names = [*self._queues.values(), *sorted(self._delay_queues)]

        def delete(publisher: _Publisher) -> None:
            for name in names:
                publisher.channel.queue_delete(name)
            publisher.declared.clear()
            self._delay_queues.difference_update(names)

        self._with_publisher(delete, f"deleting queues {names}")

    def close(self) -> None:
        """Close the publishing connection (a waiting worker closes its own). Idempotent."""
        if self._pid != os.getpid():
            self._after_fork()
            return
        with self._send_lock:
            self._drop_publisher()

    def __repr__(self) -> str:
        return f"<LazyRabbitMqDriver {self._where} queue={self.queue!r}>"


class _Session:
    """The consuming side of one ``wait()``: its own connection and channel.

    Turns broker failures into a reconnect (``lost`` is set, the next
    :meth:`next` reconnects with backoff); only the first :meth:`open` raises.
    """

    def __init__(self, driver: LazyRabbitMqDriver, order: list[int]) -> None:
        self.driver = driver
        #: Priorities to read, highest first.
        self.order = order
        self.queues = {priority: driver._work_queue(priority) for priority in order}
        self.connection: Any = None
        self.channel: Any = None
        #: Deliveries received and not yet handed out, in the order to hand them out.
        self.pending: deque[_Delivery] = deque()
        #: Active consumers: tag -> priority.
        self.consumers: dict[str, int] = {}
        self.cancelled_by_broker = False
        #: Why the connection is unusable; the next ``next()`` reconnects.
        self.lost: BaseException | None = None

    def queue_names(self) -> list[str]:
        return [spec.name for spec in self.queues.values()]

    @property
    def single(self) -> bool:
        return len(self.order) == 1

    def open(self) -> None:
        driver = self.driver
        self.connection = driver._connect()
        channel = self.channel = self.connection.channel()
        channel.add_on_cancel_callback(self._on_cancel)
        for spec in self.queues.values():
            channel.queue_declare(spec.name, durable=driver.durable, arguments=dict(spec.arguments))
        if self.single:
            channel.basic_qos(prefetch_count=driver.prefetch)
            self._consume(self.order[0], driver.consumer_tag)
        else:
            # Consumers exist only while every queue is empty; one message each
            # is enough to wake up.
            channel.basic_qos(prefetch_count=1)

    def _consume(self, priority: int, tag: str) -> None:
        spec = self.queues[priority]
        pending = self.pending

        def on_message(_channel: Any, method: Any, _properties: Any, body: bytes) -> None:
            pending.append(_Delivery(priority, spec.name, method.delivery_tag, body))

        self.channel.basic_consume(spec.name, on_message, consumer_tag=tag)
        self.consumers[tag] = priority

    def _on_cancel(self, _frame: Any) -> None:
        self.cancelled_by_broker = True

    def next(self, timeout_s: float) -> _Delivery | None:
        """The next delivery, or None after waiting up to ``timeout_s`` (or reconnecting)."""
        if self.lost is None:
            try:
                return self._next(timeout_s)
            except RECOVERABLE as exc:
                self.lost = exc
        self._reconnect()
        return None

    def _next(self, timeout_s: float) -> _Delivery | None:
        if self.pending:
            return self.pending.popleft()
        if self.single:
            self._process_events(timeout_s)
            return self.pending.popleft() if self.pending else None
        if not self.consumers:
            for priority in self.order:
                spec = self.queues[priority]
                method, _properties, body = self.channel.basic_get(spec.name)
                if method is not None:
                    return _Delivery(priority, spec.name, method.delivery_tag, body or b"")
            for priority in self.order:
                self._consume(priority, f"{self.driver.consumer_tag}.{priority}")
        self._process_events(timeout_s)
        if not self.pending:
            return None
        # Something arrived while every queue was empty: stop consuming (pika
        # requeues what it received but did not dispatch), hand out what was
        # received highest priority first, then read with basic_get again.
        for tag in list(self.consumers):
            self.channel.basic_cancel(tag)
        self.consumers.clear()
        rank = {priority: index for index, priority in enumerate(self.order)}
        self.pending = deque(sorted(self.pending, key=lambda d: rank[d.priority]))
        return self.pending.popleft()

    def _process_events(self, timeout_s: float) -> None:
        self.connection.process_data_events(time_limit=timeout_s)
        if self.cancelled_by_broker:
            raise pika_exc.ConsumerCancelled(
                "RabbitMQ cancelled the consumer (was the queue deleted?)"
            )

    def settle(self, delivery: _Delivery, how: str) -> None:
        """``ack``, ``reject`` (dead-letter) or ``requeue`` ``delivery``.

        A failure marks the session lost instead of raising.
        """
        if self.lost is not None:
            return  # its channel is gone; the broker requeued it already
        try:
            if how == "ack":
                self.channel.basic_ack(delivery.tag)
            elif how == "reject":
                self.channel.basic_reject(delivery.tag, requeue=False)
            else:
                self.channel.basic_nack(delivery.tag, requeue=True)
        except RECOVERABLE as exc:
            logger.warning(
                "%s: could not %s a message of queue %r (RabbitMQ delivers it again) - %s",
                self.driver._where,
                how,
                delivery.queue,
                describe(exc),
            )
            self.lost = exc

    def _reconnect(self) -> None:
        driver = self.driver
        logger.warning(
            "%s: lost the connection while waiting on %s - %s; reconnecting",
            driver._where,
            self.queue_names(),
            describe(self.lost) if self.lost else "unknown",
        )
        attempt = 0
        while True:
            self._discard()
            if driver.should_stop():
                return
            attempt += 1
            try:
                self.open()
            except RECOVERABLE as exc:
                pause = min(
                    driver.reconnect_max_delay_s, FIRST_RECONNECT_DELAY_S * 2 ** (attempt - 1)
                )
                logger.warning(
                    "%s: reconnect attempt %d failed - %s; next in %.1f s",
                    driver._where,
                    attempt,
                    describe(exc),
                    pause,
                )
                driver.pause(pause, driver.idle_wait_s)
                continue
            self.lost = None
            logger.warning(
                "%s: reconnected after %d attempt(s); waiting on %s again",
                driver._where,
                attempt,
                self.queue_names(),
            )
            return

    def _discard(self) -> None:
        """Forget the connection: the broker requeues whatever it had not acknowledged."""
        _close_quietly(self.connection)
        self.connection = self.channel = None
        self.pending.clear()
        self.consumers.clear()
        self.cancelled_by_broker = False

    def close(self) -> None:
        self._discard()


def _check_queue_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{what} name must be a non-empty string, got {name!r}")
    if name.startswith("amq."):
        raise ConfigurationError(
            f"{what} name {name!r} starts with 'amq.', which RabbitMQ reserves"
        )
    limit = MAX_QUEUE_NAME_BYTES - DELAY_SUFFIX_LEN
    if len(name.encode("utf-8")) > limit:
        raise ConfigurationError(
            f"{what} name {name[:40]!r}... is longer than {limit} bytes "
            f"(RabbitMQ allows {MAX_QUEUE_NAME_BYTES}, delay queues add a suffix)"
        )


def _properties(
    given: pika.BasicProperties | Mapping[str, Any] | None, durable: bool
) -> pika.BasicProperties:
    values: dict[str, Any] = {
        "content_type": "application/json",
        "delivery_mode": pika.DeliveryMode.Persistent if durable else pika.DeliveryMode.Transient,
    }
    if isinstance(given, pika.BasicProperties):
        values.update({k: v for k, v in vars(given).items() if v is not None})
    elif given is not None:
        values.update(given)
    try:
        return pika.BasicProperties(**values)
    except TypeError as exc:
        raise ConfigurationError(
            f"message_properties {values!r} are not AMQP message properties - {exc}"
        ) from exc


def _describe_parameters(parameters: pika.ConnectionParameters) -> str:
    """``amqp://user@host:port/vhost``: the broker, never the password."""
    scheme = "amqps" if parameters.ssl_options else "amqp"
    user = getattr(parameters.credentials, "username", None)
    userinfo = f"{quote(user, safe='')}@" if user else ""
    vhost = quote(parameters.virtual_host, safe="")
    return f"{scheme}://{userinfo}{parameters.host}:{parameters.port}/{vhost}"
