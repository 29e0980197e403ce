"""RedisShutdown: PHP Hermes's shutdown through one Redis key."""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

logger = logging.getLogger("hermes.drivers.redis")


class RedisShutdown:
    """Shut down the workers that watch a Redis key, as PHP Hermes's ``RedisShutdown``.

    The key holds an integer UNIX timestamp. A worker stops when
    ``start <= timestamp <= now``, with ``start`` its start time in whole
    seconds (as PHP compares it), so a request made before a worker started
    does not stop it, and a timestamp in the future stops workers when it comes.

    ``should_shutdown`` is one ``GET``. When Redis cannot be read it answers
    False (and logs a warning once per outage): a worker does not stop, or
    crash, because the shutdown key is out of reach; SIGTERM still stops it.
    """

    def __init__(self, client: redis.Redis[Any], key: str = "hermes_shutdown") -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"RedisShutdown key must be a non-empty string, got {key!r}")
        self.client = client
        #: The key that holds the shutdown timestamp.
        self.key = key
        #: An outage is logged once, not at every check.
        self._unreadable = False

    def should_shutdown(self, start_time: float) -> bool:
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
            return False
        if self._unreadable:
            self._unreadable = False
            logger.info("RedisShutdown reads %r again", self.key)
        if value is None:
            return False
        try:
            requested = int(float(value))
        except (ValueError, OverflowError):
            logger.warning(
                "RedisShutdown ignores %r: it holds %r, not a UNIX timestamp", self.key, value
            )
            return False
        return int(start_time) <= requested <= time.time()

    def shutdown(self, at: float | None = None) -> bool:
        """Ask the workers watching the key, started by ``at`` (now), to stop when it comes."""
        self.client.set(self.key, int(time.time() if at is None else at))
        return True

    def __repr__(self) -> str:
        return f"RedisShutdown(key={self.key!r})"
