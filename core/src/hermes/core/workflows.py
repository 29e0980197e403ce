"""Workflows: chains and groups of jobs, and callbacks that fire once when a group ends.

They need job records (:mod:`hermes.core.jobs`): the workers' Dispatcher
given ``records=`` (``hermes worker --results-url``) keeps their bookkeeping,
and the application starts them through :class:`Workflows` on the same
store::

    from hermes.core import connect
    from hermes.core.jobs import Jobs
    from hermes.core.workflows import Workflows, chain, group, job

    driver = connect("redis://localhost:6379/0")
    flows = Workflows(driver, Jobs("redis://localhost:6379/0"))
    handle = flows.start(
        chain(
            group(job("thumbnail", {"image": n}) for n in range(100)),
            job("album.ready", {"album": 7}, receive="thumbnails"),
        )
    )
    handle.wait(timeout=300)  # "succeeded", "failed" or "cancelled"

``album.ready`` runs once, after all 100 thumbnails ended, with their
outcomes in ``message.payload["thumbnails"]["result"]``; with the chain's
default ``on_failure="stop"`` it runs only if every one succeeded.
"""

from hermes.core.app._jobs import WORKFLOW_HEADER
from hermes.core.app._workflows import (
    FANOUT,
    ROOT_PREFIX,
    Chain,
    Group,
    Job,
    WorkflowHandle,
    Workflows,
    chain,
    group,
    job,
    outcome_of,
    parent_of,
    root_of,
)

__all__ = [
    "FANOUT",
    "ROOT_PREFIX",
    "WORKFLOW_HEADER",
    "Chain",
    "Group",
    "Job",
    "WorkflowHandle",
    "Workflows",
    "chain",
    "group",
    "job",
    "outcome_of",
    "parent_of",
    "root_of",
]
