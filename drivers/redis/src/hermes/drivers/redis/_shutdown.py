"""RedisShutdown: PHP Hermes's shutdown through one Redis key."""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from hermes.core.drivertools import SHUTDOWN_CHECK_INTERVAL_S

logger = logging.getLogger("hermes.drivers.redis")


class RedisShutdown:
    """Shut down the workers that watch a Redis key, as PHP Hermes's ``RedisShutdown``.

    The key holds an integer UNIX timestamp. A worker stops when
    ``start <= timestamp <= now``, with ``start`` its start time in whole
    seconds (as PHP compares it), so a request made before a worker started
    does not stop it, and a timestamp in the future stops workers when it comes.

    ``should_shutdown`` reads the key (one ``GET``) at most every
    ``check_interval_s`` seconds and answers from that read in between, so a
    busy worker pays one round trip per interval, not one per message, and
    stops at most that much later; ``check_interval_s=0`` reads at every
    check. :meth:`shutdown` on this object is seen at once. When Redis cannot
    be read it answers False (and logs a warning once per outage): a worker
    does not stop, or crash, because the shutdown key is out of reach;
    SIGTERM still stops it.
    """

    def __init__(
        self,
        client: redis.Redis[Any],
        key: str = "hermes_shutdown",
        *,
        check_interval_s: float = SHUTDOWN_CHECK_INTERVAL_S,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"RedisShutdown key must be a non-empty string, got {key!r}")
        if isinstance(check_interval_s, bool) or not check_interval_s >= 0:
            raise ValueError(
                f"RedisShutdown check_interval_s must be a number of seconds >= 0, "
                f"got {check_interval_s!r}"
            )
        self.client = client
        #: The key that holds the shutdown timestamp.
        self.key = key
        self.check_interval_s = float(check_interval_s)
        #: The timestamp the key held at the last read (None: no usable value).
        self._requested: int | None = None
        #: ``time.monotonic()`` from which the next check reads the key again.
        self._read_at = 0.0
        #: An outage is logged once, not at every read.
        self._unreadable = False
        #: The last unusable value logged, so it is logged once, not at every read.
        self._ignored: object = None

    def should_shutdown(self, start_time: float) -> bool:
        now = time.monotonic()
        if now >= self._read_at:
            self._read_at = now + self.check_interval_s
            self._requested = self._read()
        requested = self._requested
        return requested is not None and int(start_time) <= requested <= time.time()

    def _read(self) -> int | None:
        try:
            value = self.client.get(self.key)
        except redis.RedisError as exc:
            if not self._unreadable:
                self._unreadable = True
                logger.warning(
                    "RedisShutdown cannot read %r, assuming no shutdown until it can - %s: %s",
                    self.key,
                    type(exc).__name__,
                    exc,
                )
            return None
        if self._unreadable:
            self._unreadable = False
            logger.info("RedisShutdown reads %r again", self.key)
        if value is None:
            return None
        try:
            return int(float(value))
        except (ValueError, OverflowError):
            if value != self._ignored:
                self._ignored = value
                logger.warning(
                    "RedisShutdown ignores %r: it holds %r, not a UNIX timestamp", self.key, value
                )
            return None

    def shutdown(self, at: float | None = None) -> bool:
        """Ask the workers watching the key, started by ``at`` (now), to stop when it comes."""
        self.client.set(self.key, int(time.time() if at is None else at))
        self._read_at = 0.0
        return True

    def __repr__(self) -> str:
        return f"RedisShutdown(key={self.key!r})"
