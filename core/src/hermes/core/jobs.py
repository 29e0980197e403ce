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

A job cancelled while it runs (:meth:`JobHandle.cancel`, ``hermes jobs
cancel``) is told through its record: an ``async`` handler's task is
cancelled; a sync handler checks :func:`current_job` and stops by raising::

    from hermes.core.jobs import current_job

    def export(message):
        job = current_job()  # without records nothing cancels it: the check never raises
        for chunk in chunks(message.payload):
            job.raise_if_cancelled()  # JobCancelled: the job ends cancelled
            write(chunk)
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
from hermes.core.app._watch import RunningJob, current_job
from hermes.core.model._errors import (
    JobCancelled,
    JobResultError,
    JobTimeoutError,
    UnknownJobError,
)

__all__ = [
    "DEFAULT_TTL_S",
    "Attempt",
    "JobCancelled",
    "JobError",
    "JobHandle",
    "JobRecord",
    "JobResultError",
    "JobState",
    "JobTimeoutError",
    "Jobs",
    "RunningJob",
    "UnknownJobError",
    "current_job",
]
