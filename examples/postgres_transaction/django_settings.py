"""Settings of the Django recipe: the database Hermes's queue lives in too."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

_db = urlsplit(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))

SECRET_KEY = "django-example-only-not-a-secret"
INSTALLED_APPS: list[str] = []
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3 when it is installed
        "NAME": _db.path.lstrip("/"),
        "USER": _db.username or "",
        "PASSWORD": _db.password or "",
        "HOST": _db.hostname or "",
        "PORT": str(_db.port or 5432),
    }
}
