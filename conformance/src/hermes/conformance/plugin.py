"""The pytest plugin ``hermes_conformance`` (entry point ``pytest11``).

Inert unless ``--hermes-url`` is given: the kit's own test modules, collected
without it, skip with the reason "--hermes-url not given"; nothing else in a
test run is touched (the plugin only adds its option, its two markers and its
``hermes_*`` fixtures). With the option it

* builds the driver under test with :func:`hermes.core.connect` and reads its
  capabilities once (the ``hermes_target`` fixture);
* gives every test a :class:`~hermes.conformance._harness.Kit` on a namespace
  of its own (``hermes_kit``) and a driver object on it (``hermes_driver``);
* turns a failing ``@pytest.mark.hermes_provisional`` test into a warning
  (an xfail that is not strict) -- new kit tests start that way for one release;
* ends the run with a summary of which capability rows were verified, not
  verified (and why) or failed, derived from the tests' outcomes.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest

_PACKAGE_DIR = Path(__file__).resolve().parent

# Before any of them is imported: a failing assert in the kit shows its values.
pytest.register_assert_rewrite(
    *(
        f"hermes.conformance.{module.name}"
        for module in pkgutil.iter_modules([str(_PACKAGE_DIR)])
        if module.name.startswith("test_") or module.name == "_harness"
    )
)

from hermes.conformance import TIME_SCALE_ENV, _harness  # noqa: E402
from hermes.conformance._worker import register_plugins  # noqa: E402
from hermes.core import available_drivers, redact_url  # noqa: E402
from hermes.core.driver import Driver, DriverUrl  # noqa: E402

_NO_URL = "--hermes-url not given"
_session_key = pytest.StashKey["KitSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hermes", "Hermes conformance kit")
    group.addoption(
        "--hermes-url",
        dest="hermes_url",
        default=None,
        metavar="URL",
        help="run the Hermes conformance kit (pytest --pyargs hermes.conformance) "
        "against the driver for URL, e.g. redis://localhost:6379/0",
    )
    group.addoption(
        "--hermes-plugin",
        dest="hermes_plugins",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE and register it with hermes.core.plugin_manager(), here and in "
        "the kit's worker processes: for a driver not installed as an entry point",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "hermes_check(row, check): the capability row and check a conformance test verifies",
    )
    config.addinivalue_line(
        "markers",
        "hermes_provisional(reason): a new conformance test; its failure is a warning "
        "for one release",
    )
    url = config.getoption("hermes_url")
    if not url:
        return
    try:
        _harness.time_scale()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    plugins = tuple(config.getoption("hermes_plugins"))
    try:
        register_plugins(plugins)
    except ImportError as exc:
        raise pytest.UsageError(f"--hermes-plugin: {exc}") from None
    scheme = DriverUrl.parse(url).scheme
    drivers = available_drivers()
    if not any(scheme in driver.schemes for driver in drivers):
        installed = ", ".join(f"{s}://" for d in drivers for s in d.schemes) or "none"
        raise pytest.UsageError(
            f"--hermes-url: no installed Hermes driver handles {scheme}:// "
            f"(installed: {installed}); install the driver's distribution first"
        )
    session = KitSession(url, plugins)
    config.stash[_session_key] = session
    config.pluginmanager.register(session, "hermes-conformance-session")


def _is_kit_item(item: pytest.Item) -> bool:
    return item.path.resolve().parent == _PACKAGE_DIR


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    with_url = _session_key in config.stash
    for item in items:
        provisional = item.get_closest_marker("hermes_provisional")
        if provisional is not None:
            reason = provisional.kwargs.get("reason") or (
                provisional.args[0] if provisional.args else "new test"
            )
            item.add_marker(
                pytest.mark.xfail(strict=False, reason=f"provisional (a warning only): {reason}")
            )
        if not with_url and _is_kit_item(item):
            item.add_marker(pytest.mark.skip(reason=_NO_URL))


class KitSession:
    """Registered as a plugin only when ``--hermes-url`` is given: outcomes and the summary."""

    def __init__(self, url: str, plugins: tuple[str, ...]) -> None:
        self.url = url
        #: ``--hermes-plugin`` modules, passed on to worker processes.
        self.plugins = plugins
        #: The driver under test, once the first test reached it.
        self.target: _harness.Target | None = None
        #: nodeid -> outcome, in collection order.
        self.outcomes: dict[str, _harness.Outcome] = {}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:  # after deselection
            check = item.get_closest_marker("hermes_check")
            if check is not None:
                row, text = (str(arg) for arg in check.args)
                self.outcomes[item.nodeid] = _harness.Outcome(row, text)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = self.outcomes.get(report.nodeid)
        if outcome is None:
            return
        if report.when == "call":
            for name, value in report.user_properties:
                if name == "hermes_check":
                    outcome.check = str(value)
                elif name == "hermes_figure":
                    outcome.figures.append(str(value))
        if outcome.status not in ("not run", "verified"):
            return  # the first phase that did not pass decides
        if hasattr(report, "wasxfail"):
            if report.skipped:
                outcome.status = "provisional failure (warning)"
            elif report.when == "call":
                outcome.status = "verified"
        elif report.failed:
            crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "")
            where = "" if report.when == "call" else f" in {report.when}"
            outcome.status = f"failed{where} ({cause(crash)})"
        elif report.skipped:
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            reason = reason.removeprefix("Skipped: ")
            if not reason.startswith(("not verified", "n/a")):
                reason = f"not verified: {reason}"
            outcome.status = reason
        elif report.when == "call":
            outcome.status = "verified"

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.outcomes:
            return
        write = terminalreporter.write_line
        target = self.target
        terminalreporter.write_sep("=", "hermes conformance summary")
        if target is None:
            write(f"driver for {redact_url(self.url)}: not reached (see the errors above)")
        else:
            caps = target.capabilities
            write(
                f"{target.driver_class} ({target.plugin.name}) on {target.redacted} declares: "
                f"delivery={caps.delivery.name} delay={caps.delay.name} "
                f"priorities={caps.priorities} competing_consumers={caps.competing_consumers} "
                f"cross_process={caps.cross_process} max_message_bytes={caps.max_message_bytes} "
                f"redelivery_timeout_s={caps.redelivery_timeout_s:g} "
                f"counts_deliveries={caps.counts_deliveries}"
            )
        rows: dict[str, list[_harness.Outcome]] = {row: [] for row in _ROWS}
        for outcome in self.outcomes.values():
            rows.setdefault(outcome.row, []).append(outcome)
        counts = dict.fromkeys(
            ("verified", "not verified", "n/a", "failed", "provisional", "not run"), 0
        )
        for row, outcomes in rows.items():
            if not outcomes:
                continue
            parts = [f"{o.check} {o.status}" for o in outcomes]
            for outcome in outcomes:
                counts[next(key for key in counts if outcome.status.startswith(key))] += 1
            red = any(o.status.startswith("failed") for o in outcomes)
            write(f"{_row_label(row, target)}: " + "; ".join(parts), red=red, bold=red)
            for outcome in outcomes:
                for figure in outcome.figures:
                    write(f"    {figure}")
        write(
            f"{sum(counts.values())} checks: {counts['verified']} verified, "
            f"{counts['not verified']} not verified, {counts['n/a']} not applicable, "
            f"{counts['failed']} failed, {counts['provisional']} provisional warnings"
            + (f", {counts['not run']} not run" if counts["not run"] else "")
        )
        if counts["provisional"]:
            write(
                "WARNING: provisional checks failed; they become required in the next release",
                yellow=True,
            )
        scale = _harness.time_scale()
        if scale != 1.0:
            write(f"deadlines scaled by {TIME_SCALE_ENV}={scale:g}")


#: The longest cause a summary line quotes; pytest's report above has the whole text.
CAUSE_CHARS = 200


def cause(crash: str, limit: int = CAUSE_CHARS) -> str:
    """The first line of a failure, for a summary line: the reason, cut at a word boundary.

    An assertion's own message is the reason, so its ``AssertionError:`` prefix
    goes; other exceptions keep their type, which is part of the reason.
    """
    lines = crash.strip().splitlines()
    if not lines:
        return "see the report above"
    text = lines[0].removeprefix("AssertionError: ").strip()
    if len(text) <= limit:
        return text
    cut = text[: limit + 1].rsplit(" ", 1)[0].rstrip(" ,;:(-")
    if len(cut) < limit // 2:  # one very long word: cut inside it rather than lose it all
        cut = text[:limit]
    return f"{cut} ..."


#: The summary's rows, in this order (a test may name another row; it comes last).
_ROWS = (
    "round trip",
    "delivery",
    "deliveries",
    "delay",
    "priorities",
    "competing consumers",
    "retry",
    "max items",
    "shutdown",
    "malformed input",
    "concurrent send",
    "fork",
)


def _row_label(row: str, target: _harness.Target | None) -> str:
    if target is None:
        return row
    caps = target.capabilities
    declared = {
        "delivery": caps.delivery.name,
        "deliveries": "counted" if caps.counts_deliveries else "not counted",
        "delay": caps.delay.name,
        "priorities": "yes" if caps.priorities else "no",
        "competing consumers": "yes" if caps.competing_consumers else "no",
        "round trip": f"(max_message_bytes={caps.max_message_bytes})",
    }.get(row)
    return f"{row} {declared}" if declared else row


# Fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hermes_target(request: pytest.FixtureRequest) -> _harness.Target:
    """The driver under test: ``--hermes-url``, its plugin and declared capabilities."""
    session = request.config.stash.get(_session_key, None)
    if session is None:
        pytest.skip(_NO_URL)
    if session.target is None:
        session.target = _harness.Target.probe(session.url, session.plugins)
    return session.target


@pytest.fixture
def hermes_kit(
    hermes_target: _harness.Target, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[_harness.Kit]:
    """This test's namespace on the broker; cleaned up (and torn down) when the test ends."""
    kit = _harness.Kit(hermes_target, request.node, tmp_path)
    try:
        yield kit
    finally:
        kit.close()


@pytest.fixture
def hermes_driver(hermes_kit: _harness.Kit) -> Driver:
    """``connect(kit.url)``: a driver object on this test's namespace."""
    return hermes_kit.driver()
