"""The ``hermes`` command: ``worker``, ``emit``, ``drivers``, ``shutdown`` and ``demo``.

Exit codes: 0 done; 2 a mistake the user can fix (bad URL, unknown scheme,
unreachable broker, bad JSON, handlers that do not import), shown as one line
on stderr without a traceback; 130 interrupted. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from importlib import metadata

from hermes.core._cli import _demo, _drivers, _emit, _shutdown, _worker
from hermes.core._cli._common import URL_ENV, CliError, describe_error, print_error
from hermes.core._driver import DEFAULT_PRIORITY
from hermes.core._errors import HermesError

__all__ = ["build_parser", "main"]

_URL_HELP = (
    f"broker URL, e.g. redis://localhost:6379/0 (default: ${URL_ENV}, "
    "else file://./hermes-queue, a queue directory here)"
)


def _version() -> str:
    try:
        return metadata.version("hermes-core")
    except metadata.PackageNotFoundError:
        return "unknown"


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    return parse


def _verbosity(parser: argparse.ArgumentParser, more: str = "debug lines, tracebacks") -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="count", default=0, help=f"more detail: {more}")
    group.add_argument("-q", "--quiet", action="count", default=0, help="only warnings and errors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hermes",
        description="Hermes background jobs: run workers, emit messages, list drivers.",
        epilog="Start with `hermes demo`: the whole story on a temporary queue, no server.",
    )
    parser.add_argument("--version", action="version", version=f"hermes-core {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    worker = commands.add_parser(
        "worker",
        help="handle messages until stopped",
        description="Run a Dispatcher: handle messages from the broker until Ctrl-C, SIGTERM, "
        "--max-items or a shutdown request (hermes shutdown --file F with --shutdown-file F; "
        "on redis:// also hermes shutdown --url, through the key hermes_shutdown, as PHP "
        "Hermes); then print the counts.",
    )
    worker.add_argument("--url", help=_URL_HELP)
    worker.add_argument(
        "--handlers",
        required=True,
        metavar="MODULE:OBJECT",
        help="a function taking the Dispatcher that registers handlers, or a dict of "
        "type -> handler (or list of handlers); the current directory is importable",
    )
    worker.add_argument(
        "--priority",
        type=int,
        action="append",
        default=[],
        metavar="P",
        help="read only the queue of this priority (repeat for several); default: priority "
        f"{DEFAULT_PRIORITY} and the queues the handlers function sets up",
    )
    worker.add_argument(
        "--max-items", type=_count(0), default=0, metavar="N", help="stop after N messages"
    )
    worker.add_argument(
        "--shutdown-file",
        metavar="F",
        help="stop when F is touched after the worker started (hermes shutdown --file F)",
    )
    _verbosity(worker, "a line as each message starts and ends, debug lines, tracebacks")
    worker.set_defaults(run=_worker.run)

    emit = commands.add_parser(
        "emit",
        help="put a message on the broker",
        description="Emit a message of TYPE with a JSON payload.",
    )
    emit.add_argument("--url", help=_URL_HELP)
    emit.add_argument("type", metavar="TYPE", help="the message type handlers are registered for")
    emit.add_argument(
        "payload",
        metavar="PAYLOAD_JSON",
        nargs="?",
        help="the payload as JSON, or - to read it from stdin (default: null)",
    )
    emit.add_argument(
        "--priority",
        type=int,
        default=DEFAULT_PRIORITY,
        metavar="P",
        help=f"priority queue, higher first (default {DEFAULT_PRIORITY})",
    )
    when = emit.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, metavar="SECONDS", help="not before SECONDS from now")
    when.add_argument(
        "--at",
        metavar="TIMESTAMP",
        help="not before this UNIX timestamp or ISO 8601 date-time",
    )
    emit.add_argument(
        "--count", type=_count(1), default=1, metavar="N", help="emit N messages; shows the rate"
    )
    _verbosity(emit)
    emit.set_defaults(run=_emit.run)

    drivers = commands.add_parser(
        "drivers",
        help="list installed drivers and their capabilities",
        description="The installed drivers: distribution, URL schemes and what each promises.",
    )
    drivers.set_defaults(run=_drivers.run)

    shutdown = commands.add_parser(
        "shutdown",
        help="ask running workers to stop",
        description="Ask the workers started before now to stop after the message in progress.",
    )
    target = shutdown.add_mutually_exclusive_group()
    target.add_argument(
        "--url", help=f"a redis:// URL: workers on that Redis stop (default: ${URL_ENV})"
    )
    target.add_argument("--file", metavar="F", help="workers started with --shutdown-file F stop")
    shutdown.set_defaults(run=_shutdown.run)

    demo = commands.add_parser(
        "demo",
        help="the whole story on a temporary queue, no server",
        description="Emit, priorities, a failing handler retried with backoff and a delayed "
        "message, on a temporary file:// queue; finishes in seconds.",
    )
    demo.add_argument(
        "--url",
        help="run it on this broker instead (needs priorities and native delay; "
        "default: a temporary file:// queue)",
    )
    demo.set_defaults(run=_demo.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hermes`` command; returns the exit code."""
    parser = build_parser()
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
        print_error(describe_error(exc))
    except KeyboardInterrupt:
        print("hermes: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
