"""The test project: PostgreSQL for the app's data, Redis for its tasks, and the admin.

The broker and records URLs come from the environment, so a test's worker
process (``manage.py hermes_worker``) and the test itself use the queue of
that test; the tests point the backend at it with ``override_settings``. The
database is one the test run creates for itself (see ``conftest.py``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from urllib.parse import urlsplit

#: The project's directory, what ``hermes_worker --reload`` watches (another one for a test).
BASE_DIR = Path(os.environ.get("HERMES_DJANGO_BASE_DIR") or Path(__file__).resolve().parent.parent)
SECRET_KEY = "hermes-django-tests-only-not-a-secret"
DEBUG = False
USE_TZ = True
ROOT_URLCONF = "hermes_django_tests.urls"
ALLOWED_HOSTS = ["testserver", "127.0.0.1"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "hermes.django",
    "hermes_django_tests.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
if importlib.util.find_spec("django.tasks") is None:  # Django 5.2: the backport is an app
    INSTALLED_APPS.insert(0, "django_tasks")

_database = urlsplit(
    os.environ.get("HERMES_DJANGO_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _database.path.lstrip("/"),
        "USER": _database.username or "postgres",
        "HOST": _database.hostname or "127.0.0.1",
        "PORT": _database.port or 5432,
        # Persistent connections, checked before reuse: a worker keeps its
        # connection between jobs, as in production.
        "CONN_MAX_AGE": None,
        "CONN_HEALTH_CHECKS": True,
    }
}

#: Django priorities with a queue of their own (0 always has one).
PRIORITIES = [-10, 10]


def tasks_setting(url: str, results_url: str | None, **options: object) -> dict[str, object]:
    """The ``TASKS`` setting for a backend on ``url``."""
    backend_options: dict[str, object] = {
        "url": url,
        "priorities": PRIORITIES,
        # Sent by a worker started with --scheduler, beside the @periodic tick task.
        "periodic": {
            "label-from-settings": {
                "task": "hermes_django_tests.shop.tasks.label",
                "every": 1,
                "args": ["from settings"],
            }
        },
        **options,
    }
    if results_url is not None:
        backend_options["results_url"] = results_url
    return {
        "default": {
            "BACKEND": "hermes.django.HermesBackend",
            "QUEUES": ["default", "reports"],
            "OPTIONS": backend_options,
        }
    }


TASKS = tasks_setting(
    os.environ.get("HERMES_DJANGO_URL", "redis://127.0.0.1:6379/12?prefix=hermes-django-unset:"),
    os.environ.get("HERMES_DJANGO_RESULTS_URL")
    or "redis://127.0.0.1:6379/12?prefix=hermes-django-unset:",
    **(
        {"failed_url": os.environ["HERMES_DJANGO_FAILED_URL"]}
        if os.environ.get("HERMES_DJANGO_FAILED_URL")
        else {}
    ),
)
