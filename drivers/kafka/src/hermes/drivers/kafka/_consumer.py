"""The Kafka consumer: one worker run in the consumer group, one record at a time."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from confluent_kafka import Consumer as Client
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as Record

from hermes.core import BrokerUnavailableError, DriverError
from hermes.core.driver import Consumer, Received
from hermes.core.drivertools import error_text
from hermes.drivers.kafka._errors import classify, error_of, explained
from hermes.drivers.kafka._handles import destroy_unused
from hermes.drivers.kafka._offsets import OffsetLedger, Partition, PartitionState

if TYPE_CHECKING:
    from hermes.drivers.kafka._driver import KafkaDriver

logger = logging.getLogger("hermes.drivers.kafka")

#: Priority topics: how long a lower-priority record waits for higher-priority
#: partitions to report that they are read to the end.
PRIORITY_SETTLE_S = 2.0
#: Priority topics: records taken from the client's queue in one go.
_DRAIN_BATCH = 500
#: The longest one poll blocks: what handler threads settled meanwhile is
#: committed (or rewound) between polls, so at most this late.
SETTLE_INTERVAL_S = 0.1
#: While the broker does not answer commits: how often, and how long, to ask whether it is back.
#: librdkafka's default ``max.poll.interval.ms``: how long a rebalance waits for a member.
DEFAULT_MAX_POLL_INTERVAL_MS = 300_000
#: The share of ``max.poll.interval.ms`` a revoke waits for running handlers.
REVOKE_WAIT_SHARE = 0.8
#: How long leaving waits for a closed consumer's thread to leave the group.
_LEAVE_WAIT_S = 10.0
#: How long leaving the group first waits for a rebalance in progress to end.
_REJOIN_WAIT_S = 5.0
#: How often a revoke that waits for running handlers looks again.
_REVOKE_POLL_S = 0.05
_PROBE_INTERVAL_S = 1.0
_PROBE_TIMEOUT_S = 0.2


class _Position:
    """A :class:`Received`'s token: which record it is, taken by which session."""

    __slots__ = ("offset", "session", "state")

    def __init__(self, session: _Session, state: PartitionState, offset: int) -> None:
        self.session = session
        self.state = state
        self.offset = offset

    def __str__(self) -> str:
        topic, number = self.state.partition
        return f"{topic}[{number}]@{self.offset}"


class _KafkaConsumer(Consumer):
    """Reads the driver's topics as its group; commits finished offsets; rewinds to released ones.

    * ``receive`` polls (capped at ``timeout_s``) and hands out one record,
      highest-priority topic first among what it has buffered; with
      ``delay=True`` a record whose ``execute_at`` is ahead stays inside the
      consumer until due. The first ``receive`` creates missing topics and
      joins the group (a join takes seconds).
    * ``ack`` marks the record's offset finished. Commits cover, per
      partition, only the finished offsets below the oldest one still open
      (buffered, held or running), so records finishing out of order never
      commit past one that is not done.
    * ``release`` makes the record come again: its partition is sought back
      to its offset, and what this consumer took after it but had not handed
      out is dropped and read again behind it, in order. Records after it that
      are running or finished are skipped when read again, not handed out twice.
    * ``reject`` copies the record to ``dead_letter_topic`` (if set) and
      finishes it.
    * A partition taken away by a rebalance (another worker joined) waits,
      inside the revoke, for the records of it that are in handlers now --
      up to ``REVOKE_WAIT_SHARE`` of ``max.poll.interval.ms``, the time the
      group gives a member to rejoin -- and commits them before it goes, so
      its next owner does not run them a second time while they still run.
    * ``close`` commits what is finished and leaves the group. A record still
      in a handler then (it outlived the worker's grace period) holds its
      partition's commit point: it is neither committed nor sought back, and
      the consumer stays in the group, its partitions with it, until the
      driver closes, its next consumer joins, a rebalance takes that
      partition, or the process exits; the partition's next owner then reads
      it again. A consumer leaving while a
      rebalance is under way rejoins first, so the group is not left waiting.

    Threads: ``ack``, ``release`` and ``reject`` may be called from any
    thread; they only update the offset ledger, under its lock. Every call
    into the librdkafka consumer (poll, commit, seek, pause, the rebalance
    callbacks, close) is made by the thread calling ``receive`` and ``close``:
    a settle is applied at the start of the next ``receive``, or between its
    polls (every :data:`SETTLE_INTERVAL_S`) while it waits. Today's worker
    loop calls ``receive`` right after ``ack``, so each record is still
    committed (synchronously, by default) before the next one is taken. This
    is not core's :class:`~hermes.core.drivertools.Handover`, which queues calls:
    the ledger folds any number of settles into one commit per partition.

    Errors: librdkafka's own ``KafkaException`` is raised as it is, and core
    translates it by its code (:meth:`KafkaDriver.classify_error`).

    The librdkafka consumer is made per process (``PerProcess``): used after
    ``fork()``, a consumer joins the group afresh in the child.
    """

    def __init__(self, driver: KafkaDriver, topics: dict[str, int]) -> None:
        self.driver = driver
        #: topic -> priority.
        self.topics = topics
        self._sessions = driver.per_process(
            lambda: _Session(driver, topics, self._join_wait_s), _Session.close
        )
        #: How long the next session may wait for the broker before it subscribes.
        self._join_wait_s = 0.0
        self._closed = False

    def receive(self, timeout_s: float) -> Received | None:
        if self._closed:
            raise DriverError(f"{self.driver!r}: this consumer is closed")
        session = self._sessions.peek()
        if session is None:
            self.driver._leave_lingering()  # an earlier run's consumer, if one stayed
            self._join_wait_s = timeout_s
            session = self._sessions.get()
            self.driver.shed_idle_clients()
        return session.receive(timeout_s)

    def ack(self, received: Received) -> None:
        position: _Position = received.token
        position.session.finish(position, "acknowledged")

    def release(self, received: Received) -> None:
        position: _Position = received.token
        position.session.give_back(position)

    def reject(self, received: Received, reason: str) -> None:
        position: _Position = received.token
        position.session.set_aside(position, received.body, reason)

    def close(self) -> None:
        self._closed = True
        self._sessions.discard()
        destroy_unused()

    def __repr__(self) -> str:
        return f"<KafkaConsumer of {self.driver!r} topics={sorted(self.topics)}>"


