"""The README's Install section, run as written in a fresh virtual environment.

Slow (it builds every wheel and installs from them, dependencies from PyPI),
and part of every test run: an install line that does not work is the first
thing a new user meets.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
#: Building eight wheels and installing two, on a shared machine.
INSTALL_TIMEOUT_S = 600

pytestmark = pytest.mark.slow


def install_commands() -> list[str]:
    """The shell lines of the Install section's first ``sh`` block, comments dropped."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Install\n") :]
    section = section[: section.index("\n## ", 1)]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block, "the Install section has no sh block"
    lines = [line.split(" #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_install_section_says_what_is_not_on_pypi() -> None:
    readme = (ROOT / "README.md").read_text()
    section = " ".join(readme[readme.index("\n## Install\n") :].split("\n## ")[1].split())
    assert "not on PyPI yet" in section
    assert "unrelated project" in section
    assert install_commands() == [
        "./run wheels && pip install --find-links dist hermes-core hermes-redis"
    ]


def _clone(target: Path) -> None:
    """The repository's tracked files, as a fresh clone has them."""
    if (ROOT / ".git").exists():
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True
        ).stdout
        for name in filter(None, listed.decode().split("\0")):
            source = ROOT / name
            if source.is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)
        return
    ignored = shutil.ignore_patterns(".venv", ".nox", "dist", "__pycache__", "*.egg-info")
    shutil.copytree(ROOT, target, ignore=ignored, dirs_exist_ok=True)


def test_the_install_section_works_as_written_in_a_fresh_venv(tmp_path: Path) -> None:
    clone, app = tmp_path / "hermes", tmp_path / "app"
    clone.mkdir()
    _clone(clone)
    venv.create(app, with_pip=True)
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    # The user's own environment is active, as after `. app/bin/activate`.
    environ.update(PATH=f"{app / 'bin'}{os.pathsep}{environ.get('PATH', '')}",
                   VIRTUAL_ENV=str(app), PYTHON=sys.executable)  # fmt: skip

    for command in install_commands():
        result = subprocess.run(
            command, shell=True, cwd=clone, env=environ, capture_output=True, text=True,
            timeout=INSTALL_TIMEOUT_S,
        )  # fmt: skip
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"

    python = app / "bin" / "python"
    code = "import hermes.core, hermes.drivers.redis; print(hermes.core.__file__)"
    imported = subprocess.run(
        [str(python), "-c", code],
        cwd=tmp_path, env=environ, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert str(app) in imported.stdout  # the installed wheel, not this checkout
    drivers = subprocess.run(
        [str(app / "bin" / "hermes"), "drivers"], cwd=tmp_path, env=environ,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert drivers.returncode == 0, drivers.stderr
    rows = {line.split()[0]: line.split() for line in drivers.stdout.splitlines()[1:] if line}
    assert rows["redis"][1] == "hermes-redis"
    assert rows["memory"][1] == "hermes-core"
