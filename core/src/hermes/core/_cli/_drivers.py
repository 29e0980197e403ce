"""``hermes drivers``: the installed drivers and what each promises."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hermes.core.spi._registry import KNOWN_DISTRIBUTIONS, available_drivers

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands

_COLUMNS = ("NAME", "DISTRIBUTION", "VERSION", "SCHEMES", "DELIVERY", "DELAY", "PRIORITIES")


def add_parser(commands: Commands) -> None:
    """``hermes drivers``: no options."""
    drivers = commands.add_parser(
        "drivers",
        help="list installed drivers and their capabilities",
        description="The installed drivers: distribution, URL schemes and what each promises.",
    )
    drivers.set_defaults(run=run)


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def run(args: argparse.Namespace) -> int:
    drivers = available_drivers()
    rows = [list(_COLUMNS)]
    installed: set[str] = set()
    for driver in drivers:
        caps = driver.capabilities
        installed.update(driver.schemes)
        rows.append(
            [
                driver.name,
                driver.distribution or "-",
                driver.version or "-",
                ", ".join(f"{scheme}://" for scheme in driver.schemes),
                caps.delivery.value,
                caps.delay.value,
                "yes" if caps.priorities else "no",
            ]
        )
    for line in table(rows):
        print(line)
    missing: dict[str, list[str]] = {}
    for scheme, dist in KNOWN_DISTRIBUTIONS.items():
        if scheme not in installed:
            missing.setdefault(dist, []).append(f"{scheme}://")
    if missing:
        print()
        print("Not installed:")
        for dist, schemes in sorted(missing.items()):
            print(f"  {', '.join(schemes):<20} pip install {dist}")
    return 0
