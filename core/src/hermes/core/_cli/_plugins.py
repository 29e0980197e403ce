"""``hermes plugins``: every Hermes plugin installed and the hooks it implements."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hermes.core._cli._drivers import table
from hermes.core.spi._registry import installed_plugins

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands


def add_parser(commands: Commands) -> None:
    """``hermes plugins``: no options."""
    plugins = commands.add_parser(
        "plugins",
        help="list installed plugins and the hooks they implement",
        description="Every Hermes plugin (entry-point group hermes): drivers and observers "
        "such as hermes-prometheus, with the hooks each implements.",
    )
    plugins.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    rows = [["NAME", "DISTRIBUTION", "VERSION", "HOOKS"]]
    for plugin in installed_plugins():
        hooks = ", ".join(hook.removeprefix("hermes_") for hook in plugin.hooks)
        rows.append([plugin.name, plugin.distribution or "-", plugin.version or "-", hooks])
    for line in table(rows):
        print(line)
    return 0
