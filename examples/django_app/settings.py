"""Settings of the Django example: just enough for a view that emits a job.

export HERMES_URL=redis://localhost:6379/0
python -m django runserver --settings examples.django_app.settings
hermes worker --url redis://localhost:6379/0 --handlers examples.django_app.worker:handlers
"""

from __future__ import annotations

import os

SECRET_KEY = "django-example-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
ROOT_URLCONF = "examples.django_app.urls"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True

#: The broker the views emit to and the worker reads.
HERMES_URL = os.environ.get("HERMES_URL", "redis://localhost:6379/0")
