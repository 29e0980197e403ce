"""Settings of the Django example: a view that emits a job, and a view that enqueues a task.

Orders on PostgreSQL (``$DATABASE_URL``), jobs on Redis (``$HERMES_URL``):

export HERMES_URL=redis://localhost:6379/0 DATABASE_URL=postgresql://postgres@localhost:5432/test
python -m django migrate --settings examples.django_app.settings
python -m django runserver --settings examples.django_app.settings
hermes worker --url redis://localhost:6379/0 --handlers examples.django_app.worker:handlers
python -m django hermes_worker --settings examples.django_app.settings   # the @task functions
"""

from __future__ import annotations

import importlib.util
import os
from urllib.parse import urlsplit

SECRET_KEY = "django-example-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
ROOT_URLCONF = "examples.django_app.urls"
INSTALLED_APPS = ["hermes.django", "examples.django_app"]
if importlib.util.find_spec("django.tasks") is None:  # Django 5.2: the backport is an app
    INSTALLED_APPS.insert(0, "django_tasks")
MIDDLEWARE: list[str] = []
#: The app's data on PostgreSQL (``python -m django migrate`` creates the orders table).
_database = urlsplit(os.environ.get("DATABASE_URL", "postgresql://postgres@localhost:5432/test"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _database.path.lstrip("/"),
        "USER": _database.username or "postgres",
        "PASSWORD": _database.password or "",
        "HOST": _database.hostname or "localhost",
        "PORT": _database.port or 5432,
        # A worker keeps its connection between jobs; hermes_worker replaces one
        # that broke (close_old_connections() around each job).
        "CONN_MAX_AGE": None,
        "CONN_HEALTH_CHECKS": True,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
USE_TZ = True

#: The broker the views emit to and the worker reads.
HERMES_URL = os.environ.get("HERMES_URL", "redis://localhost:6379/0")


#: The Django priority of an express order's receipt.
EXPRESS = 10


def tasks_setting(url: str) -> dict[str, object]:
    """Django's task framework on Hermes: tasks and their job records on ``url``."""
    return {
        "default": {
            "BACKEND": "hermes.django.HermesBackend",
            "QUEUES": ["default"],
            # Sent when the request's transaction commits, never if it rolls back.
            "OPTIONS": {
                "url": url,
                "results_url": url,
                "enqueue_on_commit": True,
                "priorities": [EXPRESS],  # a queue for express receipts, read first
            },
        }
    }


TASKS = tasks_setting(HERMES_URL)
