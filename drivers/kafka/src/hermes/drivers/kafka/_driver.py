"""KafkaDriver: Hermes messages as records of a Kafka topic, read by a consumer group."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import Consumer as Client
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

from hermes.core import (
    BrokerUnavailableError,
    ConfigurationError,
    DeliveryError,
    DriverError,
    NotSupportedError,
)
from hermes.core.driver import DEFAULT_PRIORITY, Consumer, Delay, Driver, Outgoing, QueueStats
from hermes.core.drivertools import PerProcess
from hermes.drivers.kafka import _settings
from hermes.drivers.kafka._capabilities import (
    CAPABILITIES,
    DEFAULT_FETCH_WAIT_MS,
    DEFAULT_SESSION_TIMEOUT_MS,
)
from hermes.drivers.kafka._consumer import _KafkaConsumer, _Session
from hermes.drivers.kafka._errors import (
    classify,
    error_of,
    explained,
    is_refusal,
    refused_certificate,
)
from hermes.drivers.kafka._handles import Handles, destroy_unused

T = TypeVar("T")

logger = logging.getLogger("hermes.drivers.kafka")

#: Legal Kafka topic names.
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: The longest topic creation and deletion may take (``send`` waits less if its own
#: deadline is shorter).
_ADMIN_TIMEOUT_S = 15.0
#: How often a wait for an admin request looks for a refusal reported meanwhile.
_ADMIN_SLICE_S = 0.1
#: Producer defaults Hermes picks; a user value for the setting or its alias wins.
_PRODUCER_DEFAULTS = (
    (("acks", "request.required.acks"), "all"),
    # An emit to a silent broker raises within about 11 s, not librdkafka's 5 min.
    (("message.timeout.ms", "delivery.timeout.ms"), 10_000),
    # Spread records without a key over the partitions one by one, not in
    # bursts, so competing workers share a burst of sends.
    (("sticky.partitioning.linger.ms",), 0),
)
#: Defaults for every client, a user value wins. A request unanswered for
#: ``socket.timeout.ms`` closes its connection (librdkafka: 60 s); a connection
#: not set up within ``socket.connection.setup.timeout.ms`` is given up
#: (librdkafka: 30 s). These bound how long a silent broker goes unnoticed.
_CLIENT_DEFAULTS = (
    ("socket.timeout.ms", 6_000),
    ("socket.connection.setup.timeout.ms", 5_000),
)
#: Where librdkafka's own log lines go (instead of stderr).
_client_logger = logging.getLogger("hermes.drivers.kafka.librdkafka")
#: The same client error is logged as a warning at most once per this many seconds.
_REPEAT_LOG_INTERVAL_S = 30.0


class _DeliveryReport:
    """Collects the delivery reports of one ``produce``.

    Each record carries its own report object as ``on_delivery``, so a report
    reaches the right object whichever thread's ``poll()`` serves it; several
    threads may serve reports of the same object at once.
    """

    def __init__(self, expected: int) -> None:
        self.expected = expected
        #: One entry per report: None for delivered, the KafkaError otherwise.
        self.results: list[KafkaError | None] = []
        #: Set once ``expected`` reports arrived.
        self.done = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, error: KafkaError | None, record: object) -> None:
        with self._lock:
            self.results.append(error)
            if len(self.results) >= self.expected:
                self.done.set()


def _found(probe: Client, topics: Sequence[str], timeout_s: float) -> set[str]:
    """Those of ``topics`` whose first partition ``probe`` finds on the broker.

    Asked for watermarks, not with ``list_topics``: confluent-kafka builds topic
    metadata with its admin module, which a worker otherwise never loads. A
    broker that does not answer in time is left to the admin client's request
    that follows, which says why.
    """
    deadline = time.monotonic() + timeout_s
    found: set[str] = set()
    for topic in topics:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=left)
        except KafkaException as exc:
            logger.debug("Kafka: looking for topic %r failed - %s", topic, exc)
            if error_of(exc).code() == KafkaError._TIMED_OUT:
                break
            continue
        found.add(topic)
    return found


def _check_topic(name: str, what: str) -> str:
    if not isinstance(name, str) or not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigurationError(
            f"{what} {name!r} is not a Kafka topic name: use 1-249 of [A-Za-z0-9._-]"
        )
    return name


class KafkaDriver(Driver):
    """Messages are records of ``topic``; workers share them as consumer group ``group_id``.

    ``config`` is librdkafka's (``bootstrap.servers`` at least); each setting
    goes to the producer, the consumer or both, by librdkafka's own scopes,
    and librdkafka's log lines go to the ``hermes.drivers.kafka.librdkafka``
    logger. Hermes sets ``acks=all``, ``message.timeout.ms=30000`` and
    ``sticky.partitioning.linger.ms=0`` unless given, ``enable.auto.commit=false``
    always, and ``auto.offset.reset=earliest`` unless given (a new group starts
    at the oldest record). Missing topics are created with ``partitions``
    partitions and the broker's default replication before the first send or
    receive (``create_topics=False``: never; existing topics are not altered).

    * ``put`` produces one record per item (value = the body core
      serialized, no key, so records spread over the partitions) and returns
      once the broker acknowledged every one, waiting once for all; a
      refusal raises :class:`DeliveryError`, no answer within
      ``message.timeout.ms`` or an unreachable broker at topic creation
      :class:`BrokerUnavailableError`, refused SASL credentials or ACLs
      :class:`BrokerRefusedError`. Thread-safe; a driver created before
      ``fork()`` builds new clients in the child.
    * The worker's consumer (:meth:`consumer`) joins ``group_id`` on
      its first receive (a group join: seconds, see ``session.timeout.ms``)
      and hands out one record at a time; after the callback, the record's
      offset is committed, synchronously: ``commit_every=N`` commits after
      every N records, ``commit_interval_s=T`` at least every T seconds
      (``commit_every=0`` with T: by time only); both trade redelivery after
      a crash for speed. A commit never passes a record still open, however
      records finish. Finished records are committed before a rebalance
      takes their partitions away and when the worker stops; then the
      consumer leaves the group.
    * A callback that raises releases its record: the partition is sought
      back to it, and it stays uncommitted, so the next consumer of the group
      (this worker's next ``wait`` or another worker) gets it.
    * Competing consumers: Kafka gives each partition to one member of the
      group, so at most ``partitions`` workers of a group get work.
    * A record that is not a Hermes message (the worker logs why) is logged
      with its topic, partition and offset, produced to ``dead_letter_topic``
      if one is set, and committed past.
    * ``delay=True``: a record whose ``execute_at`` is in the future is held
      in memory, uncommitted, until due; later records keep flowing, and held
      ones are delivered in ``execute_at`` order. At most ``max_held`` records
      per partition are held; beyond that the partition is paused until some
      fall due. A crash redelivers from the oldest held record on.
    * ``priority_topics=True``: ``setup_priority_queue(name, p)`` adds topic
      ``<topic>.<name>``; a worker reads the topics highest priority first (a
      lower-priority record waits until the higher topics' partitions report
      their end, at most 2 s).
    """

    capabilities = CAPABILITIES
    #: Every confluent-kafka error is a ``KafkaException``; :meth:`classify_error`
    #: reads its code (refused, unavailable, or else a failure).
    client_errors = (KafkaException,)

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        group_id: str = "hermes",
        *,
        commit_every: int = 1,
        commit_interval_s: float = 0.0,
        delay: bool = False,
        dead_letter_topic: str | None = None,
        priority_topics: bool = False,
        partitions: int = 3,
        max_held: int = 1000,
        create_topics: bool = True,
    ) -> None:
        config = dict(config)
        if not (config.get("bootstrap.servers") or config.get("metadata.broker.list")):
            raise ConfigurationError(
                "KafkaDriver needs config['bootstrap.servers'], e.g. 'localhost:9092'"
            )
        for key, why in _settings.RESERVED.items():
            if key in config:
                raise ConfigurationError(f"KafkaDriver sets {key!r} itself: {why}")
        if not isinstance(group_id, str) or not group_id:
            raise ConfigurationError(f"group_id must be a non-empty string, got {group_id!r}")
        if commit_every < 0 or commit_interval_s < 0:
            raise ConfigurationError(
                f"commit_every ({commit_every}) and commit_interval_s ({commit_interval_s}) "
                "must be >= 0"
            )
        if commit_every == 0 and commit_interval_s == 0:
            raise ConfigurationError(
                "commit_every=0 commits by time only: give commit_interval_s > 0 too"
            )
        if partitions < 1 or max_held < 1:
            raise ConfigurationError(
                f"partitions ({partitions}) and max_held ({max_held}) must be >= 1"
            )
        #: The topic of the default priority.
        self.topic = _check_topic(topic, "topic")
        self.group_id = group_id
        self.dead_letter_topic = (
            _check_topic(dead_letter_topic, "dead_letter_topic") if dead_letter_topic else None
        )
        self.commit_every = commit_every
        self.commit_interval_s = float(commit_interval_s)
        self.delay = delay
        self.priority_topics = priority_topics
        #: Partitions of a topic the driver creates.
        self.partitions = partitions
        self.max_held = max_held
        #: Create missing topics (``partitions`` each) before the first send or receive.
        self.create_topics = create_topics
        #: priority -> topic.
        self.topics: dict[int, str] = {DEFAULT_PRIORITY: self.topic}
        self.bootstrap = str(config.get("bootstrap.servers") or config["metadata.broker.list"])

        #: Whether the settings hold any only a producer reads: if so, the producer is
        #: made at ``connect()`` so librdkafka checks them there.
        self._producer_settings = any(key in _settings.PRODUCER_ONLY for key in config)
        config = {**dict(_CLIENT_DEFAULTS), **config}
        producer, consumer = _settings.split(config)
        for names, value in _PRODUCER_DEFAULTS:
            if not any(name in producer for name in names):
                producer[names[0]] = value
        consumer.setdefault("auto.offset.reset", "earliest")
        consumer.update({"group.id": group_id, "enable.auto.commit": False})
        admin = _settings.admin(config)
        for settings in (producer, consumer, admin):
            settings.setdefault("error_cb", self.log_client_error)
            settings.setdefault("logger", _client_logger)
        self.producer_config = producer
        self.consumer_config = consumer
        self.admin_config = admin
        #: A fatal client error, or a refusal (SASL, ACL), seen by ``error_cb``: the
        #: consumer's ``receive`` raises it, and so does a wait for the broker.
        self.fatal_error: KafkaError | None = None
        #: The last "broker not there" error ``error_cb`` saw since the consumer's
        #: last receive: librdkafka reconnects by itself and never raises it, so
        #: the receive does, once, and the worker logs the outage and backs off.
        self.unavailable_error: KafkaError | None = None
        #: Client error text -> when it was last logged as a warning.
        self._client_errors_logged: dict[str, float] = {}
        self._handles = Handles()
        self._producers = self.per_process(lambda: Producer(self.producer_config))
        self._admins = self.per_process(self._new_admin)
        #: Whether this process's producer has sent anything (a worker that never
        #: retries lets it go once its consumer runs; see :meth:`shed_idle_clients`).
        self._produced = False
        #: Topics known to exist (created or found).
        self.ready_topics: set[str] = set()
        #: (pid, consumer session) closed with records still in handlers: they leave
        #: the group when this driver closes.
        self._lingering: list[tuple[int, _Session]] = []
        self._closed = False
        self._check_config()
        # librdkafka accepted the settings, so the numbers below are numbers.
        timeout_ms = producer.get("message.timeout.ms", producer.get("delivery.timeout.ms"))
        #: How long ``put`` waits for the broker before it gives up (unavailable).
        self.send_timeout_s = float(timeout_ms or 300_000) / 1000 + 1.0
        self.admin_timeout_s = min(_ADMIN_TIMEOUT_S, self.send_timeout_s)
        session_ms = float(consumer.get("session.timeout.ms", DEFAULT_SESSION_TIMEOUT_MS))
        fetch_wait_ms = float(consumer.get("fetch.wait.max.ms", DEFAULT_FETCH_WAIT_MS))
        self.capabilities = replace(
            type(self).capabilities,
            delay=Delay.NATIVE if delay else Delay.IGNORED,
            priorities=priority_topics,
            redelivery_timeout_s=2 * session_ms / 1000 + 2,
            wake_up_s=fetch_wait_ms / 1000,
        )

    def _check_config(self) -> None:
        """Let librdkafka reject bad settings now, at ``connect()``.

        The consumer's settings hold every shared one; the producer is made here
        only for settings of its own. Otherwise the first send makes it: a worker
        that never retries never does, and a librdkafka client made and let go
        leaves its threads' memory behind.
        """
        try:
            Client(self.consumer_config).close()
        except KafkaException as exc:
            raise ConfigurationError(
                f"librdkafka rejects the Kafka consumer settings: {error_of(exc).str()}"
            ) from exc
        if not self._producer_settings:
            return
        try:
            self._producers.get()
        except KafkaException as exc:
            raise ConfigurationError(
                f"librdkafka rejects the Kafka producer settings: {error_of(exc).str()}"
            ) from exc

    def log_client_error(self, error: KafkaError) -> None:
        """Every client's ``error_cb``: log it (repeats quietly); remember a fatal one or a refusal.

        librdkafka reports refused credentials and a broker certificate that
        does not verify here only, and keeps trying: remembered, they end the
        wait of the next receive or send instead.
        """
        if error.fatal() or is_refusal(error):
            if self.fatal_error is None:
                logger.error("Kafka %s: %s", self.bootstrap, error.str())
            self.fatal_error = error
            return
        if classify(error) is BrokerUnavailableError:
            self.unavailable_error = error
        # librdkafka reconnects by itself, with backoff, and reports every
        # failed attempt: the same complaint is logged once per interval.
        text, now = error.str(), time.monotonic()
        logged = self._client_errors_logged
        if now - logged.get(text, -_REPEAT_LOG_INTERVAL_S) < _REPEAT_LOG_INTERVAL_S:
            logger.debug("Kafka %s: %s", self.bootstrap, text)
            return
        if len(logged) > 100:
            logged.clear()
        logged[text] = now
        logger.warning("Kafka %s: %s", self.bootstrap, text)

    # Clients ------------------------------------------------------------------

    def per_process(
        self, make: Callable[[], T], close: Callable[[T], None] | None = None
    ) -> PerProcess[T]:
        """A :class:`~hermes.core.drivertools.PerProcess` holder for one of its
        librdkafka handles."""
        return self._handles.per_process(make, close)

    def classify_error(self, exc: BaseException) -> type[DriverError] | None:
        if isinstance(exc, KafkaException):
            return classify(error_of(exc))
        return super().classify_error(exc)

    def raise_refused(self) -> None:
        """Raise the refusal ``error_cb`` saw (credentials, an ACL, a certificate), if any, once."""
        error = self.fatal_error
        if error is not None and is_refusal(error):
            # Forgotten once raised: librdkafka reports it again while it lasts,
            # and a login the broker takes later is not refused for ever.
            self.fatal_error = None
            if refused_certificate(error):
                text = f"Kafka {self.bootstrap}"  # what to change: CertificateRefusedError's
            else:
                text = (
                    f"Kafka {self.bootstrap} refused this client: check sasl.username / "
                    "sasl.password (the URL's user:password), sasl.mechanism and the ACLs"
                )
            raise explained(error, text)

    def _producer(self) -> Producer:
        if self._closed:
            raise DriverError(f"{self!r} is closed")
        return self._producers.get()

    def _admin(self) -> AdminClient:
        return self._admins.get()

    def _new_admin(self) -> AdminClient:
        # Imported here: confluent_kafka.admin costs a worker 0.4 MB it needs only
        # to create topics before the first receive.
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.admin_config)

    def shed_idle_clients(self) -> None:
        """Let go of the admin client, and of the producer if it never sent anything.

        A worker's consumer calls it once it has joined: each librdkafka client
        holds its own threads and buffers (0.4 MB or so), and a worker needs the
        producer only for a retry or a dead letter, when it is made again.
        """
        self._admins.discard()
        if not self._produced:
            self._producers.discard()
        destroy_unused()

    def ensure_topics(
        self, topics: Sequence[str], timeout_s: float | None = None, probe: Client | None = None
    ) -> None:
        """Create those of ``topics`` that do not exist yet (``partitions`` each).

        Waits at most ``timeout_s`` (default ``admin_timeout_s``) for the broker;
        no answer by then raises :class:`BrokerUnavailableError`. ``probe``: a
        consumer not yet subscribed, which asks the broker for the topics
        instead of the producer (a worker then makes no producer).
        """
        missing = [topic for topic in dict.fromkeys(topics) if topic not in self.ready_topics]
        if not missing or not self.create_topics:
            return
        wait_s = self.admin_timeout_s if timeout_s is None else min(timeout_s, self.admin_timeout_s)
        deadline = time.monotonic() + wait_s
        # Most workers start on topics that exist: the broker says so in a round
        # trip, and the admin client (and its module) is never made.
        half = wait_s / 2  # the rest for the admin client, if need be
        listed = self._listed_topics(half) if probe is None else _found(probe, missing, half)
        self.ready_topics.update(topic for topic in missing if topic in listed)
        missing = [topic for topic in missing if topic not in listed]
        if not missing:
            return
        from confluent_kafka.cimpl import NewTopic  # what confluent_kafka.admin re-exports

        admin = self._admin()
        new = [NewTopic(topic, num_partitions=self.partitions) for topic in missing]
        futures = admin.create_topics(new, request_timeout=self.admin_timeout_s)
        refused: dict[str, KafkaException] = {}
        for topic, future in futures.items():
            what = f"the creation of topic {topic!r}"
            error = self._settle(future, what, max(0.0, deadline - time.monotonic()))
            if error is None or error_of(error).code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            if self.classify_error(error) is BrokerUnavailableError:
                raise error
            refused[topic] = error
        if refused:
            # Not allowed to create topics is fine when they exist already.
            existing = self._existing_topics(admin, max(0.1, deadline - time.monotonic()))
            for topic, refusal in refused.items():
                if topic not in existing:
                    raise explained(
                        error_of(refusal),
                        f"Kafka {self.bootstrap} has no topic {topic!r} and refused to create it",
                    ) from refusal
        self.ready_topics.update(missing)

    def _settle(
        self, future: Future[Any], what: str, timeout_s: float | None = None
    ) -> KafkaException | None:
        """Wait for an admin request: its refusal, or None when it succeeded.

        Refused credentials look like silence to an admin request: librdkafka
        reports them only to ``error_cb``, which the admin client serves in
        ``poll``. So the wait is cut in slices, polling between them.
        """
        timeout_s = self.admin_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                future.result(timeout=max(0.0, min(left, _ADMIN_SLICE_S)))
            except KafkaException as exc:
                return exc
            except TimeoutError as exc:
                self._admin().poll(0)
                self.raise_refused()
                if time.monotonic() < deadline:
                    continue
                raise BrokerUnavailableError(
                    f"Kafka {self.bootstrap} did not answer {what} within {timeout_s:.1f} s"
                ) from exc
            return None

    def _listed_topics(self, timeout_s: float) -> set[str]:
        """The topics the broker lists to the producer; none when it does not answer in time.

        A broker that does not answer, or refuses this client, is left to the
        admin client's request that follows, which says which it is.
        """
        try:
            return set(self._producer().list_topics(timeout=timeout_s).topics)
        except KafkaException as exc:
            logger.debug("Kafka %s: listing the topics failed - %s", self.bootstrap, exc)
            return set()

    def _existing_topics(self, admin: AdminClient, timeout_s: float) -> set[str]:
        return set(admin.list_topics(timeout=timeout_s).topics)

    # Sending ------------------------------------------------------------------

    def topic_for(self, priority: int) -> str:
        """The topic of ``priority``; :class:`UnknownPriorityError` if there is none."""
        topic = self.topics.get(priority)
        if topic is None:
            if self.priority_topics:
                raise self.unknown_priority(priority, self.topics)
            raise self.unknown_priority(
                priority, self.topics, "this driver has no priority topics (priority_topics=true)"
            )
        return topic

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        """Produce every item to the topic of ``priority``, then wait once for all reports.

        ``execute_at`` stays in the body: in delay mode the consumer holds the record.
        """
        topic = self.topic_for(priority)
        self.produce(topic, [item.body for item in items])

    def produce(
        self,
        topic: str,
        bodies: Sequence[bytes],
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> None:
        """Produce ``bodies`` to ``topic`` and wait until the broker took every one.

        Raises a ``KafkaException`` (core translates it by its code) if the
        broker refused any or did not confirm within ``send_timeout_s``, and
        :class:`DeliveryError` if librdkafka's own queue stayed full.
        """
        if not bodies:
            return
        self.ensure_topics([topic])
        producer = self._producer()
        self._produced = True
        report = _DeliveryReport(len(bodies))
        deadline = time.monotonic() + self.send_timeout_s
        for index, body in enumerate(bodies):
            while True:
                try:
                    producer.produce(topic, body, headers=list(headers or ()), on_delivery=report)
                    break
                except BufferError as exc:
                    # librdkafka's local queue is full: serve reports to make room.
                    if time.monotonic() > deadline:
                        raise DeliveryError(
                            f"Kafka producer queue stayed full; {index} of {len(bodies)} "
                            f"message(s) for topic {topic!r} were handed over"
                        ) from exc
                    producer.poll(0.1)
                except KafkaException as exc:
                    raise explained(
                        error_of(exc),
                        f"producing to topic {topic!r} "
                        f"({index} of {len(bodies)} message(s) handed over before)",
                    ) from exc
        # Wakes the broker threads to send now rather than after linger.ms
        # (best effort); returns at once.
        producer.flush(0)
        while not report.done.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.raise_refused()
                missing = len(bodies) - len(report.results)
                raise KafkaException(
                    KafkaError(
                        KafkaError._MSG_TIMED_OUT,
                        f"Kafka {self.bootstrap} did not confirm {missing} message(s) for "
                        f"topic {topic!r} within {self.send_timeout_s:.0f} s",
                    )
                )
            # poll(), not flush(): flush waits for every thread's records in the
            # shared producer; poll serves whatever reports are ready, this
            # send's or another's, and returns. It serves error_cb too, where a
            # refused login is reported.
            producer.poll(min(remaining, 0.05))
            self.raise_refused()
        errors = [error for error in report.results if error is not None]
        if errors:
            if any(error.fatal() for error in errors):
                self._drop_producer(producer)
            raise explained(
                errors[0],
                f"Kafka did not store {len(errors)} of {len(bodies)} message(s) "
                f"for topic {topic!r}",
            )

    def _drop_producer(self, producer: Producer) -> None:
        if self._producers.peek() is producer:
            self._producers.discard()

    # Priorities ---------------------------------------------------------------

    def setup_priority_queue(self, name: str, priority: int) -> None:
        """Add topic ``<topic>.<name>`` for ``priority`` (needs ``priority_topics=True``)."""
        if not self.priority_topics:
            raise NotSupportedError(
                f"{self!r} has no priority queues; pass priority_topics=True "
                "(priority_topics=true in the URL) for a topic per priority"
            )
        topic = self.topic if priority == DEFAULT_PRIORITY else f"{self.topic}.{name}"
        self.topics[priority] = _check_topic(topic, "priority topic")

    # Consuming ----------------------------------------------------------------

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        """A consumer of the topics of ``priorities`` (all when empty), as group ``group_id``.

        No broker I/O here: the first ``receive`` creates missing topics and joins the group.
        """
        if self._closed:
            raise DriverError(f"{self!r} is closed")
        order = self.check_priorities(self.topics, priorities)
        return _KafkaConsumer(self, {self.topics[priority]: priority for priority in order})

    # Counting and purging -------------------------------------------------------

    def queue_stats(self) -> list[QueueStats]:
        """Per priority topic: ready is the group's lag, summed over the topic's partitions.

        The lag (records past the group's committed offset) includes records a
        worker holds and has not committed, so in flight is unknown; so is
        scheduled in delay mode (held in the workers' memory, not on the broker).
        Set aside is the dead-letter topic's size, on the default priority's row.
        """
        with self._inspector() as client:
            rows = []
            for priority in sorted(self.topics, reverse=True):
                topic = self.topics[priority]
                lag = sum(high - offset for _, offset, high in self._positions(client, topic))
                dead = None
                if priority == DEFAULT_PRIORITY and self.dead_letter_topic:
                    spans = self._positions(client, self.dead_letter_topic, committed=False)
                    dead = sum(high - low for _, low, high in spans)
                rows.append(
                    QueueStats(
                        priority,
                        topic,
                        ready=lag,
                        scheduled=None if self.delay else 0,
                        in_flight=None,
                        set_aside=dead,
                    )
                )
            return rows

    def purge(self, priority: int | None = None) -> int:
        """Move the group's committed offsets to the end of the topic(s); how many it skipped.

        Kafka cannot delete single records: the group skips them instead. A group
        with running workers refuses offsets committed from outside it: stop the
        workers first.
        """
        if priority is not None and priority not in self.topics:
            raise self.unknown_priority(priority, self.topics)
        topics = [self.topics[priority]] if priority is not None else [*self.topics.values()]
        skipped = 0
        with self._inspector() as client:
            ends = []
            for topic in dict.fromkeys(topics):
                for partition, offset, high in self._positions(client, topic):
                    skipped += high - offset
                    ends.append(TopicPartition(topic, partition, high))
            if ends and skipped:
                client.commit(offsets=ends, asynchronous=False)
        return skipped

    @contextlib.contextmanager
    def _inspector(self) -> Iterator[Client]:
        """A consumer of the group that never joins it: it only reads and commits offsets."""
        client = Client({**self.consumer_config, "enable.auto.commit": False})
        try:
            yield client
        finally:
            client.close()

    def _positions(
        self, client: Client, topic: str, *, committed: bool = True
    ) -> list[tuple[int, int, int]]:
        """``(partition, offset, high)``; offset: the group's committed one, else the low mark."""
        timeout = self.admin_timeout_s
        meta = client.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return []  # nothing sent there yet
        parts = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        done = client.committed(parts, timeout=timeout) if committed else parts
        positions = []
        for part, mark in zip(parts, done, strict=True):
            low, high = client.get_watermark_offsets(part, timeout=timeout)
            offset = mark.offset if committed and mark.offset >= 0 else low
            positions.append((part.partition, max(offset, low), high))
        return positions

    def teardown(self) -> None:
        """Delete this driver's topics (and dead-letter topic) and its group's offsets."""
        self._delete_topics_and_group()

    def _delete_topics_and_group(self) -> None:
        admin = self._admin()
        topics = [*dict.fromkeys(self.topics.values())]
        if self.dead_letter_topic:
            topics.append(self.dead_letter_topic)
        futures = admin.delete_topics(topics, request_timeout=self.admin_timeout_s)
        for topic, future in futures.items():
            error = self._settle(future, f"the deletion of topic {topic!r}")
            if error is not None and error_of(error).code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise DriverError(
                    f"Kafka {self.bootstrap} refused to delete topic {topic!r}: "
                    f"{error_of(error).str()}"
                ) from error
        groups = admin.delete_consumer_groups([self.group_id], request_timeout=self.admin_timeout_s)
        for group, future in groups.items():
            error = self._settle(future, f"the deletion of group {group!r}")
            if error is not None:
                # A group that never committed, or still has members: its offsets
                # point past the deleted records, and a new topic resets them.
                logger.debug("Kafka: group %s not deleted - %s", group, error_of(error).str())
        self.ready_topics.difference_update(topics)

    def close(self) -> None:
        """Deliver what this process's producer holds (up to ``send_timeout_s``); drop the clients.

        A driver created before ``fork()`` leaves the parent's clients alone in the child.
        """
        if self._closed:
            return
        self._closed = True
        self._leave_lingering()
        producer = self._producers.peek()
        self._producers.discard()
        self._admins.discard()
        if producer is not None:
            left = producer.flush(self.send_timeout_s)
            if left:
                logger.error(
                    "Kafka %s: %d message(s) still undelivered at close", self.bootstrap, left
                )
            del producer
        destroy_unused()

    def _leave_later(self, session: _Session) -> None:
        """Keep a closed consumer in the group until :meth:`close`: its handlers still run.

        Or until this driver's next consumer joins: the process has moved on to another run.
        """
        self._lingering.append((os.getpid(), session))

    def _leave_lingering(self) -> None:
        lingering, self._lingering = self._lingering, []
        for pid, session in lingering:
            if pid == os.getpid():  # a child leaves its parent's consumers alone
                session.leave()

    def __repr__(self) -> str:
        return f"<KafkaDriver kafka://{self.bootstrap}/{self.topic} group={self.group_id}>"
