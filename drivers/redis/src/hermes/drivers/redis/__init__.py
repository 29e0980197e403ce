"""Hermes on Redis, compatible with PHP Hermes 4.x on the same server.

``connect("redis://localhost:6379/0")`` builds a :class:`RedisSetDriver`;
:class:`RedisShutdown` stops workers through a Redis key.
"""

from hermes.drivers.redis._driver import RedisSetDriver, wake_key
from hermes.drivers.redis._shutdown import RedisShutdown

__all__ = ["RedisSetDriver", "RedisShutdown", "wake_key"]
