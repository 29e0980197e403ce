"""``hermes stats``: what each queue holds."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hermes.core._cli._common import (
    URL_HELP,
    CliError,
    add_found_queues,
    add_verbosity,
    clock,
    configure_logging,
    default_url,
    known_queues_note,
    named_queues,
    seconds,
    setup_priorities,
)
from hermes.core._cli._limits import LIMITS_URL_ENV, limits_table, limits_url, usage_of
from hermes.core.spi._door import translate_errors
from hermes.core.spi._driver import Driver, QueueStats, SupportsStats
from hermes.core.spi._limits import LimitUsage
from hermes.core.spi._registry import connect
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands

#: Columns of the stats table: (QueueStats field, heading).
_COLUMNS = (
    ("ready", "ready"),
    ("scheduled", "scheduled"),
    ("in_flight", "in flight"),
    ("set_aside", "set aside"),
)
#: What the table shows for a count the broker cannot give.
UNKNOWN = "?"


def add_parser(commands: Commands) -> None:
    """``hermes stats``: its options."""
    stats = commands.add_parser(
        "stats",
        help="count what each priority queue holds",
        description="Per priority queue: messages ready, scheduled (held until execute_at), "
        "in flight (taken, not acknowledged) and set aside (quarantined or dead-lettered). "
        "? marks a count the broker cannot give.",
    )
    stats.add_argument("--url", help=URL_HELP)
    stats.add_argument(
        "--priority",
        type=int,
        action="append",
        default=[],
        metavar="P",
        help="also show the queue of this priority (repeat for several)",
    )
    stats.add_argument(
        "--watch",
        type=seconds,
        metavar="SECONDS",
        help="refresh every SECONDS (in place on a terminal) until Ctrl-C",
    )
    stats.add_argument("--json", action="store_true", help="one JSON document per refresh")
    stats.add_argument(
        "--limits-url",
        metavar="URL",
        help=f"also show the limits kept in this store (default: ${LIMITS_URL_ENV}, else --url)",
    )
    add_verbosity(stats)
    stats.set_defaults(run=run)


def _stats(driver: Driver, url: str) -> list[QueueStats]:
    if not isinstance(driver, SupportsStats):
        raise CliError(
            f"{type(driver).__name__} ({redact_url(url)}) cannot count its queues: "
            "it does not implement queue_stats()"
        )
    with translate_errors(driver, "counting its queues"):
        return driver.queue_stats()


def _limits(driver: Driver) -> list[LimitUsage] | None:
    with translate_errors(driver, "reading its limits"):
        return usage_of(driver)


def table(rows: Sequence[QueueStats]) -> str:
    """The stats as an aligned text table; unknown counts as ``?``."""
    header = ["priority", "queue", *(heading for _, heading in _COLUMNS)]
    lines = [
        [str(row.priority), row.name]
        + [UNKNOWN if (v := getattr(row, f)) is None else f"{v:,}" for f, _ in _COLUMNS]
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header))]

    def render(cells: list[str]) -> str:
        parts = [
            cell.ljust(width) if i == 1 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join(render(cells) for cells in [header, *lines])


def run(args: argparse.Namespace) -> int:
    url: str = args.url or default_url()
    configure_logging(args.verbose - args.quiet, default_level=logging.WARNING)
    _, from_url = named_queues(url, [])
    with contextlib.ExitStack() as stack:
        driver = stack.enter_context(connect(url))
        store_url = limits_url(args)
        limits_driver = stack.enter_context(connect(store_url)) if store_url else None
        setup_priorities(driver, args.priority, preset=from_url)
        while True:
            finds = add_found_queues(driver)
            rows = _stats(driver, url)
            limits = _limits(limits_driver or driver)
            now = time.time()
            if args.json:
                document = {
                    "url": redact_url(url),
                    "at": now,
                    "queues": [dataclasses.asdict(row) for row in rows],
                    "every_queue": finds,
                    "limits": [
                        {**dataclasses.asdict(u), "waiting": u.waiting} for u in limits or []
                    ],
                }
                print(json.dumps(document), flush=True)
            else:
                if args.watch and sys.stdout.isatty():
                    print("\x1b[H\x1b[J", end="")  # redraw in place
                print(f"{redact_url(url)} at {clock(now)}")
                print(table(rows))
                if any(getattr(r, f) is None for r in rows for f, _ in _COLUMNS):
                    print(f"{UNKNOWN}: this broker cannot say")
                if not finds:
                    print(known_queues_note(driver))
                if limits:
                    print(limits_table(limits))
                print(end="", flush=True)
            if not args.watch:
                return 0
            try:
                time.sleep(args.watch)
            except KeyboardInterrupt:
                return 0  # the way to end --watch, not a failure
