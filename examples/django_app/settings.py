"""Settings of the Django example: a view that emits a job, and a view that enqueues a task.

export HERMES_URL=redis://localhost:6379/0
python -m django runserver --settings examples.django_app.settings
hermes worker --url redis://localhost:6379/0 --handlers examples.django_app.worker:handlers
python -m django hermes_worker --settings examples.django_app.settings   # the @task functions
"""

from __future__ import annotations

import importlib.util
import os

SECRET_KEY = "django-example-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
ROOT_URLCONF = "examples.django_app.urls"
INSTALLED_APPS = ["hermes.django", "examples.django_app"]
if importlib.util.find_spec("django.tasks") is None:  # Django 5.2: the backport is an app
    INSTALLED_APPS.insert(0, "django_tasks")
MIDDLEWARE: list[str] = []
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True

#: The broker the views emit to and the worker reads.
HERMES_URL = os.environ.get("HERMES_URL", "redis://localhost:6379/0")


def tasks_setting(url: str) -> dict[str, object]:
    """Django's task framework on Hermes: tasks and their job records on ``url``."""
    return {
        "default": {
            "BACKEND": "hermes.django.HermesBackend",
            "QUEUES": ["default"],
            # Sent when the request's transaction commits, never if it rolls back.
            "OPTIONS": {"url": url, "results_url": url, "enqueue_on_commit": True},
        }
    }


TASKS = tasks_setting(HERMES_URL)
