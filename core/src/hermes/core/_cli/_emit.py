"""``hermes emit``: put one message (or ``--count`` of them) on a broker."""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from hermes.core._cli._common import (
    URL_HELP,
    CliError,
    add_verbosity,
    clock,
    configure_logging,
    default_url,
    named_queues,
    queue_of,
    queue_option,
    seconds,
    setup_priorities,
    whole_number,
)
from hermes.core._cli._jobs import RESULTS_URL_ENV, add_results_url, open_jobs, results_url
from hermes.core.app._emitter import Emitter, expiring
from hermes.core.model._message import Message
from hermes.core.spi._driver import DEFAULT_PRIORITY, Delay, SupportsClaim
from hermes.core.spi._queues import priority_queue_name
from hermes.core.spi._registry import connect
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands

#: Messages per ``send_batch`` call.
BATCH_SIZE = 100
#: Seconds between two progress lines of ``--count``.
PROGRESS_EVERY_S = 1.0
#: Characters of the bad JSON shown around the fault.
_EXCERPT_WIDTH = 60


def add_parser(commands: Commands) -> None:
    """``hermes emit``: its arguments and options."""
    emit = commands.add_parser(
        "emit",
        help="put a message on the broker",
        description="Emit a message of TYPE with a JSON payload.",
    )
    emit.add_argument("--url", help=URL_HELP)
    emit.add_argument("type", metavar="TYPE", help="the message type handlers are registered for")
    emit.add_argument(
        "payload",
        metavar="PAYLOAD_JSON",
        nargs="?",
        help="the payload as JSON, or - to read it from stdin (default: null)",
    )
    where = emit.add_mutually_exclusive_group()
    where.add_argument(
        "--priority",
        type=int,
        default=DEFAULT_PRIORITY,
        metavar="P",
        help=f"priority queue, higher first (default {DEFAULT_PRIORITY}); a priority other "
        "than the default needs a queue the URL's priority_queues names (else use --queue)",
    )
    where.add_argument(
        "--queue",
        type=queue_option,
        metavar="NAME:P",
        help="like --priority P, sending to the queue NAME, e.g. --queue hermes_high:200 for a "
        "PHP deployment's queue",
    )
    when = emit.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, metavar="SECONDS", help="not before SECONDS from now")
    when.add_argument(
        "--at",
        metavar="TIMESTAMP",
        help="not before this UNIX timestamp or ISO 8601 date-time",
    )
    emit.add_argument(
        "--count",
        type=whole_number(1),
        default=1,
        metavar="N",
        help="emit N messages; shows the rate",
    )
    emit.add_argument(
        "--unique-for",
        type=seconds,
        metavar="SECONDS",
        help="a unique job: skip the emit when one with the same --unique-key (default: the "
        "message id) was emitted in the last SECONDS (needs redis://, file://, postgresql:// "
        "or memory://)",
    )
    emit.add_argument("--unique-key", metavar="KEY", help="with --unique-for: what makes it unique")
    emit.add_argument(
        "--expires-in",
        type=seconds,
        metavar="SECONDS",
        help="a worker that takes the message later than SECONDS from now acknowledges it "
        "without running a handler (with records on: recorded as expired)",
    )
    add_results_url(
        emit,
        "start each message's job record in this store (waiting, or scheduled), to follow "
        f"it with hermes job ID (default: ${RESULTS_URL_ENV}; unset: no record until a worker "
        "with --results-url takes it)",
    )
    add_verbosity(emit)
    emit.set_defaults(run=run)


