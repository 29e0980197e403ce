"""RedisSetDriver: PHP Hermes 4.x's Redis set driver, on redis-py."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import redis
from redis.connection import Connection
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    NoPermissionError,
    NoScriptError,
)

from hermes.core import (
    DEFAULT_PRIORITY,
    BrokerRefusedError,
    BrokerUnavailableError,
    ConfigurationError,
    DriverError,
)
from hermes.core.driver import (
    BrowsePage,
    Consumer,
    Delivery,
    Driver,
    LimitRule,
    Outgoing,
    QueueStats,
    Received,
    Take,
)
from hermes.core.drivertools import (
    AckBatch,
    CertificateRefusedError,
    LeaseKeeper,
    error_text,
    owner_id,
)
from hermes.drivers.redis import _claim, _heartbeat, _limits, _records, _scripts, _tally
from hermes.drivers.redis._capabilities import CAPABILITIES

#: How often a busy worker moves due scheduled messages (an idle one does it every receive).
MOVE_INTERVAL_S = 0.1
#: Tokens a wake list holds at most: how many idle workers one burst can wake at once.
WAKE_LIST_CAP = 32
#: Bodies a rejected list keeps, newest first: enough to see what a broken
#: producer sends, bounded so that it cannot fill Redis.
REJECTED_CAP = 1000
#: How long closing a consumer waits for a lease renewal in progress.
_RENEWAL_JOIN_S = 5.0
#: Redis wakes blocked clients on its ``hz`` tick (100 ms by default); a shorter
#: wait for a scheduled message is a plain sleep instead.
_SHORT_WAIT_S = 0.1

#: At-least-once: how long a lease lasts unless renewed, by default.
LEASE_TIMEOUT_S = 30.0
#: A lease is renewed this many times per lease timeout while its handler runs.
RENEWALS_PER_LEASE = 3

logger = logging.getLogger("hermes.drivers.redis")


def wake_key(queue_key: str) -> str:
    """The list an emitter pushes a token to after adding to ``queue_key``.

    Idle workers block on it (``BLPOP``), so a Python emitter wakes them at
    once; producers that do not push (PHP Hermes) are found by the periodic
    re-check instead.
    """
    return f"{queue_key}_wakeup"


def rejected_key(queue_key: str) -> str:
    """The list where a worker sets aside bodies from ``queue_key`` that are not messages.

    Newest first, at most :data:`REJECTED_CAP` of them; the worker's log says
    why each was rejected.
    """
    return f"{queue_key}_rejected"


def inflight_key(queue_key: str) -> str:
    """At-least-once: the sorted set of the workers holding leases on messages from ``queue_key``.

    Each member is a worker's owner id (``<host>:<pid>:<random>``), its score
    the deadline of that worker's lease in milliseconds of the Redis server's
    clock. What the worker holds is the hash :func:`held_key`.
    """
    return f"{queue_key}_inflight"


def held_key(queue_key: str, owner: str | bytes) -> str:
    """At-least-once: the hash of take number -> body of what ``owner`` holds from ``queue_key``."""
    if isinstance(owner, bytes):
        owner = owner.decode()
    return f"{queue_key}_inflight:{owner}"


def deliveries_key(queue_key: str) -> str:
    """At-least-once: body SHA-1 -> how many takes of it from ``queue_key`` went unsettled.

    A release or a run-out lease adds one, so ``Received.delivery_count`` (one
    more than the count) grows with each redelivery; deleted when the message
    is acknowledged or set aside. A message handled at its first delivery is
    never in it.
    """
    return f"{queue_key}_deliveries"


class RedisRefusedError(BrokerRefusedError):
    """Redis refused this client; the text ends with what to change in the URL."""

    #: What to fix, appended to core's text about the refusal.
    hint = "check the user, password and database number in the redis:// URL"

    def __init__(self, text: str) -> None:
        super().__init__(f"{text} - {self.hint}")


class RedisCredentialsError(RedisRefusedError):
    """Wrong or missing password (or user)."""

    # No URL in the hint: the CLI masks anything shaped like a password in one.
    hint = (
        "give the server's password in the URL, before the host "
        "(:password@host, or user:password@host for an ACL user)"
    )


class RedisPermissionError(RedisRefusedError):
    """The ACL user may not run a command or touch a key the driver uses."""

    hint = "the URL's ACL user lacks a command or key this driver needs: widen its ACL rules"


class RedisDatabaseError(RedisRefusedError):
    """The URL's database number is beyond the server's ``databases``."""

    hint = "the database number in the URL's path does not exist on this server (see 'databases')"


class RedisTlsError(CertificateRefusedError, RedisRefusedError):
    """The server's TLS certificate did not verify: a wrong CA, expired, or another host's."""

    hint = CertificateRefusedError.hint


#: Text in a reply that redis-py raises as a plain ``ResponseError`` (a script's
#: error, a ``SELECT`` at connect) but that means the server refused this client.
_REFUSAL_REPLIES: tuple[tuple[str, type[RedisRefusedError]], ...] = (
    ("noauth", RedisCredentialsError),
    ("wrongpass", RedisCredentialsError),
    ("noperm", RedisPermissionError),
    ("db index is out of range", RedisDatabaseError),
)


class RedisSetDriver(Driver):
    """Messages in Redis sets, compatible with PHP Hermes 4.x's ``RedisSetDriver``.

    * :meth:`put` adds each body (serialized by core) to the set of its priority
      (``key`` for the default priority 100, the ``name`` given to
      :meth:`setup_priority_queue` for others). A message whose ``execute_at``
      is in the future (``Outgoing.execute_at``; a body is never decoded here)
      goes to the sorted set ``schedule_key`` (score =
      ``execute_at``) and is moved to the default-priority set when due, by one
      Lua script, so several workers never move one message twice or lose it.
    * By default (``delivery="at-most-once"``, PHP's way) a worker ``SPOP``\\ s
      a message *before* the callback: a worker that dies mid-handler, or
      whose callback raises, loses that message.
    * ``delivery="at-least-once"``: a worker moves the message, in the script
      call that takes it, from its set to a hash of what the worker holds
      (:func:`held_key`) under the worker's lease (:func:`inflight_key`),
      which it renews while it lives; acknowledging deletes the message from
      the hash, releasing puts the body back at once. The lease of a worker
      that died runs out after ``lease_timeout_s`` and any worker on that set
      puts back what it held, so each message is delivered again within
      :attr:`Capabilities.redelivery_timeout_s`. Emitters are the same
      in both modes; a PHP worker on the same set still pops at most once.
      ``prefetch`` (at-least-once only; default 1) lets one script call
      claim up to that many messages, held under the lease like one; what a
      worker claimed and never handed to a handler goes back to its set when
      it stops.
    * Sets are read from the highest priority down. A body that is not a
      Hermes message is pushed to ``<queue>_rejected`` (:func:`rejected_key`,
      the newest :data:`REJECTED_CAP` kept).
    * Wake-up: :meth:`put` also pushes a token to ``<queue>_wakeup`` (capped at
      :data:`WAKE_LIST_CAP`) in the same script call; an idle worker blocks on
      those lists, so it starts a Python-emitted message within a round trip.
      Messages other producers add (PHP) are found within ``refresh_interval``.
    * A set is unordered: messages of one priority come out in no particular
      order, and sending the very same serialized message twice stores it once.
    * The wire format and the default keys are PHP Hermes's, so PHP emitters
      and Python workers (and the reverse) share one Redis.
    * Job records (``--results-url``, :class:`~hermes.core.jobs.Jobs`) in
      either mode: ``<key>_record:<record key>`` with ``PX ttl``, written by
      one compare-and-set script that also indexes it (``<key>_records``,
      newest first) and publishes the write, so a waiter subscribed to the
      record's channel wakes at once (see ``_records``).
    * Fleet-wide limits (``--limits-url``, ``SupportsLimits``) in either mode:
      ``<key>_limit:<limit key>`` holds a key's state, changed by one script
      call per take, release or renewal on the server's clock, and the sorted
      set ``<key>_limits`` lists the keys whose state still matters (see
      ``_limits``).
    * Tallies (``SupportsTally``: a workflow group's members, counted once
      each): the hash ``<key>_tally:<tally key>`` of member -> value, added
      to by one script call (``HSETNX``, ``HLEN``, ``PEXPIRE``; see
      ``_tally``).

    ``prefix`` is prepended to every key, like the ``prefix`` option of PHP's
    Predis: ``prefix="app:"`` puts the default set at ``app:hermes``.

    ``refresh_interval`` (seconds, > 0) is the longest an idle worker blocks
    before it looks at the sets again (core's loop caps every wait at about a
    second), kept below the client's ``socket_timeout``. The driver works
    across ``fork()``: redis-py's pool opens new connections in the child and
    leaves the parent's alone, and a worker takes its connection in the
    process that runs it. :meth:`put` is thread-safe (``redis.Redis`` is).

    Errors are declared for core to translate: a connection that fails or
    times out means Redis is unavailable (a worker reconnects with backoff;
    ``send`` tries once more on a fresh connection, then raises
    :class:`BrokerUnavailableError`, so a message is never lost silently);
    wrong credentials, a missing ACL permission or a database number the
    server lacks mean it refused this client (:class:`RedisRefusedError`,
    whose text says what to change in the URL); any other redis-py error is
    a :class:`DriverError` (:class:`DeliveryError` on a send).
    ``close_client=True`` makes :meth:`close` close ``client`` (the URL
    factory does this for the client it builds).
    """

    capabilities = CAPABILITIES
    # AuthenticationError and AuthorizationError are ConnectionErrors in redis-py:
    # refused is looked at first, so a wrong password is not retried forever.
    refused_errors = (
        AuthenticationError,
        AuthenticationWrongNumberOfArgsError,
        AuthorizationError,
        NoPermissionError,
    )
    unavailable_errors = (redis.ConnectionError, redis.TimeoutError)
    client_errors = (redis.RedisError,)

    def __init__(
        self,
        client: redis.Redis[Any],
        key: str = "hermes",
        refresh_interval: float = 1,
        schedule_key: str = "hermes_schedule",
        *,
        prefix: str = "",
        close_client: bool = False,
        delivery: Delivery | str = Delivery.AT_MOST_ONCE,
        lease_timeout_s: float | None = None,
        wait_replicas: int = 0,
        wait_timeout_s: float = 1.0,
        prefetch: int = 1,
    ) -> None:
        try:
            delivery = Delivery(delivery)
        except ValueError:
            raise ConfigurationError(
                f"RedisSetDriver delivery must be 'at-most-once' or 'at-least-once', "
                f"got {delivery!r}"
            ) from None
        if lease_timeout_s is not None and delivery is not Delivery.AT_LEAST_ONCE:
            raise ConfigurationError(
                f"RedisSetDriver lease_timeout_s={lease_timeout_s!r} needs "
                "delivery='at-least-once': an at-most-once worker holds no lease"
            )
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 1 <= prefetch <= 1000:
            raise ConfigurationError(
                f"RedisSetDriver prefetch must be an int from 1 to 1000, got {prefetch!r}"
            )
        if prefetch > 1 and delivery is not Delivery.AT_LEAST_ONCE:
            raise ConfigurationError(
                f"RedisSetDriver prefetch={prefetch} needs delivery='at-least-once': an "
                "at-most-once worker would lose what it popped ahead if it died"
            )
        if lease_timeout_s is None:
            lease_timeout_s = LEASE_TIMEOUT_S
        if (
            isinstance(lease_timeout_s, bool)
            or not isinstance(lease_timeout_s, int | float)
            or not 1 <= lease_timeout_s <= 86400
        ):
            raise ConfigurationError(
                f"RedisSetDriver lease_timeout_s must be a number of seconds from 1 to 86400, "
                f"got {lease_timeout_s!r}"
            )
        if not isinstance(key, str) or not key:
            raise ConfigurationError(f"RedisSetDriver key must be a non-empty string, got {key!r}")
        if not isinstance(schedule_key, str) or not schedule_key:
            raise ConfigurationError(
                f"RedisSetDriver schedule_key must be a non-empty string, got {schedule_key!r}"
            )
        if schedule_key == key:
            raise ConfigurationError(
                f"RedisSetDriver key and schedule_key must differ, both are {key!r}"
            )
        if isinstance(refresh_interval, bool) or not refresh_interval > 0:
            raise ConfigurationError(
                f"RedisSetDriver refresh_interval must be a number of seconds > 0, "
                f"got {refresh_interval!r}"
            )
        if not isinstance(prefix, str):
            raise ConfigurationError(f"RedisSetDriver prefix must be a string, got {prefix!r}")
        self.client = client
        #: ``put`` returns only once this many replicas hold what it wrote (``WAIT``):
        #: a failover to one of them then keeps every message a send confirmed.
        self.wait_replicas = int(wait_replicas)
        #: How long ``put`` waits for them before it raises.
        self.wait_timeout_s = float(wait_timeout_s)
        #: Prepended to every key this driver uses, priority sets included.
        self.prefix = prefix
        #: The Redis key of the default-priority set (with the prefix).
        self.key = prefix + key
        #: The Redis key of the schedule sorted set (with the prefix).
        self.schedule_key = prefix + schedule_key
        self.refresh_interval = float(refresh_interval)
        #: When a message leaves Redis: on receive (at-most-once) or on acknowledgement.
        self.delivery = delivery
        #: At-least-once: how long a lease lasts unless its worker renews it.
        self.lease_timeout_s = float(lease_timeout_s)
        #: At-least-once: the most messages one take claims under the worker's lease.
        self.prefetch = prefetch
        if delivery is Delivery.AT_LEAST_ONCE:
            # A run-out lease is put back by the next look at the schedule: at
            # most a second later on an idle worker (core caps each receive at it).
            self.capabilities = replace(
                type(self).capabilities,
                delivery=delivery,
                redelivery_timeout_s=self.lease_timeout_s + 1.0,
                counts_deliveries=True,
            )
        self._close_client = close_client
        self._execute = _scripts.on_pool(client)
        #: Commands that must not be sent twice (a compare-and-set).
        self._execute_once = _records.once(client)
        #: priority -> set key
        self._queues: dict[int, str] = {DEFAULT_PRIORITY: self.key}
        self._idle_wait_s = self.refresh_interval
        socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
        if socket_timeout:
            # A blocking BLPOP longer than the socket timeout would look like a dead server.
            self._idle_wait_s = min(self._idle_wait_s, socket_timeout / 2)

    # Sending -------------------------------------------------------------------

    def setup_priority_queue(self, name: str, priority: int) -> None:
        """Messages sent with ``priority`` go to the set ``prefix + name``.

        As in PHP, the name is the key itself (``prefix`` is empty by default).
        """
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"priority queue name must be a non-empty string: {name!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigurationError(f"priority must be an int, got {priority!r}")
        key = self.prefix + name
        if key == self.schedule_key:
            raise ConfigurationError(
                f"priority queue {name!r} cannot be the schedule key {self.schedule_key!r}"
            )
        self._queues[priority] = key

    def put(self, items: Sequence[Outgoing], priority: int = DEFAULT_PRIORITY) -> None:
        """Add ``items`` with one script call per 500 (the calls after the first pipelined)."""
        queue = self._queue_key(priority)
        default = self._queues[DEFAULT_PRIORITY]
        keys = (queue, self.schedule_key, wake_key(queue), wake_key(default))
        now = time.time()
        calls: list[list[str | bytes | float | int]] = []
        chunk_size = _scripts.MAX_SCRIPT_VALUES // 2
        for start in range(0, len(items), chunk_size):
            chunk = items[start : start + chunk_size]
            due = [item.body for item in chunk if item.execute_at is None or item.execute_at <= now]
            args: list[str | bytes | float | int] = [WAKE_LIST_CAP, len(due), *due]
            for item in chunk:
                if item.execute_at is not None and item.execute_at > now:
                    args += [repr(item.execute_at), item.body]
            calls.append(args)
        if not calls:
            return
        if self.wait_replicas:
            self._send_replicated(keys, calls)
            return
        # The first call loads the script if the server lacks it; a pipeline
        # cannot fall back from EVALSHA to EVAL per command.
        _scripts.SEND(self._execute, keys, calls[0])
        if len(calls) > 1:
            self._send_pipelined(keys, calls[1:])

    def _queue_key(self, priority: int) -> str:
        try:
            return self._queues[priority]
        except KeyError:
            raise self.unknown_priority(priority, self._queues) from None

    def queue_key(self, priority: int) -> str:
        """The Redis key (prefix included) of the set that holds ``priority``."""
        return self._queue_key(priority)

    def queues(self) -> dict[int, str]:
        """Priority -> the Redis key of its set, for every priority set up on this driver."""
        return dict(self._queues)

    def find_priority_queues(self) -> dict[int, str]:
        """Priority sets on the server named as the CLI names them, not set up here.

        ``<key>_priority_<P>`` (``SCAN``, the prefix included): what ``hermes
        worker --priority P`` reads, so ``hermes stats`` and ``hermes purge``
        see a queue they were not told about. Sets named otherwise (PHP's
        ``hermes_high``) carry no priority in their name: give them with
        ``priority_queues`` or ``--priority``. Returns priority -> the name to
        give :meth:`setup_priority_queue` (without the prefix).
        """
        base = self.key + "_priority_"
        pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in base) + "*"
        known = set(self._queues.values())
        found: dict[int, str] = {}
        for raw in self.client.scan_iter(match=pattern, count=1000):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            suffix = key[len(base) :]
            # <set>_wakeup, <set>_rejected and the lease keys share the pattern.
            if key in known or not suffix.lstrip("-").isdigit():
                continue
            priority = int(suffix)
            if priority not in self._queues:
                found[priority] = key[len(self.prefix) :]
        return found

    def classify_error(self, exc: BaseException) -> type[DriverError] | None:
        """Refusals carry what to fix; some arrive as a plain ``ResponseError`` with a code."""
        if isinstance(exc, AuthenticationError | AuthenticationWrongNumberOfArgsError):
            return RedisCredentialsError
        if isinstance(exc, AuthorizationError | NoPermissionError):
            return RedisPermissionError
        if isinstance(exc, redis.ConnectionError) and CertificateRefusedError.in_chain(exc):
            # Retrying cannot make a certificate verify: the URL or the server must change.
            return RedisTlsError
        if isinstance(exc, redis.ResponseError):
            text = str(exc).lower()
            for needle, kind in _REFUSAL_REPLIES:
                if needle in text:
                    return kind
        return super().classify_error(exc)

    def _send_replicated(
        self, keys: Sequence[str], calls: Sequence[Sequence[str | bytes | float | int]]
    ) -> None:
        """The calls, then ``WAIT`` on the same connection: one round trip, replicas confirmed.

        ``EVAL`` rather than ``EVALSHA``: a pipeline cannot fall back per command,
        and a master just promoted by a failover may not have the script cached.
        """
        with self.client.pipeline(transaction=False) as pipe:
            for args in calls:
                pipe.eval(_scripts.SEND.source, len(keys), *keys, *args)
            # WAIT counts the replicas that hold this connection's writes so far.
            pipe.execute_command(  # type: ignore[no-untyped-call]
                "WAIT", self.wait_replicas, round(self.wait_timeout_s * 1000)
            )
            acked = int(pipe.execute()[-1])
        if acked < self.wait_replicas:
            raise BrokerUnavailableError(
                f"{self!r}: only {acked} of {self.wait_replicas} replica(s) confirmed the "
                f"send within {self.wait_timeout_s:g} s (wait_replicas): the master holds "
                "it, but a failover now could lose it; send it again if it must not be lost"
            )

    def _send_pipelined(
        self, keys: Sequence[str], calls: Sequence[Sequence[str | bytes | float | int]]
    ) -> None:
        with self.client.pipeline(transaction=False) as pipe:
            for args in calls:
                pipe.evalsha(_scripts.SEND.sha, len(keys), *keys, *args)
            pipe.execute()

    # Receiving -----------------------------------------------------------------

    def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
        order = self.check_priorities(self._queues, priorities)
        if self.delivery is Delivery.AT_LEAST_ONCE:
            return _LeasingConsumer(self, order)
        return _RedisConsumer(self, order, concurrency)

    # Housekeeping --------------------------------------------------------------

    def queue_stats(self) -> list[QueueStats]:
        """Counts in one pipelined round trip: ``SCARD`` of each set, ``ZCARD`` of the
        schedule, ``LLEN`` of each rejected list (and, at least once, one script
        call that adds up what the leases on each set hold).

        The schedule holds the delayed messages of every priority, and they all
        land on the default priority when due: its count is on the
        default-priority row (None on the others). In flight is None for an
        at-most-once driver: a popped message is nowhere in Redis.
        """
        order = sorted(self._queues.items(), reverse=True)
        in_flight: list[int | None] = [None] * len(order)
        if self.delivery is Delivery.AT_LEAST_ONCE:
            counts = _scripts.IN_FLIGHT(self._execute, [queue for _, queue in order])
            in_flight = [int(held) for held in counts]
        with self.client.pipeline(transaction=False) as pipe:
            pipe.zcard(self.schedule_key)
            for _, queue in order:
                pipe.scard(queue)
                pipe.llen(rejected_key(queue))
            replies = iter(pipe.execute())
        scheduled = int(next(replies))
        rows = []
        for (priority, queue), held in zip(order, in_flight, strict=True):
            ready, set_aside = int(next(replies)), int(next(replies))
            rows.append(
                QueueStats(
                    priority,
                    queue,
                    ready=ready,
                    scheduled=scheduled if priority == DEFAULT_PRIORITY else None,
                    in_flight=held,
                    set_aside=set_aside,
                )
            )
        return rows

    def purge(self, priority: int | None = None) -> int:
        """Delete the waiting messages of ``priority`` (every priority: None); how many.

        One script call, so nothing is half deleted: the set of each priority,
        and the schedule along with the default priority (where its messages
        land). Leases and rejected lists stay.
        """
        if priority is None:
            keys, schedule = list(self._queues.values()), True
        else:
            keys, schedule = [self._queue_key(priority)], priority == DEFAULT_PRIORITY
        if schedule:
            keys.append(self.schedule_key)
        removed = _scripts.CLEAR(self._execute, keys, ("1" if schedule else "0",))
        return int(removed)

    def teardown(self) -> None:
        """Delete every key this driver uses: sets, schedule, leases, lists, job records, limits.

        Tallies too (found by ``SCAN``, like limit states no longer indexed).
        """
        keys = {self.schedule_key, _heartbeat.index_key(self.key)}
        for queue in self._queues.values():
            keys |= {queue, wake_key(queue), rejected_key(queue), deliveries_key(queue)}
        _scripts.DROP_LEASES(self._execute, sorted(self._queues.values()))
        keys.update(_records.keys(self._execute, self.key))
        keys.update(_limits.keys(self.client, self.key))
        keys.update(_tally.keys(self.client, self.key))
        names = sorted(keys)
        for start in range(0, len(names), _scripts.MAX_SCRIPT_VALUES):
            self.client.delete(*names[start : start + _scripts.MAX_SCRIPT_VALUES])

    def close(self) -> None:
        if self._close_client:
            self.client.close()

    def claim(self, key: str, ttl_s: float) -> bool:
        """``SET <key>_claim:<key> 1 NX PX``: see :class:`~hermes.core.driver.SupportsClaim`."""
        return _claim.claim(self.client, _claim.claim_key(self.key, key), ttl_s)

    def beat(self, record: Mapping[str, Any], ttl_s: float) -> None:
        """``SET <key>_worker:<id> JSON PX ttl``; see ``SupportsHeartbeats``."""
        _heartbeat.beat(self.client, self.key, record, ttl_s)

    def forget(self, worker_id: str) -> None:
        _heartbeat.forget(self.client, self.key, worker_id)

    def heartbeats(self) -> list[dict[str, Any]]:
        return _heartbeat.heartbeats(self.client, self.key)

    def record_get(self, key: str) -> bytes | None:
        """``GET <key>_record:<key>``; see :class:`~hermes.core.driver.SupportsRecords`."""
        return _records.get(self._execute, self.key, key)

    def record_put(self, key: str, value: bytes, ttl_s: float, expect: bytes | None) -> bool:
        """Compare-and-set ``<key>_record:<key>`` in one script call, then ``PUBLISH`` it.

        Sent once: a call whose reply was lost raises rather than being sent
        again, since the second would find its own write and call it a conflict.
        """
        return _records.put(self._execute_once, self.key, key, value, ttl_s, expect)

    def record_wait(self, key: str, seen: bytes | None, timeout_s: float) -> bytes | None:
        """Subscribe to the record's channel, then read it; wait for a write if it is ``seen``.

        A pub/sub connection of its own for each call, closed when it returns.
        """
        return _records.wait(self.client, self._execute, self.key, key, seen, timeout_s)

    def record_wait_any(
        self, seen: Mapping[str, bytes | None], timeout_s: float
    ) -> dict[str, bytes | None]:
        """:meth:`record_wait` on several records, one pub/sub connection for them all."""
        return _records.wait_any(self.client, self._execute, self.key, seen, timeout_s)

    def record_scan(self, limit: int) -> list[bytes]:
        """Newest first, from the sorted set ``<key>_records``; expired records are skipped."""
        return _records.scan(self._execute, self.key, limit)

    def record_page(
        self, after: str | None, limit: int, max_bytes: int, *, oldest_first: bool = False
    ) -> BrowsePage:
        """One script call over the sorted set ``<key>_records``, scored by creation."""
        return _records.page(self._execute, self.key, after, limit, max_bytes, oldest_first)

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        """One script call on ``<key>_limit:<limit key>``; see ``SupportsLimits``.

        Sent once: a call whose reply was lost raises rather than being sent
        again, since the second would charge the rate or hold a slot twice.
        """
        return _limits.take(self._execute_once, self.key, key, rule, slot, charged, lease_s)[0]

    def limit_release(self, key: str, slot: str) -> None:
        """One script call: ``slot`` is freed and its hold time folded into the mean."""
        _limits.release(self._execute, self.key, key, slot)

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        """One script call: ``slot``'s lease ends ``lease_s`` after the server's now."""
        return _limits.renew(self._execute, self.key, key, slot, lease_s)[0]

    def limit_scan(self, limit: int) -> list[tuple[str, bytes]]:
        """From the sorted set ``<key>_limits``: keys whose state holds or promises a start."""
        return _limits.scan(self._execute, self.key, limit)

    def tally_add(self, key: str, member: str, value: bytes, ttl_s: float) -> tuple[bool, int]:
        """One script call on ``<key>_tally:<key>``; see ``SupportsTally``.

        Sent once: a call whose reply was lost raises rather than being sent
        again, since the second would find the member its first call added
        and say it did not add it.
        """
        return _tally.add(self._execute_once, self.key, key, member, value, ttl_s)

    def tally_read(self, key: str) -> dict[str, bytes]:
        """``HGETALL <key>_tally:<key>``: every member and the value it was added with."""
        return _tally.read(self._execute, self.key, key)

    def __repr__(self) -> str:
        pool = self.client.connection_pool
        kwargs = pool.connection_kwargs
        scheme = "rediss" if issubclass(pool.connection_class, redis.SSLConnection) else "redis"
        where = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        if "path" in kwargs:
            where = f"unix:{kwargs['path']}"
        service = getattr(pool, "service_name", None)
        if service is not None:  # a SentinelConnectionPool: the master moves
            where = f"sentinel:{service}"
        mode = " at-least-once" if self.delivery is Delivery.AT_LEAST_ONCE else ""
        db = kwargs.get("db", 0)
        return f"<RedisSetDriver {scheme}://{where}/{db} key={self.key!r}{mode}>"


class _RedisConsumer(Consumer):
    """One run's hold on Redis: ``SPOP`` before the handler, so delivery is at most once.

    * :meth:`receive` pops from the highest-priority non-empty set, moving due
      scheduled messages first every :data:`MOVE_INTERVAL_S` while busy and
      always before an idle wait, so nothing due is left waiting. Idle, it
      blocks in ``BLPOP`` on the wake lists of its sets (at most ``timeout_s``,
      ``refresh_interval``, or until the next scheduled message is due) and
      pops at once when a send wakes it.
    * It holds one connection, taken from the client's pool on the first
      :meth:`receive` and given back by :meth:`close`, and talks to it
      directly: redis-py's per-command pool and retry bookkeeping would cost
      more than the round trip. A connection that failed is reconnected by
      redis-py on the next command, so after a
      :class:`~hermes.core.BrokerUnavailableError` the next :meth:`receive`
      simply tries again.
    * :meth:`ack` and :meth:`release` do nothing: the message left Redis when
      it was popped. Putting back a message whose handler raised would run a
      handler that may have done half its work a second time, which an
      at-most-once worker promises never to do. :meth:`reject` pushes the body
      to the capped list ``rejected_key(set)``.
    * :meth:`receive` and :meth:`close` belong to the thread running the loop;
      :meth:`ack`, :meth:`release` and :meth:`reject` may be called from any
      thread: they never touch the held connection (:meth:`reject` borrows one
      from the pool, which is thread-safe).
    * A worker with many handlers at once pops several bodies per round trip:
      one for every :data:`CONCURRENCY_PER_BODY` of the ``concurrency`` it
      passed to :meth:`RedisSetDriver.consumer`, at most :data:`MOST_POPPED`,
      from the first non-empty set (below ``2 x CONCURRENCY_PER_BODY``, one
      at a time). They are handed out one per :meth:`receive` before the
      next pop, and :meth:`close` puts back those never handed out. A worker
      killed meanwhile (SIGKILL, the OOM killer) loses them along with the
      messages its handlers ran, though their handlers never started: at
      most ``MOST_POPPED - 1`` messages more than an at-most-once worker
      loses anyway.

    ``Received.token`` is the key of the set the body was popped from.
    """

    #: Popped at once: one body per this much of the worker's ``concurrency``.
    CONCURRENCY_PER_BODY = 32
    #: The most bodies one pop takes (the last are held until a handler is free).
    MOST_POPPED = 16
    #: Pop up to ARGV[1] bodies from the first non-empty set of KEYS (highest
    #: priority first); ``{index, body...}`` (1-based index into KEYS) or nil.
    POP_FIRST_MANY = _scripts.LuaScript(
        """
for i = 1, #KEYS do
    local bodies = redis.call('SPOP', KEYS[i], tonumber(ARGV[1]))
    if #bodies > 0 then
        table.insert(bodies, 1, i)
        return bodies
    end
end
return false
"""
    )

    def __init__(
        self, driver: RedisSetDriver, priorities: Sequence[int], concurrency: int = 1
    ) -> None:
        self.driver = driver
        self.pool = driver.client.connection_pool
        self.connection: Connection | None = None
        #: The priorities to read and their sets, highest first.
        self.priorities = list(priorities)
        self.keys = [driver._queues[p] for p in self.priorities]
        self.wake_keys = list(dict.fromkeys(wake_key(k) for k in self.keys))
        default_key = driver._queues[DEFAULT_PRIORITY]
        self.move_keys: tuple[str, ...] = (
            driver.schedule_key,
            default_key,
            wake_key(default_key),
        )
        #: ``time.monotonic()`` after which the next receive first moves due messages.
        self.move_at = 0.0
        #: ``execute_at`` of the earliest scheduled message, as of the last move.
        self.next_due: float | None = None
        #: How many bodies one pop takes.
        self.popped_at_once = max(
            1, min(self.MOST_POPPED, concurrency // self.CONCURRENCY_PER_BODY)
        )
        #: Popped by the last pop and not handed out yet, next first.
        self.popped: collections.deque[Received] = collections.deque()

    def receive(self, timeout_s: float) -> Received | None:
        busy = time.monotonic() < self.move_at
        if busy:  # the schedule was looked at a moment ago: pop first
            received = self._pop()
            if received is not None:
                return received
        moved = self._move_due()
        if moved or not busy:
            received = self._pop()
            if received is not None:
                return received
        # Woken by a send: pop now, the message is there.
        return self._pop() if self._idle_wait(timeout_s) else None

    def reject(self, received: Received, reason: str) -> None:
        key = rejected_key(received.token)
        _scripts.SET_ASIDE(self.driver._execute, (key,), (REJECTED_CAP, received.body))

    def close(self) -> None:
        try:
            if self.popped:
                self._put_back()
        finally:
            if self.connection is not None:
                self.pool.release(self.connection)
                self.connection = None

    def _put_back(self) -> None:
        """Put back what the last pop took and no handler was given (the worker stops)."""
        popped, self.popped = list(self.popped), collections.deque()
        default_wake = wake_key(self.driver._queues[DEFAULT_PRIORITY])
        try:
            for key in dict.fromkeys(received.token for received in popped):
                bodies = [received.body for received in popped if received.token == key]
                keys = (key, self.driver.schedule_key, wake_key(key), default_wake)
                _scripts.SEND(self._execute, keys, (WAKE_LIST_CAP, len(bodies), *bodies))
        except Exception as exc:
            logger.warning(
                "%r: could not put back %d message(s) taken and never started, which are lost - %s",
                self.driver,
                len(popped),
                exc,
            )
            raise

    def _execute(self, command: Sequence[Any] | bytes, raw: bool) -> Any:
        """Run ``command`` (words, or bytes packed already) on the held connection."""
        connection = self.connection
        if connection is None:
            connection = self.connection = self.pool.get_connection()
        try:
            if type(command) is bytes:
                # A list of chunks: redis-py iterates what it is given (types-redis says str).
                connection.send_packed_command([command])  # type: ignore[list-item]
            else:
                connection.send_command(*command)
            return connection.read_response(disable_decoding=raw)
        except redis.ResponseError:
            raise  # Redis answered: the connection is in step
        except BaseException:
            # Interrupted between the command and its reply (redis-py covers the
            # inside of each call): a reply left unread would answer someone else.
            connection.disconnect()
            # The next command takes a connection from the pool, which connects
            # it with connect(): behind Sentinel that finds the current master,
            # where a reused connection would dial the address it had.
            self.pool.release(connection)
            self.connection = None
            raise

    def _pop(self) -> Received | None:
        if self.popped:
            return self.popped.popleft()
        most = self.popped_at_once
        if most > 1:
            return self._pop_many(most)
        if len(self.keys) == 1:
            body = self._execute(("SPOP", self.keys[0]), True)
            return None if body is None else Received(body, self.priorities[0], self.keys[0])
        reply = _scripts.POP_FIRST(self._execute, self.keys, raw=True)
        if reply is None:
            return None
        index = int(reply[0]) - 1
        return Received(reply[1], self.priorities[index], self.keys[index])

    def _pop_many(self, most: int) -> Received | None:
        if len(self.keys) == 1:
            index, bodies = 0, self._execute(("SPOP", self.keys[0], most), True)
        else:
            reply = self.POP_FIRST_MANY(self._execute, self.keys, (most,), raw=True)
            if not reply:
                return None
            index, bodies = int(reply[0]) - 1, reply[1:]
        if not bodies:
            return None
        priority, key = self.priorities[index], self.keys[index]
        self.popped.extend(Received(body, priority, key) for body in bodies[1:])
        return Received(bodies[0], priority, key)

    def _move_due(self) -> int:
        """Move due scheduled messages to the default-priority set; how many."""
        moved, first = _scripts.MOVE_DUE(
            self._execute,
            self.move_keys,
            (repr(time.time()), _scripts.MAX_SCRIPT_VALUES, WAKE_LIST_CAP),
            raw=True,
        )
        self.next_due = None if first is None else float(first)
        # More were due than one call moves: come back at once.
        if moved >= _scripts.MAX_SCRIPT_VALUES:
            self.move_at = 0.0
        else:
            self.move_at = time.monotonic() + MOVE_INTERVAL_S
        return int(moved)

    def _idle_wait(self, timeout_s: float) -> bool:
        """Wait for a wake-up token or the next due message; True if a token came."""
        timeout = min(timeout_s, self.driver._idle_wait_s)
        if self.next_due is not None:
            timeout = min(timeout, self.next_due - time.time())
        if timeout <= 0:
            return False
        if timeout < _SHORT_WAIT_S:
            time.sleep(timeout)
            return False
        return self._execute(("BLPOP", *self.wake_keys, round(timeout, 3)), True) is not None


class _LeasingConsumer(_RedisConsumer):
    """At-least-once: what the worker takes, it holds under its lease until it is settled.

    * :meth:`receive` takes a body with one script call that moves it from its
      set to the hash of what this consumer holds (:func:`held_key`, take
      number -> body) and, in the same call, acknowledges what this thread
      acknowledged since the last one: a serial worker pays one round trip
      per message, as the ``SPOP`` loop does. Its look at the schedule (every
      :data:`MOVE_INTERVAL_S` while busy, before every idle wait) also puts
      back what the workers whose leases ran out held: a script does it, so
      only one worker puts a body back, and the set hands it to one worker.
    * The lease is the consumer's, not each message's: its owner id in
      :func:`inflight_key` with a deadline, which core's
      :class:`~hermes.core.drivertools.LeaseKeeper` renews on a daemon thread
      :data:`RENEWALS_PER_LEASE` times per lease timeout (one script call,
      however many messages are held), so a handler that runs longer than the
      lease keeps its message. A worker that dies stops renewing; its lease
      runs out, and everything it held is delivered again.
    * :meth:`ack`, from whichever thread, is deferred to the next take (or
      :meth:`close`), so concurrent handlers cost no more round trips than a
      serial worker; what is still unsent when the receiving thread is about
      to wait idle is sent then, and an acknowledgement made during that wait
      is sent at once (one ``HDEL`` on a connection from the pool), so a
      quiet worker does not sit on handled messages. :meth:`release` puts the
      body back at once; :meth:`reject` moves it to ``rejected_key(set)``.
      All three may be called from any thread: only :meth:`receive` and
      :meth:`close` use the held connection.
    * :meth:`close` sends the deferred acknowledgements, stops renewing, and
      takes the consumer off the sets where it holds nothing. What it still
      holds then (handlers that outlived the worker's grace period) is
      delivered again once the lease runs out, rather than handed to another
      worker while its handler may still be running.

    * A release or a run-out lease adds one to the body's count in
      :func:`deliveries_key`, and the take reports one more than it holds
      (``Received.delivery_count``); acknowledging or setting aside deletes
      it. A take while that hash is empty, the usual case, reads nothing more.
    * With the driver's ``prefetch`` above 1, one take claims up to that many
      bodies from the first non-empty set, all held under the lease; they are
      handed out one per :meth:`receive` before the next take. :meth:`close`
      puts back at once those never handed out (their delivery counts
      unchanged), never one a handler holds.

    ``Received.token`` is ``(index of the set, take number, body SHA-1)``; the
    SHA-1 is empty when the set had no counts at the take.
    """

    def __init__(self, driver: RedisSetDriver, priorities: Sequence[int]) -> None:
        super().__init__(driver, priorities)
        self.lease_ms = round(driver.lease_timeout_s * 1000)
        self.lease_keys = [inflight_key(k) for k in self.keys]
        self.move_keys = (
            *self.move_keys,
            *(
                key
                for queue in self.keys
                for key in (queue, inflight_key(queue), wake_key(queue), deliveries_key(queue))
            ),
        )
        #: ``<host>:<pid>:<random>``, set on the first receive (in the process that runs it).
        self.owner = ""
        #: The hash of what this consumer holds, per set (as ``self.keys``).
        self.held_keys: list[str] = []
        #: The delivery counts of each set (as ``self.keys``).
        self.count_keys = [deliveries_key(k) for k in self.keys]
        self.claim: _scripts.PackedCall | None = None
        #: The number of the next take (a field of the held hash).
        self.next_number = 1
        #: ``(set index, take number)`` a take may have used on the server before its
        #: reply was lost (the connection broke): given back before the next take.
        self.unsure: list[tuple[int, int]] = []
        #: Claimed by the last take and not handed out yet, next first.
        self.prefetched: collections.deque[Received] = collections.deque()
        #: ``(index, take number, digest)`` acknowledged, not yet sent: with the next
        #: take, or at once while the receiving thread waits idle.
        self.acks: AckBatch[tuple[bytes, bytes, bytes]] = AckBatch()
        self.ack_call: _scripts.PackedCall | None = None
        #: Indexes (1-based) of the sets this consumer has taken from: where it has a
        #: lease. Replaced, never changed, by the receiving thread; read by the renewer.
        self.taken_from: frozenset[int] = frozenset()
        #: Renews the lease on a daemon thread; made on the first receive.
        self.leases: LeaseKeeper | None = None

    def receive(self, timeout_s: float) -> Received | None:
        if self.prefetched:
            # Handed out without a take: acknowledgements wait for the next
            # one, but not for long while handlers are slow.
            if self.acks.due():
                self._send_acks()
            return self.prefetched.popleft()
        if self.leases is None:
            self._start()
        return super().receive(timeout_s)

    def ack(self, received: Received) -> None:
        index, number, digest = received.token
        if not self.acks.add((b"%d" % index, number, digest)):  # else: with the next take
            self._ack_now(self.driver._execute, index, number, digest)

    def _ack_now(self, execute: _scripts.Execute, index: int, number: bytes, digest: bytes) -> None:
        keys = (self.held_keys[index - 1], self.count_keys[index - 1])
        _scripts.ACK(execute, keys, (number, digest))

    def release(self, received: Received) -> None:
        index, number, _ = received.token
        queue = self.keys[index - 1]
        keys = (queue, self.held_keys[index - 1], wake_key(queue), self.count_keys[index - 1])
        _scripts.RELEASE(self.driver._execute, keys, (number, WAKE_LIST_CAP))

    def reject(self, received: Received, reason: str) -> None:
        index, number, digest = received.token
        queue = self.keys[index - 1]
        keys = (rejected_key(queue), self.held_keys[index - 1], self.count_keys[index - 1])
        _scripts.SET_ASIDE_LEASED(self.driver._execute, keys, (REJECTED_CAP, number, digest))

    def close(self) -> None:
        if self.leases is not None:
            # At most one renewal is in progress; one stuck on a dead server is not waited for.
            self.leases.stop(_RENEWAL_JOIN_S)
        try:
            if self.claim is not None:
                # Handled here rather than raised to core: what a failure costs
                # depends on what was still to acknowledge (and on what a take
                # whose reply was lost may hold: its lease runs out).
                self._give_back()
                self._claim(b"")  # no take number: acknowledge, take nothing, leave
        except self.driver.broker_errors as exc:
            error = error_text(exc)
            if self.prefetched:
                logger.warning(
                    "%r: could not give back %d message(s) claimed and never started, which "
                    "are delivered again once the lease runs out - %s",
                    self.driver,
                    len(self.prefetched),
                    error,
                )
            if self.acks:
                logger.warning(
                    "%r: could not acknowledge %d message(s), which are delivered again once "
                    "the lease runs out - %s",
                    self.driver,
                    len(self.acks),
                    error,
                )
            elif not self.prefetched:
                # Nothing is lost: the lease of a worker holding nothing just runs out.
                logger.info("%r: could not take its lease off Redis - %s", self.driver, error)
        finally:
            super().close()

    def _start(self) -> None:
        self.owner = owner_id()
        self.held_keys = [held_key(queue, self.owner) for queue in self.keys]
        self.claim = _scripts.PackedCall(
            _scripts.CLAIM,
            [*self.keys, *self.lease_keys, *self.held_keys, *self.count_keys],
            [self.lease_ms, self.owner, self.driver.prefetch],
        )
        #: The same script taking nothing: acknowledgements alone.
        self.ack_call = _scripts.PackedCall(
            _scripts.CLAIM, self.claim.keys, [self.lease_ms, self.owner, 0]
        )
        self.leases = LeaseKeeper(
            self._renew,
            self.driver.lease_timeout_s / RENEWALS_PER_LEASE,
            f"the lease of {self.owner} on {self.driver!r}",
            driver=self.driver,
            name="hermes-redis-leases",
        ).start()

    def _claim(self, number: bytes, claim: _scripts.PackedCall | None = None) -> Any:
        """Send the deferred acknowledgements and, with a take number, take bodies."""
        claim = claim or self.claim
        assert claim is not None
        acks = self.acks.take()
        fields = [field for ack in acks for field in ack]
        count = b"%d" % len(acks)
        try:
            try:
                reply = self._execute(claim.pack(number, count, *fields), True)
            except NoScriptError:  # a new or restarted server: send the script itself
                args: list[str | int | bytes] = [*claim.head, number, count, *fields]
                reply = _scripts.CLAIM(self._execute, claim.keys, args, raw=True)
        except BaseException:
            self.acks.put_back(acks)  # they go with the next call
            raise
        return reply

    def _send_acks(self) -> None:
        """Send the deferred acknowledgements alone, taking nothing."""
        assert self.ack_call is not None  # made with the lease, before any take
        self._claim(b"0", self.ack_call)

    def _idle_wait(self, timeout_s: float) -> bool:
        with self.acks.idle() as waiting:
            if waiting:
                self._send_acks()
            return super()._idle_wait(timeout_s)

    def _pop(self) -> Received | None:
        if self.prefetched:
            return self.prefetched.popleft()
        if self.unsure:
            self._give_back_unsure()
        first = self.next_number
        try:
            reply = self._claim(b"%d" % first)
        except BaseException:
            # The take may have run and only its reply be lost: the server then holds
            # bodies under these numbers, which this worker never saw. They are never
            # used again (a later take would overwrite them, and the bodies be gone),
            # and whatever they hold goes back to its set before the next take.
            most = max(self.driver.prefetch, 1)
            numbers = range(first, first + most)
            self.unsure += [(i, n) for i in range(1, len(self.keys) + 1) for n in numbers]
            self.next_number = first + most
            raise
        if not reply:
            return None
        if type(reply) is bytes:  # one body from the first set, its first delivery
            self.next_number += 1
            if 1 not in self.taken_from:
                self.taken_from = self.taken_from | {1}
            return Received(reply, self.priorities[0], (1, b"%d" % first, b""), delivery_count=1)
        self.next_number += len(reply) // 4
        index = int(reply[0])
        if index not in self.taken_from:
            self.taken_from = self.taken_from | {index}
        priority = self.priorities[index - 1]
        taken = [
            Received(
                reply[at + 1],
                priority,
                (index, b"%d" % (first + at // 4), reply[at + 3]),
                delivery_count=int(reply[at + 2]),
            )
            for at in range(0, len(reply), 4)
        ]
        self.prefetched.extend(taken[1:])
        return taken[0]

    def _give_back(self) -> None:
        """Put back at once what was claimed and never handed out (the worker stops)."""
        if self.unsure:
            self._give_back_unsure()
        if not self.prefetched:
            return
        args: list[str | int | bytes] = [WAKE_LIST_CAP]
        for received in self.prefetched:
            index, number, _ = received.token
            args += (index, number)
        keys = [*self.keys, *self.held_keys, *(wake_key(k) for k in self.keys)]
        _scripts.GIVE_BACK(self._execute, keys, args)
        self.prefetched.clear()

    def _give_back_unsure(self) -> None:
        """Put back what a take whose reply was lost may hold; raises while Redis is away."""
        args: list[str | int | bytes] = [WAKE_LIST_CAP]
        for index, number in self.unsure:
            args += (index, number)
        keys = [*self.keys, *self.held_keys, *(wake_key(k) for k in self.keys)]
        back = _scripts.GIVE_BACK(self._execute, keys, args)
        self.unsure = []
        if back:
            logger.warning(
                "%r: put back %d message(s) taken by a call whose reply was lost; they are "
                "delivered again",
                self.driver,
                back,
            )

    def _move_due(self) -> int:
        moved, first, recovered = _scripts.MOVE_DUE_AND_RECOVER(
            self._execute,
            self.move_keys,
            (repr(time.time()), _scripts.MAX_SCRIPT_VALUES, WAKE_LIST_CAP),
            raw=True,
        )
        self.next_due = None if first is None else float(first)
        if recovered:
            logger.warning(
                "%r: put back %d message(s) held by workers whose lease ran out (they "
                "died or stalled); they are delivered again",
                self.driver,
                recovered,
            )
        if moved >= _scripts.MAX_SCRIPT_VALUES:
            self.move_at = 0.0  # more than one call moves: come back at once
        else:
            self.move_at = time.monotonic() + MOVE_INTERVAL_S
        return int(moved) + int(recovered)

    def _renew(self) -> None:
        """Extend the lease on each set taken from (the :class:`LeaseKeeper` calls it).

        Runs on the keeper's thread, which translates what it raises.
        """
        indexes = sorted(self.taken_from)
        if not indexes:
            return
        keys = [self.lease_keys[index - 1] for index in indexes]
        lost = _scripts.RENEW(self.driver._execute, keys, (self.lease_ms, self.owner), raw=True)
        for position in lost:
            index = indexes[int(position) - 1]
            logger.warning(
                "%r: the lease of %s on %r ran out before it was renewed: what it held was "
                "put back, and another worker may get those messages while their handlers "
                "still run",
                self.driver,
                self.owner,
                self.keys[index - 1],
            )
