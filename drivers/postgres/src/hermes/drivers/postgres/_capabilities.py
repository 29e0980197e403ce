"""What :class:`PostgresDriver` promises, importable without psycopg.

The plugin module reads it for ``available_drivers()``, which every
``connect()`` triggers; it must not pay for importing the client library.
"""

from __future__ import annotations

from hermes.core.driver import Capabilities, Delay, Delivery

#: How long a claimed row stays leased without a renewal (the URL's ``lease_timeout``).
LEASE_TIMEOUT_S = 30.0
#: The longest an idle worker goes without looking at the table (``poll_interval``):
#: what catches a lease that ran out, as no notification announces that.
POLL_INTERVAL_S = 1.0

#: Deleted on ack, held until ``execute_at``, priorities in one table, any number
#: of workers. A driver object reports its own lease as ``redelivery_timeout_s``.
CAPABILITIES = Capabilities(
    delivery=Delivery.AT_LEAST_ONCE,
    delay=Delay.NATIVE,
    priorities=True,
    competing_consumers=True,
    max_message_bytes=16 * 1024 * 1024,
    redelivery_timeout_s=LEASE_TIMEOUT_S + POLL_INTERVAL_S,
    # The attempts column, incremented by the claim.
    counts_deliveries=True,
    # An idle worker LISTENs; a send NOTIFYs in its transaction.
    wake_up_s=0.0,
)
