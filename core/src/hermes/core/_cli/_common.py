"""What every subcommand shares: the default URL, user errors, log and clock formatting."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar, runtime_checkable

from hermes.core.model._errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    ConfigurationError,
    DriverError,
    HermesError,
)
from hermes.core.spi._door import translate_errors
from hermes.core.spi._driver import DEFAULT_PRIORITY, Driver, SupportsStats
from hermes.core.spi._queues import (
    PRIORITY_QUEUES_OPTION,
    parse_queue,
    parse_queues,
    priority_queue_name,
    url_queues,
)
from hermes.core.spi._registry import available_drivers
from hermes.core.spi._url import DriverUrl, redact_url

if TYPE_CHECKING:
    #: What ``add_subparsers()`` returns: each command's ``add_parser`` adds itself to it.
    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

T = TypeVar("T")

#: The environment variable that names the broker when ``--url`` is not given.
URL_ENV = "HERMES_URL"
#: The environment variable that names the failed-message store when ``--url`` is not given.
FAILED_URL_ENV = "HERMES_FAILED_URL"
#: The queue directory, relative to the current directory, used when neither is given.
DEFAULT_QUEUE_DIR = "hermes-queue"
#: The help of every command's ``--url`` that names the broker.
URL_HELP = (
    f"broker URL, e.g. redis://localhost:6379/0 (default: ${URL_ENV}, "
    "else file://./hermes-queue, a queue directory here, which needs hermes-filesystem)"
)


#: Client libraries that log every failed connection attempt at ERROR, then raise the
#: exception the driver turns into one line (or a logged reconnect): shown with -v only.
_CHATTY_CLIENT_LOGGERS = ("pika",)


class CliError(Exception):
    """A mistake the user can fix: one line on stderr (plus ``context`` lines), exit code 2."""

    def __init__(self, text: str, *, context: Sequence[str] = ()) -> None:
        super().__init__(text)
        #: Lines shown under the error, e.g. the bad JSON and a caret under the fault.
        self.context = tuple(context)


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``minimum`` (to ``maximum``, when given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{value} must be <= {maximum}")
        return value

    return parse


def seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be > 0 seconds")
    return value


def env_default(name: str, parse: Callable[[str], T], fallback: T) -> T:
    """``$name`` parsed as an option would be, else ``fallback``; a bad value is a usage error."""
    text = os.environ.get(name)
    if text is None or text == "":
        return fallback
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        print_error(f"${name}: {exc}")
        raise SystemExit(2) from None


def add_verbosity(
    parser: argparse.ArgumentParser,
    default: object = 0,
    more: str = "-v debug lines, -vv also full tracebacks",
) -> None:
    """``-v``/``-q``, counted into ``args.verbose`` and ``args.quiet``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-v", "--verbose", action="count", default=default, help=f"more detail: {more}"
    )
    group.add_argument(
        "-q", "--quiet", action="count", default=default, help="only warnings and errors"
    )


def default_url(option: str = "--url", what: str = "your broker's URL") -> str:
    """``$HERMES_URL``, else ``file://`` of ``./hermes-queue`` (made absolute).

    The ``file://`` default needs hermes-filesystem; without it (hermes-core and
    another driver only) this is a :class:`CliError` that says what to install or
    give: ``what`` through ``option``, the option this default stands in for.
    """
    url = os.environ.get(URL_ENV)
    if url:
        return url
    from pathlib import Path  # here: a worker given its URL does without

    url = Path(DEFAULT_QUEUE_DIR).resolve().as_uri()
    if not scheme_installed("file"):
        raise CliError(
            f"no {option} and no ${URL_ENV}: the default queue, the directory "
            f"./{DEFAULT_QUEUE_DIR}, needs hermes-filesystem, which is not installed; "
            f"`pip install hermes-filesystem`, or give {what} with {option} or ${URL_ENV}, "
            "e.g. redis://localhost:6379/0"
        )
    return url


def scheme_installed(scheme: str) -> bool:
    """Whether an installed driver handles ``scheme://``."""
    return any(scheme in driver.schemes for driver in available_drivers())


def describe_error(exc: HermesError) -> str:
    """One line for a Hermes error: its text, and the client's own error when not already in it."""
    text = str(exc)
    if isinstance(exc, BrokerUnavailableError):
        text = f"broker unreachable: {text}"
    elif isinstance(exc, BrokerRefusedError):
        text = f"broker refused: {text}"
    elif isinstance(exc, DriverError):
        text = f"broker error: {text}"
    cause = exc.__cause__
    if isinstance(exc, DriverError) and cause is not None and str(cause) not in text:
        text = f"{text} (caused by {type(cause).__name__}: {cause})"
    return one_line(text)


def one_line(text: str) -> str:
    """``text`` on a single line with every URL password masked."""
    return redact_url(" ".join(text.split()))


def print_error(text: str, context: Sequence[str] = ()) -> None:
    print(f"hermes: error: {one_line(text)}", file=sys.stderr, flush=True)
    for line in context:
        print(redact_url(line), file=sys.stderr, flush=True)