class _Session:
    """One librdkafka consumer in the group, from joining to leaving, and what it took."""

    def __init__(self, driver: KafkaDriver, topics: dict[str, int], wait_s: float) -> None:
        self.driver = driver
        self.topics = topics
        self.strict_priorities = len(topics) > 1
        self.highest = max(topics.values())
        self.ledger = OffsetLedger()
        #: Records to hand out now: (-priority, sequence, received).
        self.ready: list[tuple[int, int, Received]] = []
        #: Delayed records: (execute_at, sequence, received), earliest first.
        self.held: list[tuple[float, int, Received]] = []
        self.held_count: dict[Partition, int] = {}
        self.paused: set[Partition] = set()
        #: Priority topics: partitions read to their end (no record known to be waiting).
        self.at_end: set[Partition] = set()
        self.assigned: set[Partition] = set()
        self.sequence = itertools.count()
        self.last_commit = time.monotonic()
        self.settle_deadline: float | None = None
        self.closed = False
        #: Closed with records in handlers: a thread keeps the consumer in the group,
        #: serving its rebalances, until :meth:`leave`.
        self._lingering: threading.Thread | None = None
        self._leaving = threading.Event()
        #: Between a revoke and the assignment that follows it.
        self._rebalancing = False
        #: The broker stopped answering commits: none is sent (a commit nobody
        #: answers blocks for the session timeout) until a bounded probe is answered.
        self.commits_unanswered = False
        self.last_probe = 0.0
        config = dict(driver.consumer_config)
        if self.strict_priorities:
            config["enable.partition.eof"] = True
        self._their_error_cb = config.get("error_cb")
        config["error_cb"] = self._on_client_error
        self.client = Client(config)
        try:
            # Missing topics are created before joining, waiting no longer than
            # ``wait_s`` (the receive's): a broker that does not answer is
            # unavailable. This consumer asks whether they exist.
            wanted = [*topics, driver.dead_letter_topic]
            driver.ensure_topics([topic for topic in wanted if topic], wait_s, self.client)
            self.client.subscribe(
                list(topics),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
        except BaseException:
            self.client.close()
            raise

    # Taking records (the receiving thread) --------------------------------------

    def receive(self, timeout_s: float) -> Received | None:
        # The common case (one record per call, nothing buffered) stays short:
        # every step below is skipped by one check when it has nothing to do.
        ledger, driver = self.ledger, self.driver
        deadline = time.monotonic() + timeout_s
        while True:
            if driver.fatal_error is not None:
                self._raise_fatal()
            if driver.unavailable_error is not None:
                error, driver.unavailable_error = driver.unavailable_error, None
                raise explained(error, f"Kafka {driver.bootstrap} is unreachable")
            if ledger.finished_since_commit or ledger.rewinds_due:
                self._apply_settles()
            if self.held:
                self._release_due()
            if self.ready:
                received = self._next_ready()
                if received is not None:
                    return received
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            received = self._poll(min(left, self._idle_timeout()))
            if received is not None:
                return received

    def _raise_fatal(self) -> None:
        driver = self.driver
        if driver.fatal_error is not None:
            # Raised once; the next worker run starts with a fresh consumer. Core
            # reads its code: refused credentials stop the worker for good.
            driver.raise_refused()
            error, driver.fatal_error = driver.fatal_error, None
            raise explained(error, "Kafka client failed for good")

    def _idle_timeout(self) -> float:
        if self.ready:
            return 0.05  # waiting for higher-priority partitions to report their end
        timeout = SETTLE_INTERVAL_S
        if self.held:
            timeout = min(timeout, max(0.0, self.held[0][0] - time.time()))
        return timeout

    def _poll(self, timeout_s: float) -> Received | None:
        """Poll once; a record to hand out now (nothing buffered before it), else None."""
        record = self.client.poll(timeout_s)
        if record is None:
            return None
        received = self._take(record)
        if not self.strict_priorities and not self.ready:
            return received
        if received is not None:
            self._queue(received)
        if self.strict_priorities:
            for record in self.client.consume(_DRAIN_BATCH, 0):
                received = self._take(record)
                if received is not None:
                    self._queue(received)
        return None

    def _queue(self, received: Received) -> None:
        heapq.heappush(self.ready, (-received.priority, next(self.sequence), received))

    def _take(self, record: Record) -> Received | None:
        """The record as a Received to hand out; None if it is held, skipped or not a record."""
        error = record.error()
        if error is not None:
            self._on_record_error(record, error)
            return None
        topic, number, offset = record.topic(), record.partition(), record.offset()
        if topic is None or number is None or offset is None:
            raise DriverError(f"Kafka consumer returned a record without a position: {record!r}")
        partition: Partition = (topic, number)
        state = self.ledger.take(partition, offset)
        if state is None:
            logger.debug("Kafka: %s[%d]@%d read again after a rewind; skipped", *partition, offset)
            return None
        if self.strict_priorities:
            self.at_end.discard(partition)
        body = record.value() or b""
        received = Received(body, self.topics[topic], _Position(self, state, offset))
        if self.driver.delay:
            # Decoded once, for core too; poison (None) is handed out now, and
            # core logs and rejects it.
            message = received.decoded()
            if message is not None and message.execute_at is not None:
                if message.execute_at > time.time():
                    self._hold(received, message.execute_at)
                    return None
        return received

    def _hold(self, received: Received, execute_at: float) -> None:
        heapq.heappush(self.held, (execute_at, next(self.sequence), received))
        partition = received.token.state.partition
        held = self.held_count[partition] = self.held_count.get(partition, 0) + 1
        if held >= self.driver.max_held and partition not in self.paused:
            self.client.pause([TopicPartition(*partition)])
            self.paused.add(partition)

    def _unhold(self, partition: Partition, count: int = 1) -> None:
        self.held_count[partition] -= count
        if partition in self.paused and self.held_count[partition] < self.driver.max_held:
            self.client.resume([TopicPartition(*partition)])
            self.paused.discard(partition)

    def _release_due(self) -> None:
        now = time.time()
        while self.held and self.held[0][0] <= now:
            _, _, received = heapq.heappop(self.held)
            self._queue(received)
            self._unhold(received.token.state.partition)

    def _next_ready(self) -> Received | None:
        if not self.ready:
            return None
        priority = -self.ready[0][0]
        if self.strict_priorities and priority < self.highest:
            waiting = [
                partition
                for partition in self.assigned
                if self.topics[partition[0]] > priority
                and partition not in self.at_end
                and partition not in self.paused
            ]
            if waiting:
                now = time.monotonic()
                if self.settle_deadline is None:
                    self.settle_deadline = now + PRIORITY_SETTLE_S
                if now < self.settle_deadline:
                    return None
                logger.debug("Kafka: %s did not report their end; going on", waiting)
        self.settle_deadline = None
        return heapq.heappop(self.ready)[2]

    def _on_record_error(self, record: Record, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            topic, number = record.topic(), record.partition()
            if topic is not None and number is not None:
                self.at_end.add((topic, number))
            return
        if error.fatal():
            raise DriverError(f"Kafka consumer failed for good: {error.str()}") from KafkaException(
                error
            )
        self.driver.log_client_error(error)

    # Settling (any thread) ------------------------------------------------------

    def finish(self, position: _Position, how: str) -> None:
        if self.closed:
            logger.warning(
                "Kafka group %s: %s %s after the consumer closed; not committed, "
                "so it is delivered again",
                self.driver.group_id,
                how,
                position,
            )
        elif not self.ledger.finish(position.state, position.offset):
            logger.info(
                "Kafka group %s: %s %s after its partition moved to another consumer, "
                "which delivers it again",
                self.driver.group_id,
                how,
                position,
            )

    def give_back(self, position: _Position) -> None:
        # Closed or moved: it was never committed, so the partition's next reader gets it.
        if not self.closed and self.ledger.give_back(position.state, position.offset):
            logger.debug("Kafka: released %s; its partition is rewound to it", position)

    def set_aside(self, position: _Position, body: str | bytes, reason: str) -> None:
        """Copy a record that is not a Hermes message to the dead-letter topic; finish it."""
        dead_letters = self.driver.dead_letter_topic
        where = "skipped"
        if dead_letters:
            data = body.encode() if isinstance(body, str) else body
            headers = [
                ("hermes-reason", reason.encode()),
                ("hermes-origin", str(position).encode()),
            ]
            errors: tuple[type[BaseException], ...] = (DriverError, *self.driver.broker_errors)
            try:
                self.driver.produce(dead_letters, [data], headers=headers)
                where = f"copied to dead-letter topic {dead_letters}"
            except errors as exc:
                # Handled here, not raised: a failed copy is logged, and the reject goes
                # on. Committed past all the same: a record that keeps failing must not
                # stop its partition. It stays in the topic, at the position logged.
                logger.error(
                    "Kafka record %s not copied to dead-letter topic %s - %s",
                    position,
                    dead_letters,
                    error_text(exc),
                )
        logger.warning("Kafka record %s set aside (%s) and committed past", position, where)
        self.finish(position, "set aside")

    # Applying settles (the receiving thread) ------------------------------------

    def _apply_settles(self) -> None:
        if self.ledger.rewinds_due:
            self._rewind()
        finished = self.ledger.finished_since_commit
        if not finished:
            return
        driver = self.driver
        if (driver.commit_every and finished >= driver.commit_every) or (
            driver.commit_interval_s
            and time.monotonic() - self.last_commit >= driver.commit_interval_s
        ):
            self._commit()

    def _rewind(self) -> None:
        for state, offset in self.ledger.pop_rewinds():
            partition = state.partition
            # What this consumer took after the released record but did not hand
            # out is read again behind it, so the partition keeps its order.
            dropped = [item for item in self.ready if _after(item, state, offset)]
            held = [item for item in self.held if _after(item, state, offset)]
            if dropped:
                self.ready = [item for item in self.ready if not _after(item, state, offset)]
                heapq.heapify(self.ready)
            if held:
                self.held = [item for item in self.held if not _after(item, state, offset)]
                heapq.heapify(self.held)
                self._unhold(partition, len(held))
            for _, _, received in [*dropped, *held]:
                self.ledger.give_back(state, received.token.offset, rewind=False)
            self.at_end.discard(partition)
            try:
                self.client.seek(TopicPartition(*partition, offset))
            except KafkaException as exc:
                logger.warning(
                    "Kafka: could not seek %s[%d] back to %d, tried again on the next receive - %s",
                    *partition,
                    offset,
                    error_of(exc).str(),
                )
                self.ledger.give_back(state, offset)

    def _commit(self, partitions: list[Partition] | None = None) -> None:
        finished = self.ledger.finished_since_commit
        points = self.ledger.to_commit(partitions)
        self.last_commit = time.monotonic()
        if not points:
            self.ledger.mark_committed({}, finished)
            return
        offsets = [
            TopicPartition(topic, number, offset) for (topic, number), offset in points.items()
        ]
        if self.commits_unanswered and not self._coordinator_answers(offsets):
            return  # kept: committed once the broker answers, or redelivered after a crash
        try:
            # librdkafka gives a synchronous commit no timeout: one the broker
            # cannot answer waits for the group coordinator up to
            # session.timeout.ms (45 s by default) before it fails.
            results = self.client.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = error_of(exc)
            if error.code() == KafkaError._NO_OFFSET:
                self.ledger.mark_committed(points, finished)
                return
            # The records stay uncommitted: retried with the next commit, or
            # delivered again to the partition's next owner.
            logger.warning(
                "Kafka group %s: could not commit %s - %s",
                self.driver.group_id,
                _describe(points),
                error.str(),
            )
            if classify(error) is BrokerUnavailableError:
                self._stop_waiting_for_commits(error.str())
            return
        failed = {
            (result.topic, result.partition) for result in results or () if result.error is not None
        }
        if failed:
            logger.warning(
                "Kafka group %s: could not commit %s",
                self.driver.group_id,
                ", ".join(f"{t}[{p}]" for t, p in sorted(failed)),
            )
        self.ledger.mark_committed({k: v for k, v in points.items() if k not in failed}, finished)

    def _stop_waiting_for_commits(self, why: str) -> None:
        if not self.commits_unanswered:
            self.commits_unanswered = True
            logger.warning(
                "Kafka group %s: the broker does not answer (%s); finished records are "
                "committed once it does",
                self.driver.group_id,
                why,
            )

    def _coordinator_answers(self, offsets: list[TopicPartition]) -> bool:
        """Ask, waiting briefly and at most once per probe interval, whether commits work again."""
        now = time.monotonic()
        if now - self.last_probe < _PROBE_INTERVAL_S:
            return False
        self.last_probe = now
        try:
            # Reads committed offsets from the group coordinator, which takes commits.
            self.client.committed(offsets[:1], timeout=_PROBE_TIMEOUT_S)
        except KafkaException as exc:
            logger.debug("Kafka group %s: still no answer - %s", self.driver.group_id, exc)
            return False
        self.commits_unanswered = False
        logger.info("Kafka group %s: the broker answers again; committing", self.driver.group_id)
        return True

    def _on_client_error(self, error: KafkaError) -> None:
        # Seen in a poll before the next commit: that commit need not wait for nobody.
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._stop_waiting_for_commits(error.str())
        if self._their_error_cb is not None:
            self._their_error_cb(error)

    def close(self) -> None:
        """Commit what is finished and leave the group; records still open go to the next owner.

        With records still in handlers, the group is left only by :meth:`leave`,
        which the driver calls when it closes (or not at all, the process exiting).
        """
        self.closed = True
        self.last_probe = 0.0  # one more chance to commit if the broker is back
        try:
            self._commit()
        except (KafkaException, RuntimeError) as exc:
            logger.warning("Kafka group %s: final commit failed - %s", self.driver.group_id, exc)
        if self.commits_unanswered and self.ledger.to_commit():
            logger.warning(
                "Kafka group %s: leaving while the broker does not answer; records finished "
                "since the last commit are delivered again",
                self.driver.group_id,
            )
        running = self._running(self.ledger.partitions())
        if running:
            logger.warning(
                "Kafka group %s: %d record(s) still in their handlers at close (%s); the "
                "consumer stays in the group (until the driver closes, its next consumer "
                "joins, a rebalance takes those partitions or this process exits), so no "
                "other worker takes them while they run; not committed, they are "
                "delivered again after that",
                self.driver.group_id,
                len(running),
                ", ".join(f"{topic}[{number}]@{offset}" for (topic, number), offset in running),
            )
            self._lingering = threading.Thread(
                target=self._linger, name="hermes-kafka-linger", daemon=True
            )
            self._lingering.start()
            self.driver._leave_later(self)
            return
        self._close_client()

    def leave(self) -> None:
        """Leave the group: this consumer's partitions go to the others."""
        self._leaving.set()
        if self._lingering is None:
            self._close_client()
        elif self._lingering is not threading.current_thread():
            self._lingering.join(_LEAVE_WAIT_S)

    def _linger(self) -> None:
        """Closed with records in handlers: stay in the group, take nothing, until :meth:`leave`.

        Polling serves the group: a rebalance meanwhile (another worker joining)
        gets its revoke, which waits for those handlers (:meth:`_wait_for_handlers`)
        instead of the whole group waiting for a member that never answers.
        What the poll brings is dropped, never committed: its next owner reads it.
        """
        try:
            # Once a rebalance took the partitions of those records (the revoke
            # forgets them), there is nothing left to hold: leave, and free the
            # partitions this consumer would otherwise keep taking nothing from.
            while not self._leaving.is_set() and self._running(self.ledger.partitions()):
                self.client.poll(SETTLE_INTERVAL_S)
        except (KafkaException, RuntimeError) as exc:
            logger.warning(
                "Kafka group %s: a closed consumer's poll failed - %s", self.driver.group_id, exc
            )
        finally:
            self._close_client()

    def _close_client(self) -> None:
        try:
            # A member that leaves between a revoke and the assignment after it can
            # leave the rest of the group waiting for it (seen on Tansu): rejoin
            # first. What these polls bring is dropped: never handed out or committed.
            deadline = time.monotonic() + _REJOIN_WAIT_S
            while self._rebalancing and time.monotonic() < deadline:
                self.client.poll(SETTLE_INTERVAL_S)
            self.client.close()
        except (KafkaException, RuntimeError) as exc:
            logger.warning(
                "Kafka group %s: leaving the group failed - %s", self.driver.group_id, exc
            )

    # Rebalances (called inside poll, so by the receiving thread) ----------------

    def _on_assign(self, client: Client, assigned: list[TopicPartition]) -> None:
        partitions = _partitions(assigned)
        logger.debug("Kafka group %s: assigned %s", self.driver.group_id, partitions)
        self.assigned.update(partitions)
        self._rebalancing = False

    def _on_revoke(self, client: Client, revoked: list[TopicPartition]) -> None:
        partitions = _partitions(revoked)
        logger.debug("Kafka group %s: revoked %s", self.driver.group_id, partitions)
        self._rebalancing = True
        if not self._leaving.is_set():
            self._wait_for_handlers(partitions)
        self._commit(partitions)
        self._drop(partitions)

    def _running(self, partitions: list[Partition]) -> list[tuple[Partition, int]]:
        """The records of ``partitions`` handed out and not settled: in handlers now."""
        buffered = {
            (received.token.state.partition, received.token.offset)
            for _, _, received in (*self.ready, *self.held)
        }
        return sorted(self.ledger.unsettled(partitions) - buffered)

    def _wait_for_handlers(self, partitions: list[Partition]) -> None:
        """Before revoked partitions go: let the handlers running their records finish.

        Settles only touch the ledger (under its lock), so a handler thread
        acknowledges while this thread waits here, inside the rebalance.
        """
        running = self._running(partitions)
        if not running:
            return
        interval_ms = self.driver.consumer_config.get(
            "max.poll.interval.ms", DEFAULT_MAX_POLL_INTERVAL_MS
        )
        wait_s = REVOKE_WAIT_SHARE * float(interval_ms) / 1000
        logger.info(
            "Kafka group %s: %s taken away while %d record(s) of them are in handlers; "
            "waiting up to %.0f s for those before letting the partitions go",
            self.driver.group_id,
            partitions,
            len(running),
            wait_s,
        )
        deadline = time.monotonic() + wait_s
        while running and time.monotonic() < deadline and not self._leaving.is_set():
            time.sleep(_REVOKE_POLL_S)
            running = self._running(partitions)
        if running and not self._leaving.is_set():
            logger.warning(
                "Kafka group %s: %d record(s) still in handlers after %.0f s; their partitions' "
                "next owner reads them again",
                self.driver.group_id,
                len(running),
                wait_s,
            )

    def _on_lost(self, client: Client, lost: list[TopicPartition]) -> None:
        partitions = _partitions(lost)
        logger.warning(
            "Kafka group %s: lost %s without a clean rebalance; "
            "their unfinished records go to the next owner",
            self.driver.group_id,
            partitions,
        )
        self._drop(partitions)

    def _drop(self, partitions: list[Partition]) -> None:
        gone = set(partitions)

        def kept(item: tuple[float, int, Received]) -> bool:
            return item[2].token.state.partition not in gone

        self.ready = [item for item in self.ready if kept(item)]
        heapq.heapify(self.ready)
        self.held = [item for item in self.held if kept(item)]
        heapq.heapify(self.held)
        for partition in gone:
            self.held_count.pop(partition, None)
        self.paused -= gone
        self.at_end -= gone
        self.assigned -= gone
        self.ledger.forget(partitions)


def _after(item: tuple[float, int, Received], state: PartitionState, offset: int) -> bool:
    """Whether a buffered record is of ``state``'s partition and after ``offset``."""
    position: _Position = item[2].token
    return position.state is state and position.offset > offset


def _partitions(topic_partitions: Iterable[TopicPartition]) -> list[Partition]:
    return [(tp.topic, tp.partition) for tp in topic_partitions]


def _describe(points: dict[Partition, int]) -> str:
    return ", ".join(f"{topic}[{number}]@{offset}" for (topic, number), offset in points.items())
