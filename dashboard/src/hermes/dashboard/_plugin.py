"""hermes-dashboard's Hermes plugin: it adds ``hermes dashboard`` to the ``hermes`` command.

Only the parser is built here: ``hermes`` builds every command's parser on
each run, so Starlette, uvicorn and Jinja2 are imported when the dashboard
starts, not when someone runs ``hermes emit``.
"""

from __future__ import annotations

import argparse

from hermes.core import hookimpl


@hookimpl
def hermes_cli_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hermes.dashboard import _cli

    _cli.add_parser(commands)
