"""What :class:`FileSystemDriver` promises, importable without the driver.

The plugin module reads it for ``available_drivers()``, which every
``connect()`` triggers, whatever the scheme: a worker on another broker does
not pay for importing this driver.
"""

from __future__ import annotations

from hermes.core.driver import Capabilities, Delay, Delivery

CAPABILITIES = Capabilities(
    delivery=Delivery.AT_LEAST_ONCE,
    delay=Delay.NATIVE,
    priorities=True,
    competing_consumers=True,
    cross_process=True,
    max_message_bytes=16 * 1024 * 1024,
    redelivery_timeout_s=1.0,
    counts_deliveries=True,
    # An idle worker looks at new/ every poll_interval_s (the default here).
    wake_up_s=0.02,
)
