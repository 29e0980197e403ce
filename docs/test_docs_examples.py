"""Every ```python block of the documentation runs, page by page.

The blocks of one page run in order, as one script, in a fresh interpreter in
an empty directory: a later block may use what an earlier one defined, as a
reader would. Pages that include a README (``--8<-- "drivers/redis/README.md"``)
are read with it included. Two kinds of block are left out, each marked where
it stands:

* ``python title="path"``: a file of the repository shown as it is (the
  example apps), run by its own tests;
* a block right after ``<!-- not-run: why -->``: it needs a server or names
  things of your application; the comment says which.

A one-line ``<!-- test: code -->`` comment is code the page's script runs at
that point, hidden from the reader: a stand-in for the application's own
objects (``mailer``), the messages a worker example is to handle, or a check
of what the example printed.

Most examples run on ``memory://`` or ``file://``; a few name the local Redis
of CI (127.0.0.1:6379) and only construct a driver, writing no key.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

DOCS = Path(__file__).parent
ROOT = DOCS.parent
#: A whole page's blocks, on a shared machine.
RUN_TIMEOUT_S = 120

_INCLUDE = re.compile(r'^--8<-- "([^"]+)"\s*$')
_FENCE = re.compile(r"^(\s*)```(\S*)(.*)$")
_NOT_RUN = re.compile(r"^\s*<!-- not-run: .+ -->\s*$")
_HIDDEN = re.compile(r"^\s*<!-- test: (.+) -->\s*$")


@dataclass
class Block:
    page: str
    line: int
    code: str
    runs: bool


def expanded(path: Path) -> list[str]:
    """The page's lines with every ``--8<--`` include (outside code blocks) put in place."""
    lines: list[str] = []
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        match = None if fenced else _INCLUDE.match(line)
        if match is None:
            lines.append(line)
            continue
        name, _, section = match.group(1).partition(":")
        included = expanded(ROOT / name)
        if section:
            start = included.index(f"<!-- --8<-- [start:{section}] -->")
            end = included.index(f"<!-- --8<-- [end:{section}] -->")
            included = included[start + 1 : end]
        lines += included
    return lines


def blocks(path: Path) -> list[Block]:
    """The page's ```python blocks, each with whether it runs."""
    found: list[Block] = []
    lines = expanded(path)
    i = 0
    while i < len(lines):
        hidden = _HIDDEN.match(lines[i])
        if hidden is not None:
            found.append(Block(str(path.relative_to(DOCS)), i + 1, hidden.group(1), True))
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, language, info = opening.groups()
        end = i + 1
        while not re.match(rf"^{indent}```\s*$", lines[end]):
            end += 1
        if language == "python":
            before = next((line for line in reversed(lines[:i]) if line.strip()), "")
            runs = "title=" not in info and not _NOT_RUN.match(before)
            code = "\n".join(line[len(indent) :] for line in lines[i + 1 : end])
            found.append(Block(str(path.relative_to(DOCS)), i + 1, code, runs))
        i = end + 1
    return found


PAGES = sorted(p for p in DOCS.rglob("*.md") if any(b.runs for b in blocks(p)))


def test_every_python_block_of_the_docs_either_runs_or_says_why_not() -> None:
    untitled = [
        f"{b.page}:{b.line}"
        for page in DOCS.rglob("*.md")
        for b in blocks(page)
        if not b.runs and not b.code.strip()
    ]
    assert not untitled, f"empty python blocks: {untitled}"
    assert PAGES, "no page has a python block that runs"


def test_every_not_run_marker_says_why() -> None:
    bare = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if "<!-- not-run" in line and "_NOT_RUN" not in line and not _NOT_RUN.match(line)
    ]
    assert not bare, f"a not-run marker without its reason: {bare}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_the_python_blocks_of_a_page_run(page: Path, tmp_path: Path) -> None:
    script = "\n\n".join(
        f"# --- {b.page}, block at line {b.line}\n{b.code}" for b in blocks(page) if b.runs
    )
    (tmp_path / "page.py").write_text(script)

    run = subprocess.run(
        [sys.executable, "page.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )

    assert run.returncode == 0, f"{page.name}'s examples failed:\n{run.stderr[-3000:]}"
