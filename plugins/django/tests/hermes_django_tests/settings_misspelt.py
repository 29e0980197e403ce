"""The test project with a misspelt backend option, as a user might write it."""

from __future__ import annotations

from hermes_django_tests.settings import *  # noqa: F403
from hermes_django_tests.settings import TASKS

TASKS["default"]["OPTIONS"] = {  # type: ignore[index]
    "url": "redis://127.0.0.1:6379/12?prefix=hermes-django-misspelt:",
    "result_url": "redis://127.0.0.1:6379/12?prefix=hermes-django-misspelt:",
}