def print_traceback(exc: BaseException) -> None:
    """``exc``'s traceback, causes included, on stderr with every secret masked (-vv)."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    print(redact_url(text), file=sys.stderr, flush=True)


def clock(timestamp: float, *, millis: bool = False) -> str:
    """A UNIX timestamp as local ``HH:MM:SS`` (``.mmm`` with ``millis``)."""
    text = time.strftime("%H:%M:%S", time.localtime(timestamp))
    if millis:
        text += f".{int(timestamp % 1 * 1000):03d}"
    return text


def queue_option(text: str) -> tuple[str, int]:
    """An argparse type: ``--queue NAME:PRIORITY``."""
    try:
        return parse_queue(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def named_queues(
    url: str, given: Sequence[tuple[str, int]]
) -> tuple[dict[int, str], dict[int, str]]:
    """``(from --queue, from the URL)``: priority -> queue name, each checked.

    ``connect()`` sets the URL's queues up; a ``--queue`` that names one of
    those priorities otherwise is refused rather than silently winning.
    """
    from_url = url_queues(DriverUrl.parse(url))
    try:
        from_cli = parse_queues([f"{name}:{priority}" for name, priority in given], "--queue")
    except ConfigurationError as exc:
        raise CliError(str(exc)) from None
    for priority, name in from_cli.items():
        if from_url.get(priority, name) != name:
            raise CliError(
                f"--queue {name}:{priority} contradicts the URL's {PRIORITY_QUEUES_OPTION}, "
                f"which names priority {priority} {from_url[priority]!r}; give one of them"
            )
    return from_cli, from_url


def setup_priorities(
    driver: Driver,
    priorities: Iterable[int],
    named: Mapping[int, str] | None = None,
    preset: Collection[int] = (),
) -> None:
    """Set up a queue for each of ``priorities`` so ``send``/``wait`` accept it: under its
    ``named`` name, else (not the default priority) :func:`queue_name`. Priorities in
    ``preset`` (set up by ``connect()`` from the URL) are left alone."""
    named = named or {}
    for priority in sorted(set(priorities) | set(named), reverse=True):
        if priority in named:
            driver.setup_priority_queue(named[priority], priority)
        elif priority != DEFAULT_PRIORITY and priority not in preset:
            driver.setup_priority_queue(priority_queue_name(driver, priority), priority)


@runtime_checkable
class FindsPriorityQueues(Protocol):
    """A driver that can list the priority queues its broker holds (Redis, file://)."""

    def find_priority_queues(self) -> dict[int, str]:
        """Priority -> name of each queue on the broker not set up on this driver."""
        ...


def add_found_queues(driver: Driver) -> bool:
    """Set up the queues the broker holds that this process was not told about.

    Returns whether the driver could look; when it cannot, what the CLI shows
    is the queues it knows, and it says so (:func:`known_queues_note`).
    """
    if not isinstance(driver, FindsPriorityQueues):
        return False
    with translate_errors(driver, "listing its queues"):
        found = driver.find_priority_queues()
    for priority, name in sorted(found.items(), reverse=True):
        driver.setup_priority_queue(name, priority)
    return True


def known_queues_note(driver: Driver) -> str:
    """What a count or a purge covered on a driver that cannot list its queues."""
    return (
        f"{type(driver).__name__} cannot list its queues: these are the ones this process "
        f"knows (priority {DEFAULT_PRIORITY}, the URL's priority_queues, --priority P); "
        "a queue set up elsewhere is not included"
    )


def queues_looked_at(driver: Driver) -> str:
    """``app:hermes_priority_200 (200), app:hermes (100)``: the queues a command covered."""
    if not isinstance(driver, SupportsStats):
        return "every queue this process knows"
    with translate_errors(driver, "counting its queues"):
        rows = driver.queue_stats()
    names = [f"{row.name} ({row.priority})" for row in rows]
    return ", ".join(dict.fromkeys(names))


def queue_of(driver: Driver, priority: int) -> str | None:
    """The broker's name for the queue of ``priority`` where the driver says (Redis: the key)."""
    key_of = getattr(driver, "queue_key", None)
    if not callable(key_of):
        return None
    try:
        key = key_of(priority)
    except HermesError:
        return None
    return key if isinstance(key, str) else None


class LineFormatter(logging.Formatter):
    """``12:00:01 INFO    text``: one line per record, secrets masked.

    With ``tracebacks`` False an exception is summarised on the same line
    (its type and where it was raised) instead of a multi-line traceback.
    """

    def __init__(self, *, tracebacks: bool = False, millis: bool = False, prefix: str = "") -> None:
        super().__init__()
        self.tracebacks = tracebacks
        self.millis = millis
        #: Put before each text: which process of a worker pool wrote the line.
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if not record.name.startswith("hermes"):
            text = f"[{record.name}] {text}"
        text = self.prefix + text
        exc_info = record.exc_info
        if exc_info and exc_info[1] is not None:
            if self.tracebacks:
                text = f"{text}\n{''.join(traceback.format_exception(*exc_info)).rstrip()}"
            else:
                text = f"{text} [{exception_origin(exc_info[1])}]"
        line = f"{clock(record.created, millis=self.millis)} {record.levelname:<7} {text}"
        return redact_url(line)


def raise_site(exc: BaseException) -> str | None:
    """``jobs.py:12``: the file and line that raised ``exc`` (None without a traceback)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    return f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}"


def exception_origin(exc: BaseException) -> str:
    """``ValueError at jobs.py:12``: the exception's type and the line that raised it."""
    site = raise_site(exc)
    return f"{type(exc).__name__} at {site}" if site else type(exc).__name__


def configure_logging(
    verbosity: int, *, default_level: int = logging.INFO, prefix: str = ""
) -> None:
    """Log to stderr, one line per event (stdout is for results: ids, counts, tables).

    ``verbosity`` -1 (-q) shows warnings and errors only; 1 (-v) adds Hermes's
    DEBUG lines; 2 (-vv) also full tracebacks instead of ``[ValueError at jobs.py:12]``.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter(tracebacks=verbosity > 1, prefix=prefix))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    if verbosity < 0:
        root.setLevel(logging.WARNING)
    else:
        root.setLevel(default_level if verbosity == 0 else min(default_level, logging.INFO))
    logging.getLogger("hermes").setLevel(logging.DEBUG if verbosity > 0 else logging.NOTSET)
    for name in _CHATTY_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbosity > 0 else logging.CRITICAL)
