"""The receiving side of :class:`LazyRabbitMqDriver`: one consumer per worker run."""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from pika import exceptions as pika_exc

from hermes.core import DriverError
from hermes.core.driver import Consumer, Received
from hermes.core.drivertools import AckBatch, Handover, PerProcess
from hermes.drivers.rabbitmq._delay import DUE_TOLERANCE_S
from hermes.drivers.rabbitmq._errors import close_quietly, declaring, describe
from hermes.drivers.rabbitmq._quorum import delivery_count

if TYPE_CHECKING:
    from hermes.drivers.rabbitmq._driver import LazyRabbitMqDriver

T = TypeVar("T")

logger = logging.getLogger("hermes.drivers.rabbitmq")

# How a delivery is settled; the words go into log lines and errors.
_ACK = "acknowledging"
_REQUEUE = "requeueing"
_REJECT = "rejecting"


class _Tag(NamedTuple):
    """A :class:`Received`'s token: the channel it came on, its tag there, its queue."""

    channel: Any
    delivery_tag: int
    queue: str


class RabbitMqConsumer(Consumer):
    """One worker run's hold on RabbitMQ, on a connection of its own.

    * The first :meth:`receive` opens the connection and declares the queues,
      on the thread that calls it; after the session was lost it raises
      pika's exception (core makes it :class:`BrokerUnavailableError`), and
      the next call opens a new one.
    * One queue: consumed with the driver's ``prefetch``; :meth:`receive`
      hands out what pika delivered, one at a time, and waits on the socket
      only when nothing is left. Several queues: taken highest first, each
      from what it delivered or with ``basic_get``; while every one is empty
      they are consumed (one message each) so a new message wakes the worker
      at once, and the first one that arrives cancels those consumers.
      Deliveries that arrive together come out highest priority first.
    * On quorum work queues each :class:`Received` carries its
      ``delivery_count``, from the ``x-delivery-count`` header RabbitMQ
      puts on what it delivers again; on classic queues it is None.
    * With the driver's ``delay``, a message whose ``execute_at`` is not yet
      due goes back through a delay queue and is acknowledged here; core
      never sees it.
    * Acknowledgements are sent together: one ``basic_ack`` with
      ``multiple`` for every delivery up to a tag when none below it is still
      in a handler or undelivered (else one per tag). They go out once half
      the prefetch window is acknowledged, before the consumer waits on the
      socket, when one has waited a tenth of a second, and in :meth:`close`
      (core's :class:`~hermes.core.drivertools.AckBatch`).
      At prefetch 50 that is one frame per 25 messages instead of 25. A
      requeue or a reject goes out at once.
    * pika's connection is not thread-safe. The thread that last called
      :meth:`receive` (or :meth:`service` or :meth:`close`) owns it; :meth:`ack`,
      :meth:`release` and :meth:`reject` go through core's
      :class:`~hermes.core.drivertools.Handover`: on that thread they settle at
      once; from another thread they are queued for it and wake it
      (``connection.add_callback_threadsafe``), so it sends them from inside
      its wait on the socket, or before its next receive. A delivery from a
      connection since lost is not settled on the new one (its tag means
      nothing there): it is skipped with an INFO line, and RabbitMQ, which
      requeued it when the old connection closed, delivers it again.
    * While every handler thread of the worker runs a handler, core calls
      :meth:`service` a few times a second: it sends the acknowledgements
      that wait and lets pika read the socket and send its heartbeats, so a
      handler may run far longer than the connection's heartbeat timeout.
    * :meth:`close` (after the last receive) sends what other threads
      settled, requeues what was delivered but never handed out, and closes
      the connection. A delivery still held (its handler outlived the
      worker's grace period) is not requeued by this consumer: RabbitMQ
      gives it to another consumer once the connection is closed.
    """

    def __init__(self, driver: LazyRabbitMqDriver, order: list[int], concurrency: int = 1) -> None:
        self.driver = driver
        #: Unacknowledged deliveries the broker may push: enough for every handler thread.
        self.prefetch = max(driver.prefetch, concurrency)
        #: Priorities to read, highest first.
        self.order = order
        #: Priority -> queue name.
        self.queues = {priority: driver.priority_queues()[priority] for priority in order}
        self._where = driver._where
        self._wait_cap_s = driver.refresh_interval or math.inf
        self._sessions: PerProcess[_Session] = PerProcess(
            lambda: _Session(self), close=_Session.close
        )
        #: Settles made on handler threads, queued for the receiving thread.
        self._handover = Handover(driver, wake=self._wake)

    def receive(self, timeout_s: float) -> Received | None:
        deadline = time.monotonic() + min(timeout_s, self._wait_cap_s)
        # The worker may receive on another thread than last time: it owns pika's connection now.
        self._handover.claim()
        self._handover.run_pending(self._not_settled)
        session = self._session()
        while True:
            received = self._on_session(lambda: self._next(session, deadline))
            if received is not None and self.driver.delay:
                if self._delayed_again(session, received):
                    if time.monotonic() >= deadline:
                        return None
                    continue
            if received is not None:
                session.handed.add(received.token.delivery_tag)
            return received

    def _next(self, session: _Session, deadline: float) -> Received | None:
        if session.acks.due():
            session.send_acks()
        return session.next(deadline)

    def _on_session(self, call: Callable[[], T]) -> T:
        """``call()`` on this session's channel: an AMQP error there ends the session.

        Core says what the error means (a lost channel or connection: unavailable);
        either way the next receive opens another session. The publishing
        connection's errors (a message sent on through a delay queue) are not
        this session's, and leave it to the handlers it serves.
        """
        try:
            return call()
        except pika_exc.AMQPError:
            self._sessions.discard()
            raise

    def service(self) -> None:
        # The worker calls this while every handler thread runs a handler: pika
        # sends and answers heartbeats only from inside its calls.
        self._handover.claim()
        self._handover.run_pending(self._not_settled)
        session = self._sessions.peek()
        if session is None or session.lost is not None:
            return  # nothing to keep alive: the next receive connects
        try:
            session.send_acks()
            session.connection.process_data_events(time_limit=0)
        except pika_exc.AMQPError as exc:
            session.lost = exc
            raise

    def ack(self, received: Received) -> None:
        self._settle(received.token, _ACK)

    def release(self, received: Received) -> None:
        self._settle(received.token, _REQUEUE)

    def reject(self, received: Received, reason: str) -> None:
        # Without requeue: a dead-letter exchange on the queue keeps it.
        self._settle(received.token, _REJECT)

    def close(self) -> None:
        session = self._sessions.peek()
        errors: tuple[type[BaseException], ...] = (DriverError, *self.driver.broker_errors)
        try:
            self._handover.claim()
            self._handover.run_pending(self._not_settled)
            if session is not None and session.lost is None:
                session.give_back()
        except errors as exc:
            logger.info(
                "%s: %s; RabbitMQ requeues what this worker held as its connection closes",
                self._where,
                describe(exc),
            )
        finally:
            self._sessions.discard()

    # Sessions ----------------------------------------------------------------

    def _session(self) -> _Session:
        session = self._sessions.peek()
        if session is not None:
            if session.lost is None:
                return session
            self._sessions.discard()
        return self._sessions.get()

    def _delayed_again(self, session: _Session, received: Received) -> bool:
        """Send a message that is not yet due through a delay queue; True if it was."""
        # Decoded once: core reuses it. Poison (None) goes to core, which rejects it.
        message = received.decoded()
        if message is None or message.execute_at is None:
            return False
        remaining_s = message.execute_at - time.time()
        if remaining_s < DUE_TOLERANCE_S:
            return False
        tag: _Tag = received.token
        body = received.body.encode("utf-8") if isinstance(received.body, str) else received.body
        doing = f"delaying message #{message.id} by another {remaining_s:.3f} s"
        try:
            self.driver._delay_again(body, received.priority, remaining_s, doing)
        except Exception as exc:
            self._on_session(lambda: tag.channel.basic_nack(tag.delivery_tag, requeue=True))
            exc.add_note(doing)
            raise
        self._on_session(lambda: tag.channel.basic_ack(tag.delivery_tag))
        return True

    # Settling ----------------------------------------------------------------

    def _settle(self, tag: _Tag, how: str) -> None:
        self._handover.call(self._settle_now, tag, how)

    def _settle_now(self, tag: _Tag, how: str) -> None:
        """On the receiving thread: settle ``tag`` on its channel, unless that is gone."""
        session = self._sessions.peek()
        if session is None or tag.channel is not session.channel or session.lost is not None:
            self._skip_stale(tag, how)
            return
        try:
            session.handed.discard(tag.delivery_tag)
            if how is _ACK:
                session.ack(tag.delivery_tag)
            elif how is _REQUEUE:
                tag.channel.basic_nack(tag.delivery_tag, requeue=True)
            else:
                tag.channel.basic_reject(tag.delivery_tag, requeue=False)
        except pika_exc.AMQPError as exc:
            # Raised to core, or to the Handover running it for another thread: either
            # says what it means. This session is done with.
            session.lost = exc
            exc.add_note(f"{how} a message of queue {tag.queue!r}")
            raise

    def _wake(self) -> None:
        """From a handler thread: make the receiving thread run the settles queued for it."""
        session = self._sessions.peek()
        if session is None:
            return  # no wait to interrupt: the next receive or close runs them
        try:
            session.connection.add_callback_threadsafe(self._run_handed)
        except pika_exc.ConnectionWrongStateError as exc:
            # The connection closed: the queued settle is skipped as stale by the
            # next receive or close, and RabbitMQ delivers the message again.
            logger.debug("%s: could not wake the receiving thread - %s", self._where, describe(exc))

    def _run_handed(self) -> None:
        # Called back from inside pika's process_data_events: it must not raise
        # a DriverError, so failures are logged and the session marked lost.
        self._handover.run_pending(self._not_settled)
        # The receiving thread waits on the socket: what was acknowledged goes out now.
        session = self._sessions.peek()
        if session is not None and session.lost is None and session.acks:
            try:
                session.send_acks()
            except self.driver.broker_errors as exc:
                if isinstance(exc, pika_exc.AMQPError):
                    session.lost = exc
                self._not_settled(exc)

    def _not_settled(self, exc: BaseException) -> None:
        text = str(exc) if isinstance(exc, DriverError) else describe(exc)
        logger.warning("%s: %s; RabbitMQ delivers the message again", self._where, text)

    def _skip_stale(self, tag: _Tag, how: str) -> None:
        logger.info(
            "%s: skipped %s a message of queue %r: it came on a connection that is gone, "
            "and RabbitMQ delivers it again",
            self._where,
            how,
            tag.queue,
        )


