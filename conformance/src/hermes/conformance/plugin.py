"""The pytest plugin ``hermes_conformance`` (entry point ``pytest11``).

Inert unless ``--hermes-url`` is given: the kit's own test modules, collected
without it, skip with the reason "--hermes-url not given"; nothing else in a
test run is touched (the plugin only adds its option, its two markers and its
``hermes_*`` fixtures). With the option it

* builds the driver under test with :func:`hermes.core.connect` and reads its
  capabilities once (the ``hermes_target`` fixture);
* gives every test a :class:`~hermes.conformance._harness.Kit` on a namespace
  of its own (``hermes_kit``) and a driver object on it (``hermes_driver``);
* fails the run on any check a driver fails: there is one mode, and every
  check the kit runs is required. A check that cannot apply to a driver says
  "not applicable" from what the driver declares; none is a warning;
* bounds every kit test (``--hermes-test-timeout``, scaled): a test stuck in
  a driver call fails naming the line, instead of hanging until an outer timeout;
* ends the run with a summary of which capability rows were verified, not
  verified (and why) or failed, derived from the tests' outcomes.
"""

from __future__ import annotations

import contextlib
import pkgutil
import shlex
import signal
import subprocess
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from types import FrameType

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
#: The default bound on one kit test, in seconds (scaled): the longest takes a
#: few minutes on a slow broker (SQS's 3000 messages), most take seconds.
TEST_TIMEOUT_S = 300.0
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
        help="import MODULE and register it with hermes.core.drivertools.plugin_manager(), "
        "here and in the kit's worker processes: for a driver not installed as an entry point",
    )
    group.addoption(
        "--hermes-strict",
        dest="hermes_strict",
        action="store_true",
        default=False,
        help="accepted so that older command lines still run; every check is required "
        "whether or not it is given",
    )
    group.addoption(
        "--hermes-test-timeout",
        dest="hermes_test_timeout",
        type=float,
        default=TEST_TIMEOUT_S,
        metavar="SECONDS",
        help=f"fail a kit test still running after SECONDS, scaled (default {TEST_TIMEOUT_S:g})",
    )
    group.addoption(
        "--hermes-drop-connection",
        dest="hermes_drop_connection",
        default=None,
        metavar="COMMAND",
        help="a shell command that drops the broker's client connections (e.g. "
        '"redis-cli CLIENT KILL TYPE normal"), for drivers without drop_connection(); '
        "it runs in a shell whose $PPID is the kit's process",
    )
    group.addoption(
        "--hermes-no-connection",
        dest="hermes_no_connection",
        action="store_true",
        default=False,
        help="the driver holds no broker connection (in-process, files on a disk): the "
        "dropped-connection check is not applicable rather than not verified",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "hermes_check(row, check, new=False): the capability row and check a conformance "
        "test verifies; new=True: a check added in this release (required like the rest)",
    )
    url = config.getoption("hermes_url")
    if not url:
        return
    try:
        _harness.time_scale()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.getoption("hermes_drop_connection") and config.getoption("hermes_no_connection"):
        raise pytest.UsageError(
            "--hermes-drop-connection and --hermes-no-connection: a driver without a "
            "connection has none to drop; give one or the other"
        )
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
        if not with_url and _is_kit_item(item):
            item.add_marker(pytest.mark.skip(reason=_NO_URL))


