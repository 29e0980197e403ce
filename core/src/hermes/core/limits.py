"""Fleet-wide rate and concurrency limits per message type.

A :class:`~hermes.core.Limit` is declared beside a type's handlers
(``@handlers.handler("charge", limit=Limit(rate="100/m"))``) or with
``hermes worker --limit``; every worker asks the store named by
``--limits-url`` (``Dispatcher(..., limit_store=...)``) before a job of a
limited type starts. What that store holds now, as ``hermes stats`` and the
dashboard show it::

    from hermes.core import connect
    from hermes.core.limits import Limiter

    for usage in Limiter(connect("redis://localhost:6379/0")).usage():
        print(usage.key, usage.running, usage.waiting)
"""

from hermes.core.app._limits import LIMIT_HEADER, Limit, Limiter, parse_limit, parse_rate
from hermes.core.spi._limits import LimitUsage, SupportsLimits

__all__ = [
    "LIMIT_HEADER",
    "Limit",
    "LimitUsage",
    "Limiter",
    "SupportsLimits",
    "parse_limit",
    "parse_rate",
]