class _Session:
    """A consumer's connection and channel, opened and used on one thread.

    Raises pika's exceptions; core translates them.
    """

    def __init__(self, consumer: RabbitMqConsumer) -> None:
        driver = consumer.driver
        self.order = consumer.order
        self.queues = consumer.queues
        self.single = len(self.order) == 1
        #: Delivered, not yet handed out: at most ``prefetch`` per queue.
        self.buffers: dict[int, deque[Received]] = {priority: deque() for priority in self.order}
        #: Tags of this channel's active consumers.
        self.consumers: list[str] = []
        self.consumer_tag = driver.consumer_tag
        #: Quorum queues: read each delivery's count from its headers.
        self.counts = driver.quorum
        self.cancelled_by_broker = False
        #: Why the session is unusable (a settle failed); the next receive opens a new one.
        self.lost: BaseException | None = None
        #: Tags handed out by ``receive`` and not settled yet (their handlers run).
        self.handed: set[int] = set()
        #: Tags acknowledged and not sent yet: sent once half the prefetch window waits.
        self.acks: AckBatch[int] = AckBatch(
            most=max(1, consumer.prefetch // 2) if len(self.order) == 1 else 1
        )
        self.connection = driver._connect()
        try:
            self.channel = self.connection.channel()
            self.channel.add_on_cancel_callback(self._on_cancel)
            for name in self.queues.values():
                with declaring(driver._where, f"declaring queue {name!r}"):
                    self.channel.queue_declare(
                        name, durable=driver.durable, arguments=dict(driver.queue_arguments)
                    )
            # Several queues are consumed only to wake up: one message each is enough.
            self.channel.basic_qos(prefetch_count=consumer.prefetch if self.single else 1)
            if self.single:
                self._consume()
        except BaseException:
            close_quietly(self.connection)
            raise

    def next(self, deadline: float) -> Received | None:
        """The next delivery, highest priority first; None once ``deadline`` passed."""
        if self.single:
            buffer = self.buffers[self.order[0]]
            while not buffer:
                if not self._wait(deadline):
                    return None
            return buffer.popleft()
        while True:
            if self.consumers:
                if not any(self.buffers.values()):
                    if not self._wait(deadline):
                        return None
                    continue
                # Something arrived: stop pushing (pika requeues what came
                # after), take the rest by priority with basic_get.
                self._cancel_consumers()
            for priority in self.order:
                buffer = self.buffers[priority]
                if buffer:
                    return buffer.popleft()
                name = self.queues[priority]
                method, properties, body = self.channel.basic_get(name)
                if method is not None:
                    tag = _Tag(self.channel, method.delivery_tag, name)
                    return self._received(body or b"", priority, tag, properties)
            self._consume()
            if time.monotonic() >= deadline:
                return None

    def ack(self, tag: int) -> None:
        """Acknowledge ``tag``: now, or with the next ones (see the consumer)."""
        self.acks.add(tag)
        if self.acks.due():
            self.send_acks()

    def send_acks(self) -> None:
        """Send the acknowledgements that wait: one frame for those below every open tag."""
        acks = self.acks.take()
        if not acks:
            return
        open_tags = [*self.handed, *(buffer[0].token.delivery_tag for buffer in
                                     self.buffers.values() if buffer)]  # fmt: skip
        lowest_open = min(open_tags, default=None)
        below = [tag for tag in acks if lowest_open is None or tag < lowest_open]
        if below:
            self.channel.basic_ack(max(below), multiple=True)
        for tag in acks:
            if lowest_open is not None and tag > lowest_open:
                self.channel.basic_ack(tag)

    def _wait(self, deadline: float) -> bool:
        """Read the socket until something is delivered or ``deadline``; False at the deadline."""
        self.send_acks()  # nothing is held back while the worker waits
        left = deadline - time.monotonic()
        self.connection.process_data_events(time_limit=max(0.0, left))
        if self.cancelled_by_broker:
            raise pika_exc.ConsumerCancelled(
                "RabbitMQ cancelled the consumer (was the queue deleted?)"
            )
        if not self.channel.is_open:
            raise pika_exc.ChannelWrongStateError("RabbitMQ closed the channel")
        return left > 0 or any(self.buffers.values())

    def _consume(self) -> None:
        for priority in self.order:
            name = self.queues[priority]
            tag = self.consumer_tag if self.single else f"{self.consumer_tag}.{priority}"
            self.channel.basic_consume(name, self._on_message(priority, name), consumer_tag=tag)
            self.consumers.append(tag)

    def _on_message(self, priority: int, name: str) -> Callable[[Any, Any, Any, bytes], None]:
        buffer, channel = self.buffers[priority], self.channel

        def on_message(_channel: Any, method: Any, properties: Any, body: bytes) -> None:
            tag = _Tag(channel, method.delivery_tag, name)
            buffer.append(self._received(body, priority, tag, properties))

        return on_message

    def _received(self, body: bytes, priority: int, tag: _Tag, properties: Any) -> Received:
        count = delivery_count(properties.headers) if self.counts else None
        return Received(body, priority, tag, delivery_count=count)

    def _on_cancel(self, _frame: Any) -> None:
        self.cancelled_by_broker = True

    def _cancel_consumers(self) -> None:
        for tag in self.consumers:
            self.channel.basic_cancel(tag)
        self.consumers.clear()

    def give_back(self) -> None:
        """Stop consuming and requeue what was delivered but never handed out.

        What was handed out and not settled is left alone: RabbitMQ requeues
        it when the connection closes, after this worker stopped touching it.
        """
        self.send_acks()
        self._cancel_consumers()
        for buffer in self.buffers.values():
            while buffer:
                self.channel.basic_nack(buffer.popleft().token.delivery_tag, requeue=True)

    def close(self) -> None:
        close_quietly(self.connection)
        for buffer in self.buffers.values():
            buffer.clear()
