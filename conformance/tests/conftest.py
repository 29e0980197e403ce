"""Runs the conformance kit in a pytest process of its own, the way its users run it."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

TESTS_DIR = Path(__file__).resolve().parent
#: The README's example driver, which the kit must pass too.
EXAMPLES_DIR = TESTS_DIR.parent / "examples"

#: The inner run's configuration: as strict as this repository's.
_INNER_INI = """\
[pytest]
filterwarnings = error
xfail_strict = true
addopts = --strict-markers
"""


@dataclass
class KitRun:
    """One inner pytest run: its exit code, output and per-test outcome."""

    argv: list[str]
    returncode: int
    output: str
    duration_s: float
    #: test function name -> passed | failed | error | skipped | xfailed | xpassed
    outcomes: dict[str, str] = field(default_factory=dict)
    #: test function name -> skip reason
    reasons: dict[str, str] = field(default_factory=dict)

    def with_outcome(self, outcome: str) -> list[str]:
        return sorted(name for name, got in self.outcomes.items() if got == outcome)

    def describe(self) -> str:
        return f"$ {' '.join(self.argv)}\n(exit {self.returncode})\n{self.output[-6000:]}"


def _read_outcomes(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    outcomes: dict[str, str] = {}
    reasons: dict[str, str] = {}
    if not path.exists():
        return outcomes, reasons
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        name, when, outcome = record["test"], record["when"], record["outcome"]
        if outcomes.get(name) in ("failed", "error"):
            continue
        if outcome == "failed":
            outcomes[name] = "failed" if when == "call" else "error"
        elif record["xfail"]:
            outcomes[name] = "xfailed" if outcome == "skipped" else "xpassed"
        elif outcome == "skipped":
            outcomes[name] = "skipped"
            reasons[name] = record["reason"]
        elif when == "call":
            outcomes[name] = "passed"
    return outcomes, reasons


def run_pytest(
    workdir: Path, *args: str, scale: float = 1.0, module: str = "pytest", timeout_s: float = 900
) -> KitRun:
    """``python -m <module> -p kit_outcomes <args>`` in ``workdir``, with the broken drivers."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "pytest.ini").write_text(_INNER_INI)
    outcomes_file = workdir / "outcomes.jsonl"
    outcomes_file.unlink(missing_ok=True)
    outer_scale = float(os.environ.get("HERMES_KIT_TIME_SCALE") or 1.0)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(TESTS_DIR), str(EXAMPLES_DIR), os.environ.get("PYTHONPATH")])
        ),
        "KIT_OUTCOMES_FILE": str(outcomes_file),
        "BROKEN_DRIVERS_DIR": str(workdir),
        "HERMES_KIT_TIME_SCALE": str(outer_scale * scale),
        "PYTEST_ADDOPTS": "",
    }
    plugins = ["-p", "no:cacheprovider", "-p", "kit_outcomes"]
    if module == "pytest":
        argv = [sys.executable, "-m", "pytest", *plugins, *args]
    else:  # python -m hermes.conformance URL [pytest args]
        argv = [sys.executable, "-m", module, args[0], *plugins, *args[1:]]
    started = time.monotonic()
    done = subprocess.run(
        argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    outcomes, reasons = _read_outcomes(outcomes_file)
    return KitRun(
        argv=argv[1:],
        returncode=done.returncode,
        output=done.stdout + done.stderr,
        duration_s=time.monotonic() - started,
        outcomes=outcomes,
        reasons=reasons,
    )


class KitRunner:
    """Runs pytest (or ``python -m hermes.conformance``) in fresh directories."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._numbers = itertools.count(1)

    def run(
        self,
        *args: str,
        scale: float = 1.0,
        module: str = "pytest",
        files: dict[str, str] | None = None,
    ) -> KitRun:
        workdir = self.base / f"run-{next(self._numbers)}"
        workdir.mkdir(parents=True)
        for name, text in (files or {}).items():
            (workdir / name).write_text(text)
        return run_pytest(workdir, *args, scale=scale, module=module)


@pytest.fixture(scope="session")
def kit_runner(tmp_path_factory: pytest.TempPathFactory) -> KitRunner:
    return KitRunner(tmp_path_factory.mktemp("kit-runs"))


@pytest.fixture(scope="session")
def broken_module() -> Callable[[str], ModuleType]:
    """A module of this directory by name (the broken stores), found as the kit's runs find it."""

    def load(name: str) -> ModuleType:
        if str(TESTS_DIR) not in sys.path:
            sys.path.insert(0, str(TESTS_DIR))
        return importlib.import_module(name)

    return load


@dataclass
class Row:
    """One capability row of the kit run on sound and broken stores of a broken-store module.

    ``sound``: URL -> the tests it cannot run, with the reason; ``broken``: URL ->
    (the tests that must fail, and only they; text the output shows).
    """

    module: str
    plugin: str
    tests: set[str]
    sound: dict[str, dict[str, str]]
    broken: dict[str, tuple[list[str], str]]

    @contextlib.contextmanager
    def runs(self, kit_runner: KitRunner, workers: int = 3) -> Iterator[dict[str, Future[KitRun]]]:
        """The row on every URL, ``workers`` runs at a time (each races threads)."""
        with ThreadPoolExecutor(max_workers=workers) as pool:
            runs = {
                url: pool.submit(
                    kit_runner.run,
                    *("--pyargs", self.module, "--hermes-url", url, "--hermes-plugin", self.plugin),
                )
                for url in [*self.sound, *self.broken]
            }
            yield runs
            for future in runs.values():
                future.cancel()

    def assert_passes(self, run: KitRun, url: str) -> None:
        skipped = self.sound[url]
        assert run.returncode == 0, run.describe()
        assert set(run.with_outcome("passed")) == self.tests - set(skipped), run.describe()
        assert {name: run.reasons[name] for name in run.with_outcome("skipped")} == skipped

    def assert_fails(self, run: KitRun, url: str, bug: str | None) -> None:
        must_fail, says = self.broken[url]
        assert run.returncode == 1, f"bug: {bug}\n{run.describe()}"
        assert run.with_outcome("failed") == sorted(must_fail), f"bug: {bug}\n{run.describe()}"
        assert says in run.output, f"bug: {bug}; expected {says!r}\n{run.describe()}"


@pytest.fixture(scope="session")
def make_row() -> type[Row]:
    """:class:`Row`, for the broken-store suites (their modules cannot import this one)."""
    return Row
