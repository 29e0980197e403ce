"""Heartbeats: a running worker's record on a broker, for ``hermes workers`` and the dashboard.

``hermes worker`` and ``hermes scheduler`` publish one by themselves; a
:class:`~hermes.core.Worker` run from Python does with ``heartbeat=``::

    Worker(driver, handlers, heartbeat=HeartbeatPublisher(driver, url=url)).run()

``request_stop(registry, worker_id, by)`` asks one of them to stop, as the
dashboard's Stop and ``hermes workers --stop ID`` do, and ``request_quiet(...)``
to take no more jobs and stay alive until stopped (Quiet, ``--quiet-worker``); ``pause(registry,
priority, by)`` and ``resume(...)`` hold a priority back from every worker on
the registry and let it go again, as the dashboard's Queues page and ``hermes
workers --pause/--resume`` do (``paused_priorities(registry)`` says which).
"""

from hermes.core.run._heartbeat import (
    HEARTBEAT_INTERVAL_S,
    MISSED_BEATS,
    HeartbeatPublisher,
    live_workers,
    pause,
    paused_priorities,
    request_quiet,
    request_stop,
    resume,
    scheduler_fields,
    worker_fields,
)

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "MISSED_BEATS",
    "HeartbeatPublisher",
    "live_workers",
    "pause",
    "paused_priorities",
    "request_quiet",
    "request_stop",
    "resume",
    "scheduler_fields",
    "worker_fields",
]
