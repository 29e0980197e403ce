"""``python manage.py hermes_worker``: ``hermes worker`` on the project's tasks.

The command runs Hermes's own ``hermes worker`` in this process, with
``--handlers hermes.django.worker:register`` (every installed app's
``@task`` functions; see :mod:`hermes.django.worker`). Its own options:

``--backend ALIAS``
    the ``TASKS`` entry to work for (default ``default``);
``--queue-name NAME``
    the Django queue to read: the broker URL the backend gives it (default
    ``default``);
``--handlers MODULE:OBJECT``
    Hermes handlers to run beside the tasks, as ``hermes worker --handlers``
    takes them;

and, given bare, ``--scheduler`` sends the periodic tasks of the queue read
(``@periodic``, ``OPTIONS["periodic"]``), once per tick however many workers
run it;

and Django's ``--settings``, ``--pythonpath``, ``--traceback``. Every other
argument goes to ``hermes worker`` unchanged (``--concurrency 4``,
``--processes 2``, ``--max-items 10``, ``-v``, ...; ``-v`` is Hermes's
verbosity here, not Django's). ``--url``, ``--results-url`` and
``--failed-url`` default to the backend's ``OPTIONS``; ``--reload`` watches
the project (``settings.BASE_DIR``, else the current directory) unless
``--reload-dir`` says otherwise. The exit code is ``hermes worker``'s.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from hermes.django._compat import DEFAULT_TASK_QUEUE_NAME

#: Options of this command (and Django's) that take a value; everything else is Hermes's.
OWN_WITH_VALUE = ("--backend", "--queue-name", "--handlers", "--settings", "--pythonpath")
#: Flags of this command (and Django's).
OWN_FLAGS = ("--traceback", "--no-color", "--force-color", "--skip-checks", "-h", "--help")


def split_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(this command's arguments, hermes worker's)``, in their order.

    ``--name value`` and ``--name=value`` of :data:`OWN_WITH_VALUE` and the
    flags of :data:`OWN_FLAGS` are this command's; ``--`` sends all that
    follows to Hermes.
    """
    own: list[str] = []
    hermes: list[str] = []
    items = list(argv)
    index = 0
    while index < len(items):
        item = items[index]
        name = item.split("=", 1)[0]
        if item == "--":
            hermes.extend(items[index + 1 :])
            break
        if name in OWN_WITH_VALUE:
            own.append(item)
            if "=" not in item and index + 1 < len(items):
                own.append(items[index + 1])
                index += 1
        elif item in OWN_FLAGS:
            own.append(item)
        else:
            hermes.append(item)
        index += 1
    return own, hermes


class _Parser(CommandParser):
    """Django's parser for this command's options; the rest are kept for ``hermes worker``."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        own, hermes = split_arguments(sys.argv[2:] if args is None else args)
        parsed = super().parse_args(own, namespace)
        parsed.hermes_args = hermes
        return parsed


class Command(BaseCommand):
    help = (
        "Run hermes worker on every installed app's @task functions. Options other than "
        "--backend, --queue-name, --handlers and Django's go to hermes worker (see "
        "hermes worker --help); --url, --results-url and --failed-url default to the "
        "backend's OPTIONS."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # Django builds the parser itself; it becomes the subclass that keeps Hermes's options.
        parser.__class__ = _Parser
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            default="default",
            metavar="ALIAS",
            help="the TASKS entry (default: default)",
        )
        parser.add_argument(
            "--queue-name",
            default=DEFAULT_TASK_QUEUE_NAME,
            metavar="NAME",
            help="the Django queue to read (default: default)",
        )
        parser.add_argument(
            "--handlers",
            metavar="MODULE:OBJECT",
            help="Hermes handlers to run beside the tasks, as hermes worker --handlers takes them",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from hermes.core.cli import main
        from hermes.django._backend import HermesBackend
        from hermes.django._compat import task_backends
        from hermes.django.worker import BACKEND_ENV, HANDLERS_ENV, QUEUE_ENV

        alias: str = options["backend"]
        try:
            backend = task_backends[alias]
        except Exception as exc:  # Django's InvalidTaskBackendError names the alias
            raise CommandError(f"--backend {alias}: {exc}") from exc
        if not isinstance(backend, HermesBackend):
            raise CommandError(
                f'--backend {alias}: TASKS["{alias}"] is {type(backend).__qualname__}, '
                "not hermes.django.HermesBackend"
            )
        if backend.configuration_error is not None:  # with --skip-checks
            raise CommandError(str(backend.configuration_error))
        queue_name: str = options["queue_name"]
        if backend.queues and queue_name not in backend.queues:
            raise CommandError(
                f'--queue-name {queue_name}: not in TASKS["{alias}"]["QUEUES"] '
                f"{sorted(backend.queues)}"
            )
        hermes: list[str] = list(options.get("hermes_args") or [])
        if not _given(hermes, "--url"):
            hermes[:0] = ["--url", backend.url_of(queue_name)]
        if backend.results_url is not None and not _given(hermes, "--results-url"):
            hermes[:0] = ["--results-url", backend.results_url]
        if backend.failed_url is not None and not _given(hermes, "--failed-url"):
            hermes[:0] = ["--failed-url", backend.failed_url]
        if "--reload" in hermes and not _given(hermes, "--reload-dir"):
            # Like runserver: the project's code, not the package of the handlers function.
            hermes[:0] = ["--reload-dir", str(getattr(settings, "BASE_DIR", None) or os.getcwd())]
        os.environ[BACKEND_ENV] = alias
        os.environ[QUEUE_ENV] = queue_name
        # A bare --scheduler means the periodic tasks of the queue read here.
        hermes = [
            f"--scheduler={SCHEDULE}" if item == "--scheduler" and _bare(hermes, index) else item
            for index, item in enumerate(hermes)
        ]
        if options.get("handlers"):
            os.environ[HANDLERS_ENV] = options["handlers"]
        else:
            os.environ.pop(HANDLERS_ENV, None)
        # A pool forks its workers: none may share a connection this process opened.
        connections.close_all()
        code = main(["worker", "--handlers", "hermes.django.worker:register", *hermes])
        if code:
            sys.exit(code)


#: What a bare ``--scheduler`` runs: the periodic tasks of the worker's queue.
SCHEDULE = "hermes.django.worker:schedule"


def _bare(arguments: Sequence[str], index: int) -> bool:
    """Whether the option at ``index`` is not followed by a value of its own."""
    return index + 1 == len(arguments) or arguments[index + 1].startswith("-")


def _given(arguments: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in arguments)