class KitTestTimeout(AssertionError):
    """A kit test outlived ``--hermes-test-timeout``: raised on the test's own thread."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    config = item.config
    bound = config.getoption("hermes_test_timeout")
    if (
        _session_key not in config.stash
        or not _is_kit_item(item)
        or not bound
        or threading.current_thread() is not threading.main_thread()
    ):
        return (yield)
    with _alarm(_harness.scaled(bound)):
        return (yield)


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`KitTestTimeout` in this (the main) thread after ``seconds``.

    A signal, because a test stuck in a driver call cannot be stopped from
    another thread; the handler raises wherever the main thread is, which
    every blocking call Python makes (a lock, a socket, a sleep) lets through.
    """

    def expired(signum: int, frame: FrameType | None) -> None:
        where = _harness.where_frame(frame) if frame is not None else "(unknown)"
        raise KitTestTimeout(
            f"the test did not end within {seconds:.1f} s (scaled), the kit's bound for "
            f"one test (--hermes-test-timeout); it is stuck in {where}"
        )

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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
        if report.failed:
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
                f"counts_deliveries={caps.counts_deliveries} wake_up_s={caps.wake_up_s:g}"
            )
        rows: dict[str, list[_harness.Outcome]] = {row: [] for row in _ROWS}
        for outcome in self.outcomes.values():
            rows.setdefault(outcome.row, []).append(outcome)
        counts = dict.fromkeys(("verified", "not verified", "n/a", "failed", "not run"), 0)
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
            f"{counts['failed']} failed"
            + (f", {counts['not run']} not run" if counts["not run"] else "")
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
    "wake-up",
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
    "leases",
    "settles",
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
        "wake-up": f"(wake_up_s={caps.wake_up_s:g})",
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


#: Why the dropped-connection check did not run, when this run has no way to drop one.
NO_WAY_TO_DROP = (
    "not verified: no way to drop the connection (give the driver drop_connection() "
    "or run with --hermes-drop-connection COMMAND)"
)
#: Why it did not run on a driver declared to hold no connection (``--hermes-no-connection``).
NO_CONNECTION = "n/a: the driver holds no broker connection (--hermes-no-connection)"


class DropConnection:
    """Drops a driver object's broker connections, the way this run can (see the fixture)."""

    def __init__(self, command: str | None, no_connection: bool = False) -> None:
        #: ``--hermes-drop-connection``: a shell command, for drivers without the method.
        self.command = command
        #: ``--hermes-no-connection``: the driver has nothing to drop.
        self.no_connection = no_connection
        #: What the command printed last time, one line (shown in the summary:
        #: which connections it dropped).
        self.said = ""

    @property
    def skip_reason(self) -> str:
        """Why the check does not run when :meth:`how` is None: not applicable, or not verified."""
        return NO_CONNECTION if self.no_connection else NO_WAY_TO_DROP

    def how(self, driver: Driver) -> str | None:
        """How ``driver``'s connections would be dropped; None when they cannot be."""
        if isinstance(driver, _harness.SupportsDropConnection):
            return "the driver's drop_connection()"
        if self.command:
            return "--hermes-drop-connection"
        return None

    def __call__(self, driver: Driver) -> str:
        """Drop them now; how it was done, for the summary."""
        how = self.how(driver)
        if isinstance(driver, _harness.SupportsDropConnection):
            driver.drop_connection()
        elif self.command:
            done = subprocess.run(
                self.command,
                shell=True,
                capture_output=True,
                text=True,
                timeout=_harness.scaled(_harness.CLOSE_S),
            )
            assert done.returncode == 0, (
                f"--hermes-drop-connection {shlex.quote(self.command)} exited "
                f"{done.returncode}: {(done.stderr or done.stdout).strip()[-500:]}"
            )
            self.said = "; ".join(line for line in done.stdout.splitlines() if line.strip())[:500]
        assert how is not None, "no way to drop the connection (check how() first)"
        return how


@pytest.fixture
def hermes_drop_connection(request: pytest.FixtureRequest) -> DropConnection:
    """Drops a driver's broker connections: its own ``drop_connection()``
    (:class:`~hermes.conformance._harness.SupportsDropConnection`) first, else
    ``--hermes-drop-connection COMMAND`` run by the shell; ``how(driver)`` is
    None when neither is there, and the test then skips with ``skip_reason``:
    not applicable under ``--hermes-no-connection``, else not verified."""
    return DropConnection(
        request.config.getoption("hermes_drop_connection"),
        request.config.getoption("hermes_no_connection"),
    )
