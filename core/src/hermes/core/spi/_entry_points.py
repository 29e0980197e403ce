"""Installed distributions' entry points and versions, read without ``importlib.metadata``.

Every ``hermes`` command, and the first ``connect()`` of every process, loads
the ``hermes`` entry points. ``importlib.metadata`` costs about 20 ms to import
(the email parser, zipfile, csv, pathlib) and about 10 ms more to list a
group and read each distribution's metadata: a third of a worker's start-up.
What a group needs is small and specified (the packaging guide's "Entry
points specification" and "Recording installed projects"): the
``entry_points.txt`` of each ``*.dist-info`` (or ``*.egg-info``) directory on
``sys.path``, an INI file whose section is the group; the directory is named
``{name}-{version}.dist-info``. As with ``importlib.metadata``, the first
distribution of a name on ``sys.path`` wins. Zip files on ``sys.path`` are not
read.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any, NamedTuple

_SUFFIXES = (".dist-info", ".egg-info")


class EntryPoint(NamedTuple):
    """One ``name = module:attr`` line of a distribution's ``entry_points.txt``."""

    name: str
    #: ``module`` or ``module:attr.attr``.
    value: str
    #: The distribution that declares it (``hermes-redis``) and its version.
    distribution: str
    version: str

    def load(self) -> Any:
        """Import the module and return the object the value names."""
        module, _, attrs = self.value.partition(":")
        loaded: Any = importlib.import_module(module.strip())
        for attr in filter(None, attrs.strip().split(".")):
            loaded = getattr(loaded, attr)
        return loaded


class _Distribution(NamedTuple):
    name: str
    version: str
    path: str


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distributions() -> list[_Distribution]:
    """Every installed distribution on ``sys.path``, the first of each name only."""
    found: list[_Distribution] = []
    seen: set[str] = set()
    for entry in sys.path:
        try:
            with os.scandir(entry or ".") as listing:
                names = sorted(e.name for e in listing if e.name.endswith(_SUFFIXES))
        except OSError:  # not a directory (a zip file), or not there
            continue
        for dirname in names:
            stem = dirname.rsplit(".", 1)[0]
            # "{name}-{version}": the name has its "-" escaped as "_"; an egg-info of
            # a development install may carry no version ("name.egg-info").
            name, _, rest = stem.partition("-")
            key = _normalize(name)
            if key in seen:
                continue
            seen.add(key)
            version = rest.split("-", 1)[0]
            found.append(_Distribution(key, version, os.path.join(entry or ".", dirname)))
    return found


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group`` that the installed distributions declare."""
    found: list[EntryPoint] = []
    for distribution in _distributions():
        try:
            with open(
                os.path.join(distribution.path, "entry_points.txt"), encoding="utf-8"
            ) as file:
                text = file.read()
        except OSError:  # none declared (or an egg-info that is a file)
            continue
        for name, value in _section(text, group):
            found.append(EntryPoint(name, value, distribution.name, distribution.version))
    return found


def version(distribution: str) -> str | None:
    """The installed version of ``distribution``; None if it is not installed."""
    key = _normalize(distribution)
    for found in _distributions():
        if found.name == key:
            return found.version or None
    return None


def _section(text: str, group: str) -> list[tuple[str, str]]:
    """``(name, value)`` of each line in the INI section ``[group]`` of ``text``."""
    pairs: list[tuple[str, str]] = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1].strip() == group
            continue
        if inside:
            name, sep, value = line.partition("=")
            if sep:
                pairs.append((name.strip(), value.strip()))
    return pairs
