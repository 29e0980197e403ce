"""``--limit`` and ``--limits-url``: fleet-wide limits on the command line, and their table."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from hermes.core._cli._common import CliError
from hermes.core.app._dispatcher import Dispatcher
from hermes.core.app._limits import Limiter, parse_limit
from hermes.core.model._errors import ConfigurationError
from hermes.core.spi._driver import Driver
from hermes.core.spi._limits import LimitUsage, SupportsLimits
from hermes.core.spi._url import redact_url

LIMITS_URL_ENV = "HERMES_LIMITS_URL"


def add_limit_options(worker: argparse.ArgumentParser) -> None:
    """``hermes worker --limit TYPE:SPEC --limits-url URL``."""
    worker.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="TYPE:SPEC",
        help="hold jobs of TYPE to a fleet-wide limit, replacing one the handlers declare: "
        "TYPE:rate=100/m, TYPE:concurrency=5, or both and key=FIELD (a limit per value of "
        "that payload field), burst=N, lease=SECONDS, comma-separated (repeat for several types)",
    )
    worker.add_argument(
        "--limits-url",
        metavar="URL",
        help="keep the limits' state in this store, shared by every worker of the fleet: "
        "memory://, file://, redis://, postgresql:// (default: "
        f"${LIMITS_URL_ENV}, else --url when its driver can keep limits)",
    )


def limits_url(args: argparse.Namespace) -> str | None:
    return getattr(args, "limits_url", None) or os.environ.get(LIMITS_URL_ENV) or None


def apply_limits(args: argparse.Namespace, dispatcher: Dispatcher) -> None:
    """Set ``--limit`` on ``dispatcher`` and check its store; a mistake is one line, exit 2."""
    for text in getattr(args, "limit", ()):
        try:
            type_, limit = parse_limit(text)
        except ConfigurationError as exc:
            raise CliError(str(exc)) from None
        dispatcher.limit(type_, limit)
    url = limits_url(args)
    if url is not None:
        dispatcher.limit_store = url
    if not dispatcher.limits:
        return
    try:
        dispatcher.limiter()
    except ConfigurationError as exc:
        where = f"--limits-url {redact_url(url)}" if url is not None else "--limit"
        raise CliError(f"{where}: {exc}") from None


def describe_limits(dispatcher: Dispatcher) -> list[str]:
    """One line per limited type, for the worker's start-up lines."""
    return [f"{type_}: {limit.describe()}" for type_, limit in sorted(dispatcher.limits.items())]


def usage_of(driver: Driver) -> list[LimitUsage] | None:
    """What the limits kept by ``driver`` say now; None when it keeps none."""
    if not isinstance(driver, SupportsLimits):
        return None
    return Limiter(driver).usage()


def limits_table(rows: Sequence[LimitUsage]) -> str:
    """The limits as an aligned text table."""
    header = ["limit", "running", "waiting", "mean run s"]
    lines = [[u.key, f"{u.running:,}", f"{u.waiting:,}", f"{u.avg_s:.3g}"] for u in rows]
    widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()
        for cells in [header, *lines]
    )