def parse_payload(text: str, source: str) -> Any:
    """The JSON value in ``text``; a fault is a :class:`CliError` with the line and a caret."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        lines = exc.doc.splitlines() or [""]
        line = lines[min(exc.lineno, len(lines)) - 1].replace("\t", " ")
        column = exc.colno - 1
        start = max(0, column - _EXCERPT_WIDTH // 2)
        excerpt = line[start : start + _EXCERPT_WIDTH]
        prefix = "  …" if start else "  "
        suffix = "…" if start + _EXCERPT_WIDTH < len(line) else ""
        raise CliError(
            f"{source} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
            context=[prefix + excerpt + suffix, " " * (len(prefix) + column - start) + "^"],
        ) from None


def check_payload(payload: Any, source: str) -> None:
    """Refuse a JSON string, number or boolean: a message's payload is an object, an array
    or null (what a PHP Hermes worker on the same queue accepts)."""
    if payload is None or isinstance(payload, dict | list):
        return
    if isinstance(payload, bool):
        kind = "a boolean"
    elif isinstance(payload, str):
        kind = "a string"
    else:
        kind = "a number"
    shown = json.dumps(payload)
    if len(shown) > _EXCERPT_WIDTH:
        shown = shown[: _EXCERPT_WIDTH - 1] + "…"
        example = '{"value": …}'
    else:
        example = f'{{"value": {shown}}}'
    raise CliError(
        f"{source} must be a JSON object, an array or null, not {kind} ({shown}); "
        f"wrap it in an object, e.g. '{example}'"
    )


def parse_at(text: str) -> float:
    """``--at``: a UNIX timestamp, or an ISO 8601 date-time (local time unless it has an offset)."""
    try:
        return float(text)
    except ValueError:
        # Not a timestamp: try ISO 8601 next; the error below names both forms.
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(
            f"--at {text!r} is neither a UNIX timestamp (1764480000) nor an ISO 8601 "
            "date-time (2025-11-30T12:00:00)"
        ) from None
    return moment.timestamp()


def run(args: argparse.Namespace) -> int:
    if args.payload == "-":
        source = "the payload on stdin"
        payload = parse_payload(sys.stdin.read(), source)
    elif args.payload is not None:
        source = "PAYLOAD_JSON"
        payload = parse_payload(args.payload, source)
    else:
        source, payload = "", None
    check_payload(payload, source)
    execute_at: float | None = None
    if args.delay is not None:
        if args.delay < 0:
            raise CliError(f"--delay {args.delay:g} must be >= 0 seconds")
        execute_at = time.time() + args.delay
    elif args.at is not None:
        execute_at = parse_at(args.at)
    try:
        first = Message(args.type, payload, execute_at=execute_at)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.unique_key is not None and args.unique_for is None:
        raise CliError("--unique-key needs --unique-for SECONDS")
    configure_logging(args.verbose - args.quiet, default_level=logging.WARNING)

    url: str = args.url or default_url()
    given = [args.queue] if args.queue else []
    from_cli, from_url = named_queues(url, given)
    priority: int = args.queue[1] if args.queue else args.priority
    queue = from_cli.get(priority) or from_url.get(priority)
    with connect(url) as driver:
        if queue is None and priority != DEFAULT_PRIORITY:
            # As Emitter.emit() from Python: a queue nobody named is one no worker reads
            # unless told, and a message sent there silently waits forever.
            raise CliError(
                f"priority {priority} has no queue on {redact_url(url)}: a worker reads "
                f"priority {DEFAULT_PRIORITY} and the URL's priority_queues unless told "
                f"otherwise; name the queue with --queue {priority_queue_name(driver, priority)}:"
                f"{priority} (and start the worker with the same --queue or --priority "
                f"{priority}), or add it to the URL's priority_queues"
            )
        setup_priorities(driver, [priority], from_cli, preset=from_url)
        # The broker's own name (Redis: the key with its prefix), to compare with the worker's.
        key = queue_of(driver, priority) or queue
        shown = f"priority:{priority}" + (f" ({key})" if key else "")
        if execute_at is not None and driver.capabilities.delay is Delay.IGNORED:
            print(
                f"note: {type(driver).__name__} delivers at once (delay {Delay.IGNORED.value}); "
                "execute_at is kept in the message",
                file=sys.stderr,
            )
        due = f", execute_at {clock(execute_at)}" if execute_at is not None else ""
        records_url = results_url(args, required=False)
        records = open_jobs(records_url) if records_url is not None else None
        try:
            emitter = Emitter(driver, records=records)
            if args.unique_for is not None:
                where = f"{shown}{due} to {redact_url(url)}"
                return _emit_unique(emitter, first, priority, args, where)
            if args.count == 1:
                emitter.emit(first, priority, expires_in=args.expires_in)
                print(first.id, flush=True)  # stdout holds the id alone: id=$(hermes emit ...)
                if args.verbose - args.quiet >= 0:
                    print(
                        f"Emitted message #{first.id} ({first.type}) {shown}{due} to "
                        f"{redact_url(url)}",
                        file=sys.stderr,
                        flush=True,
                    )
                return 0
            started = time.monotonic()
            _emit_many(emitter, first, args.count, priority, args.expires_in)
            elapsed = max(time.monotonic() - started, 1e-9)
            print(
                f"Emitted {args.count} messages ({first.type}) {shown}{due} "
                f"to {redact_url(url)} in {elapsed:.2f} s: {args.count / elapsed:,.0f} msg/s",
                file=sys.stderr,
                flush=True,
            )
        finally:
            if records is not None:
                records.close()
    return 0


def _emit_unique(
    emitter: Emitter, message: Message, priority: int, args: argparse.Namespace, where: str
) -> int:
    """``--unique-for``: emit unless the key was emitted within the window; exit 0 either way."""
    if args.count != 1:
        raise CliError("--unique-for emits one message: leave out --count")
    driver = emitter.driver
    if not isinstance(driver, SupportsClaim):
        raise CliError(
            f"--unique-for needs a broker that can claim keys (redis://, file://, postgresql://); "
            f"{type(driver).__name__} cannot"
        )
    key = args.unique_key or message.id
    if emitter.emit(
        message,
        priority,
        unique_for=args.unique_for,
        unique_key=key,
        expires_in=args.expires_in,
    ):
        print(message.id, flush=True)
        print(f"Emitted message #{message.id} ({message.type}) {where}", file=sys.stderr)
    else:
        # Nothing on stdout: no message was sent, so there is no id to follow.
        print(
            f"Skipped message #{message.id} ({message.type}): unique:{message.type}:{key} was "
            f"emitted in the last {args.unique_for:g} s",
            file=sys.stderr,
            flush=True,
        )
    return 0


def _emit_many(
    emitter: Emitter, first: Message, count: int, priority: int, expires_in: float | None
) -> None:
    """Send ``first`` and ``count - 1`` copies with fresh ids, in batches; print each id."""
    if expires_in is not None:
        first = expiring(first, expires_in)
    batch_size = BATCH_SIZE
    messages = itertools.chain(
        [first],
        (
            Message(first.type, first.payload, execute_at=first.execute_at, headers=first.headers)
            for _ in range(count - 1)
        ),
    )
    progress = _Progress(count)
    started = last_report = time.monotonic()
    sent = 0
    while batch := list(itertools.islice(messages, batch_size)):
        emitter.emit_batch(batch, priority)
        print("\n".join(message.id for message in batch), flush=True)
        sent += len(batch)
        now = time.monotonic()
        if now - last_report >= PROGRESS_EVERY_S:
            last_report = now
            progress.show(sent, sent / (now - started))
    progress.done()


class _Progress:
    """``12,000/100,000 messages, 9,870 msg/s`` on stderr: redrawn on a terminal, else a line."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()
        self.drawn = False

    def show(self, sent: int, rate: float) -> None:
        text = f"{sent:,}/{self.total:,} messages, {rate:,.0f} msg/s"
        if self.tty:
            print(f"\r{text}", end="", file=sys.stderr, flush=True)
            self.drawn = True
        else:
            print(text, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.drawn:
            print(file=sys.stderr, flush=True)
