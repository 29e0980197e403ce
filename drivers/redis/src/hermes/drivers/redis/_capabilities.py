"""What :class:`RedisSetDriver` promises, importable without redis-py.

The plugin module reads it for ``available_drivers()``, which every
``connect()`` triggers; it must not pay for importing the client library.
"""

from __future__ import annotations

from hermes.core.driver import Capabilities, Delay, Delivery

#: ``SPOP`` before the callback (at most once), a sorted set for ``execute_at``,
#: one set per priority, any number of workers on one set.
CAPABILITIES = Capabilities(
    delivery=Delivery.AT_MOST_ONCE,
    delay=Delay.NATIVE,
    priorities=True,
    competing_consumers=True,
    max_message_bytes=16 * 1024 * 1024,
    # An idle worker blocks on the server until a message arrives.
    wake_up_s=0.0,
)
