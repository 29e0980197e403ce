"""``hermes`` for the benchmark: ``python -m bench.hermes_cli [--observe NAME] worker ...``.

The same ``hermes.core.cli.main()`` the console script runs, with every
observer plugin installed in the environment (an entry point of the
``hermes`` group under ``hermes.plugins``: Prometheus, OpenTelemetry, Sentry)
blocked, except the one ``--observe`` names. So a ``hermes worker`` row
measures a worker nobody observes whatever the venv holds (``./run``'s has
every plugin), and an observed row differs from it by that one plugin, the
launcher being the same.

The blocked plugins are not even imported: the registry skips an entry point
whose name is blocked when it loads them, so the names are blocked on the
manager before that load. (Blocking after it would unregister them but leave
prometheus_client, sentry_sdk and opentelemetry imported: about 6 MB more in
the idle RSS row.) Core has no public switch for this; the bench reaches for
the registry's loader, and fails loudly if it is gone.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def observers() -> list[str]:
    """The names of the observer plugins installed here (drivers are ``hermes.drivers.*``).

    Read as core's registry reads them (not with importlib.metadata, whose import
    would add to the start-up of every worker the benchmark times).
    """
    from hermes.core.spi import _entry_points

    return sorted(
        entry_point.name
        for entry_point in _entry_points.entry_points("hermes")
        if entry_point.value.startswith("hermes.plugins.")
    )


def block_observers(keep: Sequence[str] = ()) -> None:
    """Block every observer plugin of this process but ``keep``; call before anything connects."""
    import pluggy

    from hermes.core.spi import _registry

    blocked = [name for name in observers() if name not in keep]
    registry = _registry._registry
    if registry._manager is None:
        load = registry._load_entry_points

        def load_unblocked(manager: pluggy.PluginManager) -> None:
            for name in blocked:
                manager.set_blocked(name)
            load(manager)

        registry._load_entry_points = load_unblocked  # type: ignore[method-assign]
    manager = _registry.plugin_manager()
    for name in blocked:
        # Already loaded (something connected first): pluggy unregisters it.
        manager.set_blocked(name)


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    keep = []
    while args[:1] == ["--observe"]:
        keep.append(args[1])
        del args[:2]
    missing = [name for name in keep if name not in observers()]
    if missing:
        # A row named after a plugin that is not there would silently measure nothing.
        print(f"bench.hermes_cli: observer plugin(s) not installed: {missing}", file=sys.stderr)
        return 2
    block_observers(keep)
    from hermes.core.cli import main as hermes_main

    return hermes_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
