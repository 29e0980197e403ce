"""The Django app ``hermes.django``: in ``INSTALLED_APPS``, it adds ``manage.py hermes_worker``."""

from __future__ import annotations

from django.apps import AppConfig


class HermesDjangoConfig(AppConfig):
    name = "hermes.django"
    #: Not ``django``: an app label must not read as Django's own.
    label = "hermes_django"
    verbose_name = "Hermes"
