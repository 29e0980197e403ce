"""The ``hermes`` command, assembled from one module per command (``_cli/_<command>.py``).

Results (emitted ids, counts, tables) go to stdout; log lines and errors to
stderr. Exit codes: 0 done; 2 a mistake the user can fix (bad URL, unknown
scheme, unreachable broker, bad JSON, handlers that do not import), shown as
one line on stderr without a traceback (``-vv`` adds it); 130 interrupted.
Anything else is a bug and keeps its traceback.

:func:`priority_queue_name` is the name the commands give a priority's queue,
for code that sets the same queue up itself.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from hermes.core._cli._common import CliError, describe_error, print_error, print_traceback
from hermes.core.model._errors import HermesError
from hermes.core.spi import _entry_points
from hermes.core.spi._queues import priority_queue_name
from hermes.core.spi._registry import notify, plugin_manager

__all__ = ["build_parser", "main", "priority_queue_name"]

#: The commands in the order ``hermes --help`` lists them; each is the module
#: ``hermes.core._cli._<command>``, which adds its own parser.
COMMANDS = (
    "worker",
    "workers",
    "emit",
    "failed",
    "jobs",
    "drivers",
    "plugins",
    "shutdown",
    "stats",
    "purge",
    "scheduler",
    "demo",
)
#: Commands whose parser another command's module adds.
_MODULE_OF = {"job": "jobs", "cancel": "jobs"}


def _version() -> str:
    return _entry_points.version("hermes-core") or "unknown"


class _VersionAction(argparse.Action):
    """``--version``: the installed hermes-core's, looked up when asked for.

    argparse's own version action takes the string when the parser is built,
    and finding it lists every installed distribution (about 2 ms with the
    observer plugins installed): a worker, which never prints it, paid for that
    at every start.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the installed hermes-core's version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"hermes-core {_version()}")
        parser.exit()


def _terminal_width() -> int:
    """The width argparse wraps help to: ``$COLUMNS``, else the terminal's, else 80.

    What ``shutil.get_terminal_size`` answers, without importing shutil (and
    with it zlib, bz2 and lzma) into every worker, which never prints help.
    """
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        return int(columns)
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str, **kwargs: Any) -> None:
        kwargs.setdefault("width", _terminal_width() - 2)  # argparse's own margin
        super().__init__(prog, **kwargs)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake as one line on stderr like every other mistake.

    argparse prints the whole usage block before its error; ``--help`` still
    shows it, and the line says so.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print_error(f"{self.prog}: {message} (`{self.prog} --help` shows the usage)")
        raise SystemExit(2)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``hermes`` parser; with ``only`` (a command), that command's alone.

    Each command's module is imported to add its parser: a worker does not
    wait for the demo's, the scheduler's or the failed store's imports.
    """
    parser = _Parser(
        prog="hermes",
        description="Hermes background jobs: run workers, emit messages, list drivers.",
        epilog="Start with `hermes demo`: the whole story on a temporary queue, no server.",
    )
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    module = _MODULE_OF.get(only, only) if only is not None else None
    for command in (module,) if module in COMMANDS else COMMANDS:
        importlib.import_module(f"hermes.core._cli._{command}").add_parser(commands)
    if module not in COMMANDS:
        # Commands of other distributions (hermes-dashboard's `hermes dashboard`), after core's.
        notify(plugin_manager().hook.hermes_cli_commands, commands=commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hermes`` command; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command != "worker":
        # `hermes drivers | head -1` ends quietly, like any Unix tool. A worker keeps
        # Python's default: a closed stdout must not kill it in the middle of a handler.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return int(args.run(args))
    except CliError as exc:
        print_error(str(exc), exc.context)
    except HermesError as exc:
        if getattr(args, "verbose", 0) > 1:
            print_traceback(exc)
        print_error(describe_error(exc))
    except KeyboardInterrupt:
        print("hermes: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
