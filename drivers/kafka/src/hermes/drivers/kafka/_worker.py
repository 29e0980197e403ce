"""One ``KafkaDriver.wait()``: a consumer in the group from join to leave."""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as Record

from hermes.core import Callback, DriverError, Message, SerializeError
from hermes.drivers.kafka._offsets import OffsetLedger, Partition

if TYPE_CHECKING:
    from hermes.drivers.kafka._driver import KafkaDriver

logger = logging.getLogger("hermes.drivers.kafka")

#: The longest one poll blocks, so shutdown and max items are seen promptly.
POLL_INTERVAL_S = 0.5
#: Priority topics: how long a lower-priority record waits for higher-priority
#: partitions to report that they are read to the end.
PRIORITY_SETTLE_S = 2.0
#: Priority topics: records taken from the client's queue in one go.
_DRAIN_BATCH = 500


@dataclass(order=True)
class _Entry:
    """A record taken from the stream and not finished."""

    sort_key: tuple[float, ...]
    partition: Partition = field(compare=False)
    offset: int = field(compare=False)
    message: Message = field(compare=False)
    priority: int = field(compare=False)


class ConsumerLoop:
    """Subscribes, hands records to the callback and commits, until the driver says stop."""

    def __init__(self, driver: KafkaDriver, callback: Callback, topics: dict[str, int]) -> None:
        self.driver = driver
        self.callback = callback
        #: topic -> priority.
        self.topics = topics
        self.strict_priorities = len(topics) > 1
        self.highest = max(topics.values())
        self.ledger = OffsetLedger()
        #: Records to hand over now: highest priority first, then arrival order.
        self.ready: list[_Entry] = []
        #: Delayed records: earliest ``execute_at`` first.
        self.held: list[_Entry] = []
        self.held_count: dict[Partition, int] = {}
        self.paused: set[Partition] = set()
        #: Priority topics: partitions read to their end (no record known to be waiting).
        self.at_end: set[Partition] = set()
        self.assigned: set[Partition] = set()
        self.sequence = itertools.count()
        self.last_commit = time.monotonic()
        self.settle_deadline: float | None = None
        config = dict(driver.consumer_config)
        if self.strict_priorities:
            config["enable.partition.eof"] = True
        self.consumer = Consumer(config)

    # The loop -----------------------------------------------------------------

    def run(self) -> None:
        driver = self.driver
        self.consumer.subscribe(
            list(self.topics),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        try:
            while not driver.should_stop():
                if driver.fatal_error is not None:
                    # Raised once; the next wait() starts with fresh clients.
                    error, driver.fatal_error = driver.fatal_error, None
                    raise DriverError(
                        f"Kafka client failed for good: {error.str()}"
                    ) from KafkaException(error)
                self._release_due()
                entry = self._next_ready()
                if entry is not None:
                    self._deliver(entry)
                    continue
                self._poll(self._idle_timeout())
                self._commit_if_due()
        finally:
            self._leave()

    def _idle_timeout(self) -> float:
        if self.ready:
            return 0.05  # waiting for higher-priority partitions to report their end
        timeout = POLL_INTERVAL_S
        if self.held:
            timeout = min(timeout, max(0.0, self.held[0].sort_key[0] - time.time()))
        return timeout

    def _poll(self, timeout: float) -> None:
        record = self.consumer.poll(timeout)
        if record is None:
            return
        self._take(record)
        if self.strict_priorities:
            for record in self.consumer.consume(_DRAIN_BATCH, 0):
                self._take(record)

    def _leave(self) -> None:
        try:
            self._commit()
        except Exception:
            logger.exception("Kafka group %s: final commit failed", self.driver.group_id)
        try:
            self.consumer.close()
        except Exception:
            logger.exception("Kafka group %s: consumer close failed", self.driver.group_id)

    # Records ------------------------------------------------------------------

    def _take(self, record: Record) -> None:
        error = record.error()
        if error is not None:
            self._on_record_error(record, error)
            return
        topic, number, offset = record.topic(), record.partition(), record.offset()
        if topic is None or number is None or offset is None:
            raise DriverError(f"Kafka consumer returned a record without a position: {record!r}")
        partition: Partition = (topic, number)
        self.ledger.take(partition, offset)
        self.at_end.discard(partition)
        body = record.value()
        if body is None:
            self._set_aside(partition, offset, b"", "an empty record (no value)")
            return
        try:
            message = self.driver.serializer.unserialize(body)
        except SerializeError as exc:
            self._set_aside(partition, offset, body, str(exc))
            return
        priority = self.topics[topic]
        execute_at = message.execute_at
        if self.driver.delay and execute_at is not None and execute_at > time.time():
            entry = _Entry((execute_at, next(self.sequence)), partition, offset, message, priority)
            heapq.heappush(self.held, entry)
            held = self.held_count[partition] = self.held_count.get(partition, 0) + 1
            if held >= self.driver.max_held and partition not in self.paused:
                self.consumer.pause([TopicPartition(*partition)])
                self.paused.add(partition)
            return
        heapq.heappush(
            self.ready,
            _Entry((-priority, next(self.sequence)), partition, offset, message, priority),
        )

    def _release_due(self) -> None:
        now = time.time()
        while self.held and self.held[0].sort_key[0] <= now:
            entry = heapq.heappop(self.held)
            entry.sort_key = (-entry.priority, next(self.sequence))
            heapq.heappush(self.ready, entry)
            partition = entry.partition
            self.held_count[partition] -= 1
            if partition in self.paused and self.held_count[partition] < self.driver.max_held:
                self.consumer.resume([TopicPartition(*partition)])
                self.paused.discard(partition)

    def _next_ready(self) -> _Entry | None:
        if not self.ready:
            return None
        priority = self.ready[0].priority
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
        return heapq.heappop(self.ready)

    def _deliver(self, entry: _Entry) -> None:
        # An exception leaves the record open: never committed, so the group's
        # next consumer gets it again.
        self.callback(entry.message, entry.priority)
        self.driver.processed_items += 1
        self.ledger.finish(entry.partition, entry.offset)
        self._commit_if_due()

    def _set_aside(self, partition: Partition, offset: int, body: bytes, reason: str) -> None:
        topic, number = partition
        logger.error(
            "Kafka record %s[%d]@%d is not a Hermes message; set aside - %s",
            topic,
            number,
            offset,
            reason,
        )
        dead_letters = self.driver.dead_letter_topic
        if dead_letters:
            headers = [
                ("hermes-reason", reason.encode()),
                ("hermes-origin", f"{topic}[{number}]@{offset}".encode()),
            ]
            try:
                self.driver.produce(dead_letters, [body], headers=headers)
            except DriverError as exc:
                logger.error(
                    "Kafka record %s[%d]@%d not copied to dead-letter topic %s - %s",
                    topic,
                    number,
                    offset,
                    dead_letters,
                    exc,
                )
        self.ledger.finish(partition, offset)
        self._commit_if_due()

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

    # Commits ------------------------------------------------------------------

    def _commit_if_due(self) -> None:
        driver = self.driver
        finished = self.ledger.finished_since_commit
        if not finished:
            return
        if driver.commit_every and finished >= driver.commit_every:
            self._commit()
        elif (
            driver.commit_interval_s
            and time.monotonic() - self.last_commit >= driver.commit_interval_s
        ):
            self._commit()

    def _commit(self, partitions: list[Partition] | None = None) -> None:
        points = self.ledger.to_commit(partitions)
        self.last_commit = time.monotonic()
        if not points:
            self.ledger.mark_committed({})
            return
        offsets = [
            TopicPartition(topic, number, offset) for (topic, number), offset in points.items()
        ]
        try:
            results = self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError._NO_OFFSET:
                self.ledger.mark_committed(points)
                return
            # The records stay uncommitted: retried with the next commit, or
            # delivered again to the partition's next owner.
            logger.warning(
                "Kafka group %s: could not commit %s - %s",
                self.driver.group_id,
                _describe(points),
                error.str(),
            )
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
        self.ledger.mark_committed({k: v for k, v in points.items() if k not in failed})

    # Rebalances ---------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, assigned: list[TopicPartition]) -> None:
        partitions = _partitions(assigned)
        logger.debug("Kafka group %s: assigned %s", self.driver.group_id, partitions)
        self.assigned.update(partitions)

    def _on_revoke(self, consumer: Consumer, revoked: list[TopicPartition]) -> None:
        partitions = _partitions(revoked)
        logger.debug("Kafka group %s: revoked %s", self.driver.group_id, partitions)
        self._commit(partitions)
        self._drop(partitions)

    def _on_lost(self, consumer: Consumer, lost: list[TopicPartition]) -> None:
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
        self.ready = [entry for entry in self.ready if entry.partition not in gone]
        heapq.heapify(self.ready)
        self.held = [entry for entry in self.held if entry.partition not in gone]
        heapq.heapify(self.held)
        for partition in gone:
            self.held_count.pop(partition, None)
        self.paused -= gone
        self.at_end -= gone
        self.assigned -= gone
        self.ledger.forget(partitions)


def _partitions(topic_partitions: Iterable[TopicPartition]) -> list[Partition]:
    return [(tp.topic, tp.partition) for tp in topic_partitions]


def _describe(points: dict[Partition, int]) -> str:
    return ", ".join(f"{topic}[{number}]@{offset}" for (topic, number), offset in points.items())
