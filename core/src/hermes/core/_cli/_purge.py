"""``hermes purge``: delete the messages waiting in the queues."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from hermes.core._cli._common import (
    URL_HELP,
    CliError,
    add_found_queues,
    add_verbosity,
    configure_logging,
    default_url,
    known_queues_note,
    named_queues,
    queues_looked_at,
    setup_priorities,
)
from hermes.core.spi._door import translate_errors
from hermes.core.spi._driver import SupportsPurge
from hermes.core.spi._registry import connect
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands


def add_parser(commands: Commands) -> None:
    """``hermes purge``: its options."""
    purge = commands.add_parser(
        "purge",
        help="delete the messages waiting in the queues",
        description="Delete the messages waiting (ready and scheduled) in every priority "
        "queue, or in one; messages in flight and set aside stay. Asks first on a terminal.",
    )
    purge.add_argument("--url", help=URL_HELP)
    purge.add_argument("--priority", type=int, metavar="P", help="only the queue of priority P")
    purge.add_argument("--yes", action="store_true", help="do not ask (needed off a terminal)")
    add_verbosity(purge)
    purge.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    url: str = args.url or default_url()
    configure_logging(args.verbose - args.quiet, default_level=logging.WARNING)
    _, from_url = named_queues(url, [])
    with connect(url) as driver:
        wanted = [args.priority] if args.priority is not None else []
        setup_priorities(driver, wanted, preset=from_url)
        if not isinstance(driver, SupportsPurge):
            raise CliError(
                f"{type(driver).__name__} ({redact_url(url)}) cannot delete waiting messages: "
                "it does not implement purge()"
            )
        if args.priority is None:
            finds = add_found_queues(driver)
            which = queues_looked_at(driver) + ("" if finds else f" ({known_queues_note(driver)})")
        else:
            which = f"priority {args.priority}"
        if not args.yes:
            if not sys.stdin.isatty():
                raise CliError(
                    f"hermes purge deletes the waiting messages of {which} on "
                    f"{redact_url(url)}: add --yes to confirm when not on a terminal"
                )
            answer = input(
                f"Delete every message waiting (ready or scheduled) in {which} on "
                f"{redact_url(url)}? [y/N] "
            )
            if answer.strip().lower() not in ("y", "yes"):
                print("Nothing deleted", flush=True)
                return 1
        with translate_errors(driver, "deleting what waits"):
            removed = driver.purge(args.priority)
    print(
        f"Deleted {removed:,} waiting message{'s' if removed != 1 else ''} from {which}",
        flush=True,
    )
    return 0
