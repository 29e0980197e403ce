"""The Django app ``hermes.django``: ``manage.py hermes_worker``, and the admin's Hermes pages."""

from __future__ import annotations

from django.apps import AppConfig


class HermesDjangoConfig(AppConfig):
    name = "hermes.django"
    #: Not ``django``: an app label must not read as Django's own.
    label = "hermes_django"
    verbose_name = "Hermes"
    default_auto_field = "django.db.models.AutoField"
