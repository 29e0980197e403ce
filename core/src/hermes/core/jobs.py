"""Following jobs: their records, states, results, and cancel.

Records are off unless a store is named: ``Jobs("redis://localhost:6379/0")``
(any driver that can keep records: memory, filesystem, Redis, PostgreSQL),
given to the :class:`~hermes.core.Emitter` (``records=``) and the worker's
:class:`~hermes.core.Dispatcher` (``records=``, or ``hermes worker
--results-url``)::

    from hermes.core import Emitter, Message, connect
    from hermes.core.jobs import Jobs

    jobs = Jobs("redis://localhost:6379/0")
    emitter = Emitter(connect("redis://localhost:6379/0"), records=jobs)
    message = Message("invoice.total", {"order": 7})
    emitter.emit(message)
    total = emitter.job(message).result(timeout=30)

A handler keeps a value by returning :class:`~hermes.core.Result`.
"""

from hermes.core.app._jobs import (
    DEFAULT_TTL_S,
    Attempt,
    JobError,
    JobHandle,
    JobRecord,
    Jobs,
    JobState,
)
from hermes.core.model._errors import JobResultError, JobTimeoutError, UnknownJobError

__all__ = [
    "DEFAULT_TTL_S",
    "Attempt",
    "JobError",
    "JobHandle",
    "JobRecord",
    "JobResultError",
    "JobState",
    "JobTimeoutError",
    "Jobs",
    "UnknownJobError",
]
