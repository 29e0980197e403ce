"""``hermes shutdown``: ask running workers to stop after the message in progress."""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING

from hermes.core._cli._common import URL_ENV, CliError, clock
from hermes.core.spi._registry import connect, driver_for_url
from hermes.core.spi._shutdown import SharedFileShutdown
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands


def add_parser(commands: Commands) -> None:
    """``hermes shutdown``: a URL or a file to ask workers through."""
    shutdown = commands.add_parser(
        "shutdown",
        help="ask running workers to stop",
        description="Ask the workers started before now to stop after the message in progress.",
    )
    target = shutdown.add_mutually_exclusive_group()
    target.add_argument(
        "--url",
        help="a redis:// URL: the workers that watch its key <prefix>hermes_shutdown stop: "
        "hermes worker on the same URL, and PHP and Python Dispatchers given RedisShutdown "
        f"(default: ${URL_ENV})",
    )
    target.add_argument("--file", metavar="F", help="workers started with --shutdown-file F stop")
    shutdown.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    now = time.time()
    if args.file:
        try:
            SharedFileShutdown(args.file).shutdown(now)
        except OSError as exc:
            raise CliError(f"cannot touch the shutdown file {args.file}: {exc.strerror}") from None
        print(
            f"Asked every worker watching {args.file} (--shutdown-file) and started before "
            f"{clock(now)} to stop after the message in progress",
            flush=True,
        )
        return 0
    url = args.url or os.environ.get(URL_ENV)
    if not url:
        raise CliError(
            "say which workers to stop: --file F (workers started with --shutdown-file F) "
            f"or --url redis://HOST:PORT/DB (workers on that Redis; ${URL_ENV} works too)"
        )
    plugin, parsed = driver_for_url(url)
    if plugin.shutdown is None:
        raise CliError(
            f"shutdown by URL needs Redis (redis:// or rediss://) or another driver whose "
            f"broker keeps the request, not {parsed.scheme}://; start workers with "
            "--shutdown-file F and stop them with hermes shutdown --file F"
        )
    with connect(url) as driver:
        request = plugin.shutdown(driver)
        request.shutdown(now)
    # Only workers that check this request stop: hermes worker does on this URL, a
    # Dispatcher of your own (Python or PHP) only when it was given the same shutdown.
    print(
        f"Set {request!r} on {redact_url(url)}: the workers that watch it and started "
        f"before {clock(now)} stop after the message in progress (hermes worker on this "
        "broker does; a Dispatcher of your own, Python or PHP, only if given that shutdown)",
        flush=True,
    )
    return 0
