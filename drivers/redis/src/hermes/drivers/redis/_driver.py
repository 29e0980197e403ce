"""RedisSetDriver: PHP Hermes 4.x's Redis set driver, on redis-py."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.connection import Connection
from redis.exceptions import AuthenticationError, AuthorizationError

from hermes.core import (
    DEFAULT_PRIORITY,
    BrokerUnavailableError,
    Callback,
    ConfigurationError,
    DeliveryError,
    Driver,
    DriverError,
    Message,
    SerializeError,
)
from hermes.drivers.redis import _scripts
from hermes.drivers.redis._capabilities import CAPABILITIES

logger = logging.getLogger("hermes.drivers.redis")

#: Longest an idle worker blocks on Redis before it checks shutdown again.
MAX_IDLE_WAIT_S = 1.0
#: How often a busy worker moves due scheduled messages (an idle one does it every loop).
MOVE_INTERVAL_S = 0.1
#: Tokens a wake list holds at most: how many idle workers one burst can wake at once.
WAKE_LIST_CAP = 32
#: Redis wakes blocked clients on its ``hz`` tick (100 ms by default); a shorter
#: wait for a scheduled message is a plain sleep instead.
_SHORT_WAIT_S = 0.1
#: Backoff between reconnect attempts: doubles from the first to the cap.
_BACKOFF_FIRST_S = 0.1
_BACKOFF_CAP_S = 2.0

#: Errors after which a new connection may work; everything else is raised.
_RECONNECTABLE = (redis.ConnectionError, redis.TimeoutError)
_REFUSED = (AuthenticationError, AuthorizationError)


def wake_key(queue_key: str) -> str:
    """The list an emitter pushes a token to after adding to ``queue_key``.

    Idle workers block on it (``BLPOP``), so a Python emitter wakes them at
    once; producers that do not push (PHP Hermes) are found by the periodic
    re-check instead.
    """
    return f"{queue_key}_wakeup"


def translate_error(exc: redis.RedisError, doing: str, failed: type[DriverError]) -> DriverError:
    """The Hermes error for a redis-py error raised while ``doing`` something.

    The one place the driver maps client exceptions; the caller chains it
    (``raise translate_error(...) from exc``). Unreachable broker ->
    :class:`BrokerUnavailableError`; anything else -> ``failed``.
    """
    if isinstance(exc, _REFUSED):
        return BrokerUnavailableError(f"Redis refused the credentials while {doing}: {exc}")
    if isinstance(exc, _RECONNECTABLE):
        return BrokerUnavailableError(f"Redis is unavailable while {doing}: {exc}")
    return failed(f"Redis failed while {doing}: {type(exc).__name__}: {exc}")


class RedisSetDriver(Driver):
    """Messages in Redis sets, compatible with PHP Hermes 4.x's ``RedisSetDriver``.

    * ``send`` adds the serialized message to the set of its priority
      (``key`` for the default priority 100, the ``name`` given to
      :meth:`setup_priority_queue` for others). A message whose ``execute_at``
      is in the future goes to the sorted set ``schedule_key`` (score =
      ``execute_at``) and is moved to the default-priority set when due, by one
      Lua script, so several workers never move one message twice or lose it.
    * ``wait`` ``SPOP``\\ s a message *before* the callback: delivery is
      at-most-once; a worker that dies mid-handler loses that message.
      Sets are read from the highest priority down.
    * Wake-up: ``send`` also pushes a token to ``<queue>_wakeup`` (capped at
      :data:`WAKE_LIST_CAP`) in the same script call; an idle worker blocks on
      those lists, so it starts a Python-emitted message within a round trip.
      Messages other producers add (PHP) are found within ``refresh_interval``.
    * A set is unordered: messages of one priority come out in no particular
      order, and sending the very same serialized message twice stores it once.
    * The wire format and the default keys are PHP Hermes's, so PHP emitters
      and Python workers (and the reverse) share one Redis.

    ``prefix`` is prepended to every key, like the ``prefix`` option of PHP's
    Predis: ``prefix="app:"`` puts the default set at ``app:hermes``.

    ``refresh_interval`` (seconds, > 0) is the longest an idle worker blocks
    before it looks at the sets and the shutdown again; waits are capped at
    :data:`MAX_IDLE_WAIT_S`, and kept below the client's ``socket_timeout``.
    The driver works across ``fork()`` (redis-py's pool opens new connections
    in the child) and ``send`` is thread-safe (``redis.Redis`` is). One
    ``wait()`` at a time per driver object. When Redis goes away, ``wait``
    logs it and reconnects with backoff; ``send`` tries once more on a fresh
    connection, then raises :class:`BrokerUnavailableError` (other failures:
    :class:`DeliveryError`), so a message is never lost silently.
    ``close_client=True`` makes :meth:`close` close ``client`` (the URL
    factory does this for the client it builds).
    """

    capabilities = CAPABILITIES

    def __init__(
        self,
        client: redis.Redis[Any],
        key: str = "hermes",
        refresh_interval: float = 1,
        schedule_key: str = "hermes_schedule",
        *,
        prefix: str = "",
        close_client: bool = False,
    ) -> None:
        super().__init__()
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
        #: Prepended to every key this driver uses, priority sets included.
        self.prefix = prefix
        #: The Redis key of the default-priority set (with the prefix).
        self.key = prefix + key
        #: The Redis key of the schedule sorted set (with the prefix).
        self.schedule_key = prefix + schedule_key
        self.refresh_interval = float(refresh_interval)
        self._close_client = close_client
        self._execute = _scripts.on_pool(client)
        #: priority -> set key
        self._queues: dict[int, str] = {DEFAULT_PRIORITY: self.key}
        self._idle_wait_s = min(self.refresh_interval, MAX_IDLE_WAIT_S)
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

    def send(self, message: Message, priority: int = DEFAULT_PRIORITY) -> None:
        self._send_bodies([(self.serializer.serialize(message), message.execute_at)], priority)

    def send_batch(self, messages: Sequence[Message], priority: int = DEFAULT_PRIORITY) -> None:
        """Send ``messages`` with one script call per 500 (the calls after the first pipelined)."""
        bodies = [(self.serializer.serialize(m), m.execute_at) for m in messages]
        self._send_bodies(bodies, priority)

    def send_raw(self, body: bytes, priority: int = DEFAULT_PRIORITY) -> None:
        """Add ``body`` to the set of ``priority`` as it is (tests use it for poison messages)."""
        self._send_bodies([(body, None)], priority)

    def _queue_key(self, priority: int) -> str:
        try:
            return self._queues[priority]
        except KeyError:
            raise self.unknown_priority(priority, self._queues) from None

    def _send_bodies(
        self, bodies: Sequence[tuple[str | bytes, float | None]], priority: int
    ) -> None:
        queue = self._queue_key(priority)
        default = self._queues[DEFAULT_PRIORITY]
        keys = (queue, self.schedule_key, wake_key(queue), wake_key(default))
        now = time.time()
        calls: list[list[str | bytes | float | int]] = []
        chunk_size = _scripts.MAX_SCRIPT_VALUES // 2
        for start in range(0, len(bodies), chunk_size):
            chunk = bodies[start : start + chunk_size]
            immediate = [body for body, at in chunk if at is None or at <= now]
            args: list[str | bytes | float | int] = [WAKE_LIST_CAP, len(immediate), *immediate]
            for body, at in chunk:
                if at is not None and at > now:
                    args += [repr(at), body]
            calls.append(args)
        if not calls:
            return
        try:
            # The first call loads the script if the server lacks it; a pipeline
            # cannot fall back from EVALSHA to EVAL per command.
            _scripts.SEND(self._execute, keys, calls[0])
            if len(calls) > 1:
                self._send_pipelined(keys, calls[1:])
        except redis.RedisError as exc:
            raise translate_error(exc, f"sending to {queue!r} on {self!r}", DeliveryError) from exc

    def _send_pipelined(
        self, keys: Sequence[str], calls: Sequence[Sequence[str | bytes | float | int]]
    ) -> None:
        with self.client.pipeline(transaction=False) as pipe:
            for args in calls:
                pipe.evalsha(_scripts.SEND.sha, len(keys), *keys, *args)
            pipe.execute()

    # Receiving -----------------------------------------------------------------

    def wait(self, callback: Callback, priorities: Sequence[int] = ()) -> None:
        order = self.check_priorities(self._queues, priorities)
        receiver = _Receiver(self, [self._queues[p] for p in order])
        try:
            self._receive_until_stopped(receiver, callback, order)
        finally:
            receiver.release()

    def _receive_until_stopped(
        self, receiver: _Receiver, callback: Callback, order: Sequence[int]
    ) -> None:
        failures = 0
        while not self.should_stop():
            try:
                popped = receiver.receive()
            except redis.RedisError as exc:
                # Refused credentials are connection errors too, but no retry fixes them.
                if isinstance(exc, _REFUSED) or not isinstance(exc, _RECONNECTABLE):
                    raise translate_error(exc, f"waiting on {self!r}", DriverError) from exc
                failures += 1
                self._back_off(exc, failures)
                continue
            if failures:
                logger.info("%r: Redis is back after %d failed attempt(s)", self, failures)
                failures = 0
            if popped is None:
                continue
            index, body = popped
            try:
                message = self.serializer.unserialize(body)
            except SerializeError as exc:
                logger.error(
                    "%r: dropped a body from %r that is not a Hermes message - %s",
                    self,
                    receiver.keys[index],
                    exc,
                )
                continue
            callback(message, order[index])
            self.processed_items += 1

    def _back_off(self, exc: Exception, failures: int) -> None:
        delay = min(_BACKOFF_CAP_S, _BACKOFF_FIRST_S * 2 ** (failures - 1))
        delay *= random.uniform(0.5, 1.0)  # workers that lost Redis together do not return together
        logger.warning(
            "%r: Redis is unavailable (attempt %d), reconnecting in %.2f s - %s: %s",
            self,
            failures,
            delay,
            type(exc).__name__,
            exc,
        )
        self.pause(delay)

    # Housekeeping --------------------------------------------------------------

    def purge(self) -> None:
        """Delete every set, the schedule and the wake lists this driver uses."""
        keys = {self.schedule_key}
        for queue in self._queues.values():
            keys |= {queue, wake_key(queue)}
        try:
            self.client.delete(*sorted(keys))
        except redis.RedisError as exc:
            raise translate_error(exc, f"purging {self!r}", DriverError) from exc

    def close(self) -> None:
        if self._close_client:
            self.client.close()

    def __repr__(self) -> str:
        pool = self.client.connection_pool
        kwargs = pool.connection_kwargs
        scheme = "rediss" if issubclass(pool.connection_class, redis.SSLConnection) else "redis"
        where = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        if "path" in kwargs:
            where = f"unix:{kwargs['path']}"
        return f"<RedisSetDriver {scheme}://{where}/{kwargs.get('db', 0)} key={self.key!r}>"


class _Receiver:
    """One ``wait()``'s reading state: its connection, its sets, the scheduler clock.

    A worker holds one connection for all its reads (blocking reads need one
    anyway) and talks to it directly: redis-py's per-command pool and retry
    bookkeeping would cost more than the round trip. A failed connection is
    dropped by redis-py and opened again by the next command.
    """

    def __init__(self, driver: RedisSetDriver, keys: list[str]) -> None:
        self.driver = driver
        self.pool = driver.client.connection_pool
        self.connection: Connection | None = None
        #: The sets to read, highest priority first.
        self.keys = keys
        self.wake_keys = list(dict.fromkeys(wake_key(k) for k in keys))
        default_key = driver._queues[DEFAULT_PRIORITY]
        self.move_keys = (driver.schedule_key, default_key, wake_key(default_key))
        #: ``time.monotonic()`` after which the next pop first moves due messages.
        self.move_at = 0.0
        #: ``execute_at`` of the earliest scheduled message, as of the last move.
        self.next_due: float | None = None
        #: The last idle wait ended on a wake-up token: a message was just sent.
        self.woken = False

    def execute(self, command: Sequence[Any], raw: bool) -> Any:
        if self.connection is None:
            self.connection = self.pool.get_connection()
        self.connection.send_command(*command)
        return self.connection.read_response(disable_decoding=raw)

    def release(self) -> None:
        if self.connection is not None:
            self.pool.release(self.connection)
            self.connection = None

    def receive(self) -> tuple[int, bytes] | None:
        """One message as (index into ``keys``, body), or None after an idle wait.

        Moves due scheduled messages every :data:`MOVE_INTERVAL_S` while busy
        and always before it sleeps, so nothing due is left waiting. Woken by
        a send, it pops first: the new message is handled after one round trip.
        """
        popped_first = self.woken or time.monotonic() < self.move_at
        self.woken = False
        if popped_first:
            popped = self._pop()
            if popped is not None:
                return popped
        moved = self._move_due()
        if moved or not popped_first:
            popped = self._pop()
            if popped is not None:
                return popped
        self.woken = self._idle_wait()
        return None

    def _pop(self) -> tuple[int, bytes] | None:
        if len(self.keys) == 1:
            body = self.execute(("SPOP", self.keys[0]), True)
            return None if body is None else (0, body)
        reply = _scripts.POP_FIRST(self.execute, self.keys, raw=True)
        if reply is None:
            return None
        return int(reply[0]) - 1, reply[1]

    def _move_due(self) -> int:
        """Move due scheduled messages to the default-priority set; how many."""
        moved, first = _scripts.MOVE_DUE(
            self.execute,
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

    def _idle_wait(self) -> bool:
        """Wait for a wake-up token or the next due message; True if a token came."""
        timeout = self.driver._idle_wait_s
        if self.next_due is not None:
            timeout = min(timeout, self.next_due - time.time())
        if timeout <= 0 or self.driver.should_stop():
            return False
        if timeout < _SHORT_WAIT_S:
            time.sleep(timeout)
            return False
        return self.execute(("BLPOP", *self.wake_keys, round(timeout, 3)), True) is not None
