"""``hermes drivers`` and ``hermes plugins``: what is installed and what it offers."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from hermes.core._registry import KNOWN_DISTRIBUTIONS, available_drivers, installed_plugins

_COLUMNS = ("NAME", "DISTRIBUTION", "VERSION", "SCHEMES", "DELIVERY", "DELAY", "PRIORITIES")


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


def run_plugins(args: argparse.Namespace) -> int:
    rows = [["NAME", "DISTRIBUTION", "VERSION", "HOOKS"]]
    for plugin in installed_plugins():
        hooks = ", ".join(hook.removeprefix("hermes_") for hook in plugin.hooks)
        rows.append([plugin.name, plugin.distribution or "-", plugin.version or "-", hooks])
    for line in table(rows):
        print(line)
    return 0
