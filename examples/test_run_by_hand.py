"""The "run it by hand" commands of the web framework pages name what exists.

Each page's shell block (docs/integrations/*.md) starts a development server
and a ``hermes worker``: servers a test cannot leave running on a shared
machine's usual ports, so the apps and their workers are run by the tests
beside this one instead (the framework's test client, Redis and a real
``hermes worker``). What this test holds is that the commands a reader
copies name modules that import and handlers that load: the server's app,
Django's settings, and the worker's ``--handlers``.
"""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from hermes.core import HandlerRegistry
from hermes.core._cli._loading import load_object

PAGES = sorted((Path(__file__).resolve().parents[1] / "docs" / "integrations").glob("*.md"))


def commands(page: Path) -> list[list[str]]:
    blocks = re.findall(r"^```sh\n(.*?)^```$", page.read_text(), re.M | re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.strip()]


def named(argv: list[str]) -> list[tuple[str, str]]:
    """What a command line names: (what, ``module`` or ``module:attr``)."""
    found = []
    for at, word in enumerate(argv[:-1]):
        if word in ("--app", "--settings", "--handlers"):
            found.append((word, argv[at + 1]))
    if argv[0] == "uvicorn":
        found.append(("uvicorn", argv[1]))
    return found


@pytest.mark.parametrize("page", [p for p in PAGES if commands(p)], ids=lambda p: p.stem)
def test_the_server_and_worker_a_page_starts_import(page: Path) -> None:
    names = [name for argv in commands(page) for name in named(argv)]
    kinds = {kind for kind, _ in names}
    assert "--handlers" in kinds, f"{page.name} starts no worker"
    assert kinds & {"--app", "--settings", "uvicorn"}, f"{page.name} starts no server"
    for kind, spec in names:
        if kind == "--handlers":
            assert isinstance(load_object(spec), HandlerRegistry), spec
        else:
            module, _, attr = spec.partition(":")
            loaded = importlib.import_module(module)
            assert not attr or callable(getattr(loaded, attr)), spec
