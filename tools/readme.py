"""Generated sections of Markdown files (docs/performance.md, docs/reliability.md, the
driver READMEs): the text between `<!-- NAME:begin/end -->` markers."""

from __future__ import annotations

from pathlib import Path


def replace_section(readme: Path, name: str, text: str) -> str | None:
    """Put ``text`` between the ``name`` markers of ``readme``; a reason if it could not."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    content = readme.read_text()
    if begin not in content or end not in content:
        return f"{readme.name}: markers {begin} / {end} not found; {name} section not written"
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{text}{end}{tail}")
    return None
