"""LazyRabbitMqDriver: RabbitMQ through pika, acknowledged after the handler."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pika
from pika import exceptions as pika_exc

from hermes.core import ConfigurationError, DriverError
from hermes.core.driver import DEFAULT_PRIORITY, Consumer, Delay, Driver, Outgoing, QueueStats
from hermes.core.drivertools import PerProcess
from hermes.drivers.rabbitmq._capabilities import CAPABILITIES
from hermes.drivers.rabbitmq._consumer import RabbitMqConsumer
from hermes.drivers.rabbitmq._delay import (
    DELAY_SUFFIX_LEN,
    EVERY_BUCKET_MS,
    EXPIRY_MARGIN_MS,
    bucket_ms,
    delay_queue_arguments,
    delay_queue_name,
)
from hermes.drivers.rabbitmq._errors import (
    CLIENT_ERRORS,
    NOT_FOUND,
    REFUSED_ERRORS,
    UNAVAILABLE_ERRORS,
    classify,
    close_quietly,
    connect_failure,
    declaring,
    describe,
    refusal,
)
from hermes.drivers.rabbitmq._quorum import (
    STARTING_RETRY_S,
    STARTING_S,
    check_quorum,
    is_quorum,
)

logger = logging.getLogger("hermes.drivers.rabbitmq")

#: AMQP's limit on a queue name, in UTF-8 bytes.
MAX_QUEUE_NAME_BYTES = 255


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


#: A publishing connection the broker answered on less than this long ago is used
#: as it is; one idle longer first reads what the broker sent meanwhile.
_IDLE_CHECK_S = 1.0


class _Publisher:
    """This process's sending side: one connection, opened on first use, used under :attr:`lock`.

    Made per process (:class:`~hermes.core.drivertools.PerProcess`), so a forked child
    gets its own connection and its own lock, free even if a thread of the
    parent held the parent's at the fork.
    """

    def __init__(self, connect: Callable[[], Any], confirm: bool) -> None:
        self._connect = connect
        self.confirm = confirm
        self.lock = threading.Lock()
        self.connection: Any = None
        self.channel: Any = None
        #: A channel in transaction mode for ``send_batch`` (one commit per batch).
        self.batch_channel: Any = None
        #: (queue, body) of the batch messages the broker returned as unroutable.
        self.batch_returned: list[tuple[str, bytes]] = []
        #: Queue name -> ``time.monotonic()`` of its last declaration on this connection.
        self.declared: dict[str, float] = {}
        #: ``time.monotonic()`` when the broker last answered on this connection.
        self.answered = 0.0

    def link(self) -> bool:
        """Open the connection unless it is open; True if it is a new one."""
        if self.connection is not None and self.connection.is_open:
            return False
        self.drop()
        connection = self._connect()
        try:
            channel = connection.channel()
            if self.confirm:
                channel.confirm_delivery()
        except BaseException:
            close_quietly(connection)
            raise
        self.connection, self.channel = connection, channel
        return True

    def drop(self) -> None:
        """Close the connection (if any) and forget what was declared on it."""
        close_quietly(self.connection)
        self.connection = self.channel = self.batch_channel = None
        self.batch_returned.clear()
        self.declared.clear()


class _Sending:
    """The "sending N message(s) to [queues]" of a log line, built only if one is written."""

    __slots__ = ("targets",)

    def __init__(self, targets: Sequence[tuple[_QueueSpec, bytes]]) -> None:
        self.targets = targets

    def __str__(self) -> str:
        names = sorted({spec.name for spec, _ in self.targets})
        return f"sending {len(self.targets)} message(s) to {names}"


class LazyRabbitMqDriver(Driver):
    """Messages in RabbitMQ queues; removed with ``basic_ack`` after the callback returns.

    * Connects on the first ``put()`` or ``receive``, not in the constructor.
    * Queues are durable and messages persistent unless ``durable=False``;
      with ``confirm=True`` (the default) ``put()`` waits for the broker's
      publisher confirm (several items: one transaction, one commit) and a
      nack or an unroutable message raises :class:`DeliveryError`.
    * A wrong user or password, a vhost that does not exist or that the user
      may not open, and a 403 on a channel are :class:`BrokerRefusedError`
      (a worker stops); a connection that cannot be made or was lost, and a
      channel lost under a worker, are :class:`BrokerUnavailableError` (a
      worker reconnects).
    * At-least-once: a message is acknowledged after the callback returns. A
      callback that raises gets its message requeued (and the exception
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
    * Quorum work queues (``x-queue-type=quorum`` in ``queue_arguments``)
      count deliveries: ``Received.delivery_count`` is 1, then one more than
      RabbitMQ's ``x-delivery-count`` header, and the driver declares
      ``counts_deliveries`` (so ``max_deliveries`` works). Classic queues
      keep no count: None. Settings a quorum queue cannot have
      (``durable=False``, ``x-max-priority`` ...) raise ConfigurationError here.
    * A body that is not a Hermes message is rejected without requeue: a
      dead-letter exchange configured through ``queue_arguments``
      (``x-dead-letter-exchange``) catches it.
    * The worker loop is core's (:class:`~hermes.core.Worker`); the consumer
      (:meth:`consumer`) has its own connection, opened on the worker's
      thread, and a new one after the broker was lost.
    * ``put()`` is thread-safe (one publishing connection per process,
      behind a lock) and fork-safe (a child opens its own connections).
    * pika answers heartbeats only from inside its calls: while every
      handler thread runs a handler, core's worker calls the consumer a few
      times a second to keep the connection alive, so handlers may run far
      longer than the heartbeat timeout (60 s unless the URL says
      ``heartbeat=``).
    """

    capabilities = CAPABILITIES
    refused_errors = REFUSED_ERRORS
    unavailable_errors = UNAVAILABLE_ERRORS
    client_errors = CLIENT_ERRORS

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
    ) -> None:
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
                f"refresh_interval must be >= 0 seconds (0 = the worker's idle wait), "
                f"got {refresh_interval!r}"
            )
        if not consumer_tag:
            raise ConfigurationError("consumer_tag must not be empty")
        #: How to reach the broker.
        self.parameters = parameters
        #: The queue of the default priority; every other queue name derives from it.
        self.queue = queue
        #: The longest single wait on the broker while idle (0: as long as the
        #: worker allows, which is at most :data:`~hermes.core.driver.IDLE_WAIT_S`).
        self.refresh_interval = refresh_interval
        self.consumer_tag = consumer_tag
        self.prefetch = prefetch
        self.durable = durable
        self.confirm = confirm
        self.delay = delay
        #: Arguments of every work queue (dead-lettering, TTL, quorum type ...).
        self.queue_arguments: dict[str, Any] = dict(queue_arguments or {})
        #: The work queues are quorum queues: the only type whose deliveries RabbitMQ counts.
        self.quorum = is_quorum(self.queue_arguments)
        if self.quorum:
            check_quorum(self.queue_arguments, durable)
        self.message_properties = _properties(message_properties, durable)
        differs: dict[str, Any] = {}
        if delay:
            differs["delay"] = Delay.NATIVE
        if self.quorum:
            differs["counts_deliveries"] = True
        if differs:
            self.capabilities = dataclasses.replace(type(self).capabilities, **differs)
        #: Priority -> work queue name.
        self._queues: dict[int, str] = {DEFAULT_PRIORITY: queue}
        #: Delay queues this object declared, deleted by :meth:`teardown`.
        self._delay_queues: set[str] = set()
        self._where = _describe_parameters(parameters)
        self._publishers: PerProcess[_Publisher] = PerProcess(
            lambda: _Publisher(self._connect, confirm), close=_Publisher.drop
        )

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

    def _target(self, work: _QueueSpec, execute_at: float | None) -> _QueueSpec:
        if self.delay and execute_at is not None:
            ttl_ms = bucket_ms(execute_at - time.time())
            if ttl_ms > 0:
                return self._delay_queue(work, ttl_ms)
        return work

    # Sending -----------------------------------------------------------------

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        """Publish ``items`` to the queue of ``priority``; several in one transaction.

        With ``delay``, an item due later goes to the delay queue its
        ``execute_at`` picks; the body is never looked into.
        """
        work = self._work_queue(priority)
        targets = [(self._target(work, item.execute_at), item.body) for item in items]
        if targets:
            self._publish(targets, _Sending(targets))

    def _delay_again(self, body: bytes, priority: int, remaining_s: float, doing: str) -> None:
        """Publish ``body``, back from a delay queue too early, through a shorter one."""
        work = self._work_queue(priority)
        target = self._delay_queue(work, max(1, bucket_ms(remaining_s)))
        self._publish([(target, body)], doing)

    def _publish(self, items: Sequence[tuple[_QueueSpec, bytes]], doing: object) -> None:
        def publish(publisher: _Publisher) -> None:
            for spec in {spec.name: spec for spec, _ in items}.values():
                self._declare(publisher, spec)
            if len(items) == 1 or not self.confirm:
                for spec, body in items:
                    self._publish_one(publisher, spec, body)
            else:
                self._publish_transaction(publisher, items)

        self._with_publisher(publish, doing)

    def _with_publisher(self, action: Callable[[_Publisher], None], doing: object) -> None:
        """Run ``action`` on this process's publishing connection, under its lock.

        ``doing`` says what ``action`` does in log lines, as ``str()`` renders it.

        A connection that died while idle (a broker restart) is replaced and
        ``action`` runs once more; so does a publish to a queue
        that vanished after it was declared. Anything else raises pika's
        exception, which core translates by the declared errors.
        """
        publisher = self._publishers.get()
        with publisher.lock:
            for attempt in (1, 2):
                fresh = publisher.link()
                try:
                    if time.monotonic() - publisher.answered > _IDLE_CHECK_S:
                        # Reads what the broker sent meanwhile (heartbeats, a close),
                        # so a connection it dropped while idle is noticed before use.
                        publisher.connection.process_data_events(0)
                    action(publisher)
                    publisher.answered = time.monotonic()
                    return
                except pika_exc.UnroutableError:
                    if attempt == 2:
                        raise
                    logger.warning(
                        "%s: a queue was missing while %s; declaring it again", self._where, doing
                    )
                    publisher.declared.clear()
                except pika_exc.AMQPConnectionError as exc:
                    publisher.drop()
                    # A blocked broker (memory/disk alarm) would block the retry too;
                    # a heartbeat timeout is a broker gone silent under this very
                    # call, not a connection that died while idle, and a new
                    # connection would wait out its own time limit on it as well.
                    if (
                        fresh
                        or attempt == 2
                        or isinstance(
                            exc,
                            pika_exc.ConnectionBlockedTimeout | pika_exc.AMQPHeartbeatTimeout,
                        )
                    ):
                        raise
                    logger.warning(
                        "%s: the connection had closed (%s) before %s; using a new one",
                        self._where,
                        describe(exc),
                        doing,
                    )
                except (pika_exc.AMQPChannelError, ConfigurationError):
                    # A channel the broker closed (a declaration it refused among
                    # them) is unusable; start afresh next time.
                    publisher.drop()
                    raise

    def _publish_one(self, publisher: _Publisher, spec: _QueueSpec, body: bytes) -> None:
        """Publish ``body`` on the confirming channel, again if a starting quorum queue nacks it."""
        declared = publisher.declared.get(spec.name)
        while True:
            try:
                self._basic_publish(publisher.channel, spec, body)
                return
            except pika_exc.NackError:
                if declared is None or not is_quorum(spec.arguments):
                    raise
                since_s = time.monotonic() - declared
                if since_s >= STARTING_S:
                    raise
                logger.debug(
                    "%s: RabbitMQ nacked a publish to quorum queue %r declared %.3f s ago "
                    "(still starting); sending it again",
                    self._where,
                    spec.name,
                    since_s,
                )
            time.sleep(STARTING_RETRY_S)

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
        with declaring(self._where, f"declaring queue {spec.name!r}"):
            publisher.channel.queue_declare(
                spec.name, durable=self.durable, arguments=dict(spec.arguments)
            )
        publisher.declared[spec.name] = now
        if spec.dead_letters_to is not None:
            self._delay_queues.add(spec.name)

    def _connect(self) -> Any:
        try:
            return pika.BlockingConnection(self.parameters)
        except REFUSED_ERRORS as exc:
            user = getattr(self.parameters.credentials, "username", None)
            raise refusal(exc, self._where, user, self.parameters.virtual_host) from exc
        except pika_exc.AMQPError:
            raise  # the declared tuples say what it means
        except Exception as exc:
            error = connect_failure(exc, self._where)
            if error is None:
                raise
            raise error from exc

    def classify_error(self, exc: BaseException) -> type[DriverError] | None:
        return classify(exc) or super().classify_error(exc)

    # Receiving ---------------------------------------------------------------

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        """A consumer of ``priorities`` (all queues when empty); it connects on first receive."""
        order = self.check_priorities(self._queues, priorities)
        return RabbitMqConsumer(self, order, concurrency)

    # Counting and clearing ---------------------------------------------------

    def queue_stats(self) -> list[QueueStats]:
        """Counts from a passive ``queue_declare`` of each queue, on the publishing connection.

        * ready: the work queue's message count, which RabbitMQ gives for
          ready messages only (a queue not declared yet: 0).
        * in_flight: None. AMQP has no count of unacknowledged messages; only
          the management plugin's HTTP API has one.
        * scheduled: 0 without ``delay`` (a message is delivered at once).
          With it None: the delay queues of a work queue are one per delay
          bucket, up to 740, and AMQP can neither list queues nor ask about
          one that does not exist without the broker closing the channel
          and logging an error. A driver object knows only those it
          declared itself, which would give a number too low.
        * set_aside: the dead-letter queue's count, on the default priority's
          row (every work queue dead-letters into it), when
          ``x-dead-letter-routing-key`` names it through the default exchange
          (``x-dead-letter-exchange=""``); else None: the queues bound to a
          named exchange are not known to the driver.
        """
        rows = sorted(self._queues.items(), reverse=True)
        dead_letters = self._dead_letter_queue()
        names = [name for _, name in rows]
        if dead_letters is not None:
            names.append(dead_letters)
        counts: dict[str, int] = {}

        def count(publisher: _Publisher) -> None:
            counts.update(
                _on_each_queue(
                    publisher.connection,
                    names,
                    lambda channel, name: channel.queue_declare(name, passive=True),
                )
            )

        doing = f"counting the messages in {names}"
        self._with_publisher(count, doing)
        return [
            QueueStats(
                priority,
                name,
                ready=counts[name],
                scheduled=None if self.delay else 0,
                in_flight=None,
                set_aside=(
                    counts[dead_letters]
                    if dead_letters is not None and priority == DEFAULT_PRIORITY
                    else None
                ),
            )
            for priority, name in rows
        ]

    def purge(self, priority: int | None = None) -> int:
        """Delete the messages waiting for ``priority`` (every priority: None); how many.

        Deletes the work queue's delay queues, then purges the work queue
        (messages a worker holds unacknowledged stay: ``queue_purge`` leaves
        them). AMQP cannot list queues, so the delay queues are looked for
        under every name a delay bucket can have, whether or not ``delay``
        is on here (a sender may use it); RabbitMQ deletes one that does not
        exist without complaint. One that held messages is declared again at
        once, for senders that declared it a moment ago and would not again.
        """
        priorities = sorted(self._queues, reverse=True) if priority is None else [priority]
        works = [self._work_queue(p) for p in priorities]
        removed = 0

        def delete_and_purge(publisher: _Publisher) -> None:
            nonlocal removed
            for work in works:
                delayed = {
                    ttl_ms: publisher.channel.queue_delete(
                        delay_queue_name(work.name, ttl_ms)
                    ).method.message_count
                    for ttl_ms in EVERY_BUCKET_MS
                }
                publisher.declared.clear()
                removed += sum(delayed.values())
                for ttl_ms, count in delayed.items():
                    if count:
                        self._declare(publisher, self._delay_queue(work, ttl_ms))
                purged = _on_each_queue(
                    publisher.connection,
                    [work.name],
                    lambda channel, name: channel.queue_purge(name),
                )
                removed += purged[work.name]

        doing = f"purging {[work.name for work in works]} and their delay queues"
        self._with_publisher(delete_and_purge, doing)
        return removed

    def _dead_letter_queue(self) -> str | None:
        """The queue that rejected messages go to, when the queue arguments name one."""
        exchange = self.queue_arguments.get("x-dead-letter-exchange")
        routing_key = self.queue_arguments.get("x-dead-letter-routing-key")
        if exchange == "" and routing_key:
            return str(routing_key)
        return None

    # Cleaning up -------------------------------------------------------------

    def teardown(self) -> None:
        """Delete every work queue of this driver and the delay queues it declared."""
        names = [*self._queues.values(), *sorted(self._delay_queues)]

        def delete(publisher: _Publisher) -> None:
            for name in names:
                publisher.channel.queue_delete(name)
            publisher.declared.clear()
            self._delay_queues.difference_update(names)

        doing = f"deleting queues {names}"
        self._with_publisher(delete, doing)

    def close(self) -> None:
        """Close this process's publishing connection (a consumer closes its own). Idempotent."""
        publisher = self._publishers.peek()
        if publisher is not None:
            with publisher.lock:
                publisher.drop()

    def __repr__(self) -> str:
        return f"<LazyRabbitMqDriver {self._where} queue={self.queue!r}>"


def _on_each_queue(
    connection: Any, names: Sequence[str], operation: Callable[[Any, str], Any]
) -> dict[str, int]:
    """``operation(channel, name)`` on each queue, on a channel of its own: message counts.

    A queue that does not exist holds 0 messages. The broker closes the
    channel when it says so, so the next queue gets a new one; the
    publisher's channel is not the one closed.
    """
    counts: dict[str, int] = {}
    channel = connection.channel()
    try:
        for name in names:
            try:
                counts[name] = operation(channel, name).method.message_count
            except pika_exc.ChannelClosedByBroker as exc:
                if exc.reply_code != NOT_FOUND:
                    raise
                counts[name] = 0
                channel = connection.channel()
    finally:
        if channel.is_open:
            channel.close()
    return counts


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
