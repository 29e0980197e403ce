"""Two models without tables: the admin's entries for Hermes's job records and failed store.

Neither has rows: the pages read the records store and the failed store of
the ``default`` task backend (``OPTIONS["results_url"]``, ``["failed_url"]``).
They exist for what Django's admin builds on models: a place in the admin's
index, and permissions given to users and groups as any others are
(``hermes_django.view_job``; ``hermes_django.view_failedjob`` to see failed
tasks, ``hermes_django.change_failedjob`` to retry them).
"""

from __future__ import annotations

from django.db import models


class Job(models.Model):
    """A task's job record, as the records store keeps it."""

    class Meta:
        managed = False
        default_permissions = ("view",)
        verbose_name = "job"


class FailedJob(models.Model):
    """A task a worker gave up on, as the failed store keeps it; retried by changing it."""

    class Meta:
        managed = False
        default_permissions = ("view", "change")
        verbose_name = "failed job"
