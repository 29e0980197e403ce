"""Drivers and observers are pluggy plugins of the ``hermes`` entry-point group."""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest

from hermes.core import (
    DEFAULT_PRIORITY,
    ConfigurationError,
    Emitter,
    Message,
    Outcome,
    RetryableHandler,
    RetryMixin,
    available_drivers,
    compat,
    connect,
    hookimpl,
    hookspecs,
)
from hermes.core.compat import Dispatcher
from hermes.core.driver import DriverPlugin, DriverUrl
from hermes.core.drivertools import MemoryDriver, isolated_url
from hermes.core.model._errors import UnknownDriverError
from hermes.core.spi import _entry_points, _memory, _registry
from hermes.core.spi._entry_points import EntryPoint
from hermes.core.spi._registry import plugin_manager


@pytest.fixture
def only_memory(monkeypatch: pytest.MonkeyPatch) -> pluggy.PluginManager:
    """A plugin manager that knows the memory driver and nothing else installed."""
    manager = pluggy.PluginManager("hermes")
    manager.add_hookspecs(hookspecs)
    manager.register(_memory, name="memory")
    monkeypatch.setattr(_registry._registry, "_manager", manager)
    return manager


def driver_plugin(name: str, *schemes: str) -> DriverPlugin:
    return DriverPlugin(
        name=name,
        schemes=schemes,
        factory=lambda url, **options: MemoryDriver(f"{name}-{url.host}"),
        capabilities=MemoryDriver.capabilities,
        isolate=lambda url, namespace: f"{schemes[0]}://{namespace}",
    )


class DriverProvider:
    """A plugin object (not an installed distribution) that provides drivers."""

    def __init__(self, *drivers: DriverPlugin) -> None:
        self.drivers = list(drivers)

    @hookimpl
    def hermes_drivers(self) -> list[DriverPlugin]:
        return self.drivers


@pytest.fixture
def register() -> Iterator[Any]:
    """Registers plugins on the process-wide manager for one test."""
    registered: list[object] = []

    def add(plugin: object, name: str | None = None) -> object:
        plugin_manager().register(plugin, name=name)
        registered.append(plugin)
        return plugin

    yield add
    for plugin in registered:
        plugin_manager().unregister(plugin)


# Drivers ---------------------------------------------------------------------------


def test_the_memory_driver_is_registered_through_the_entry_point_of_hermes_core() -> None:
    (entry_point,) = [
        ep for ep in importlib.metadata.entry_points(group="hermes") if ep.name == "memory"
    ]
    assert entry_point.value == "hermes.core.spi._memory"

    memory = [driver for driver in available_drivers() if driver.name == "memory"]

    assert len(memory) == 1
    assert memory[0].distribution == "hermes-core"
    assert memory[0].version == importlib.metadata.version("hermes-core")
    assert memory[0].schemes == ("memory",)


def test_available_drivers_lists_each_driver_once_sorted_by_name(register: Any) -> None:
    register(DriverProvider(driver_plugin("zeta", "zeta", "zetas"), driver_plugin("alpha", "al")))

    names = [driver.name for driver in available_drivers()]

    assert names == sorted(set(names))
    assert {"alpha", "memory", "zeta"} <= set(names)


def test_connect_to_a_scheme_nobody_provides_lists_the_installed_schemes() -> None:
    with pytest.raises(UnknownDriverError) as caught:
        connect("nope://x")

    text = str(caught.value)
    assert caught.value.scheme == "nope"
    assert "no installed Hermes driver handles nope://" in text
    assert "installed schemes: " in text
    assert "memory://" in text
    assert "install the distribution that provides nope://" in text


def test_an_unknown_driver_error_is_a_configuration_error_and_a_value_error() -> None:
    with pytest.raises(ValueError):
        connect("nope://x")
    with pytest.raises(ConfigurationError):
        connect("nope://x")


@pytest.mark.parametrize(("scheme", "distribution"), sorted(_registry.KNOWN_DISTRIBUTIONS.items()))
def test_connect_to_a_known_scheme_that_is_not_installed_names_its_pip_install(
    only_memory: pluggy.PluginManager, scheme: str, distribution: str
) -> None:
    with pytest.raises(UnknownDriverError) as caught:
        connect(f"{scheme}://localhost/x")

    text = str(caught.value)
    assert f"`pip install {distribution}` adds it" in text
    assert "installed schemes: memory://;" in text


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> _registry._Registry:
    """A registry that has not loaded its entry points yet, in place of the process-wide one."""
    registry = _registry._Registry()
    monkeypatch.setattr(_registry, "_registry", registry)
    return registry


def test_a_plugin_that_fails_to_import_costs_only_its_own_drivers(
    fresh_registry: _registry._Registry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    entry_points = [
        EntryPoint("broken", "hermes_no_such_module._plugin", "hermes-broken", "1.0"),
        EntryPoint("memory", "hermes.core.spi._memory", "hermes-core", "6.2.0"),
    ]
    monkeypatch.setattr(_entry_points, "entry_points", lambda group: entry_points)

    assert [driver.name for driver in available_drivers()] == ["memory"]
    assert "broken" in fresh_registry.broken
    assert "Hermes plugin broken (hermes-broken) could not be loaded" in caplog.text
    with pytest.raises(UnknownDriverError, match=r"broken .* failed to load: ModuleNotFoundError"):
        connect("nope://x")


def test_a_plugin_whose_hooks_do_not_match_is_skipped_not_fatal(
    fresh_registry: _registry._Registry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    entry_points = [
        EntryPoint("stale", "stale_plugin", "hermes-stale", "1.0"),
        EntryPoint("memory", "hermes.core.spi._memory", "hermes-core", "6.2.0"),
    ]
    monkeypatch.setattr(_entry_points, "entry_points", lambda group: entry_points)

    assert [driver.name for driver in available_drivers()] == ["memory"]
    assert "stale" in fresh_registry.broken
    assert "Hermes plugin stale (hermes-stale) could not be loaded" in caplog.text
    assert "no_such_argument" in caplog.text


def test_the_unknown_driver_error_hides_the_url_s_password(
    only_memory: pluggy.PluginManager,
) -> None:
    with pytest.raises(UnknownDriverError) as caught:
        connect("amqp://guest:s3cret@localhost:5672/")

    assert "s3cret" not in str(caught.value)
    assert "amqp://guest:***@localhost:5672/" in str(caught.value)


#: Run in a fresh interpreter: this one imported every driver long ago.
_MODULES_AFTER_LISTING = """
import json, sys
import hermes.core
names = [driver.name for driver in hermes.core.available_drivers()]
clients = ("boto3", "botocore", "pika", "redis", "confluent_kafka", "psycopg")
loaded = sorted(
    name for name in sys.modules
    if name in clients or name.startswith("hermes.drivers.") and name.endswith("._driver")
)
print(json.dumps({"names": names, "loaded": loaded}))
"""


def test_listing_the_installed_drivers_imports_none_of_the_drivers_or_their_clients() -> None:
    # Every connect() loads every plugin: a plugin that imports its driver or client
    # library makes processes that use another broker pay for it in start-up and memory.
    seen = _in_a_fresh_interpreter(_MODULES_AFTER_LISTING)
    assert "memory" in seen["names"]
    assert seen["loaded"] == [], f"listing {seen['names']} imported {seen['loaded']}"


#: Run in a fresh interpreter: what a worker loads before its first job, and the
#: parsers of every command (hermes-dashboard adds ``hermes dashboard``'s).
_MODULES_AFTER_REGISTERING = """
import json, sys
from hermes.core.cli import build_parser
from hermes.core.spi._registry import plugin_manager
names = sorted(name for name, plugin in plugin_manager().list_name_plugin() if plugin)
build_parser()
clients = ("prometheus_client", "sentry_sdk", "opentelemetry", "starlette", "uvicorn", "jinja2")
loaded = sorted(name for name in sys.modules if name.split(".")[0] in clients)
print(json.dumps({"names": names, "loaded": loaded}))
"""


def test_registering_the_installed_plugins_imports_none_of_their_client_libraries() -> None:
    # Installed but unconfigured, an observer plugin or the dashboard must cost a
    # worker's start-up nothing: their libraries are imported when they are used.
    seen = _in_a_fresh_interpreter(_MODULES_AFTER_REGISTERING)
    assert {"dashboard", "opentelemetry", "prometheus", "sentry"} <= set(seen["names"])
    assert seen["loaded"] == [], f"registering {seen['names']} imported {seen['loaded']}"


def test_the_registry_finds_every_driver_without_importlib_metadata() -> None:
    # Its import costs a tenth of a worker's start-up: the registry reads the
    # entry points itself. (An observer plugin whose SDK needs it fails to load here.)
    code = "import sys\nsys.modules['importlib.metadata'] = None\n" + _MODULES_AFTER_LISTING
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    names = json.loads(run.stdout)["names"]
    expected = [driver.name for driver in available_drivers()]
    assert names == expected


def test_a_registered_plugin_adds_its_scheme_until_it_is_unregistered() -> None:
    plugin = DriverProvider(driver_plugin("foo", "foo"))
    plugin_manager().register(plugin)
    try:
        driver = connect("foo://bar")
        assert isinstance(driver, MemoryDriver)
        assert driver.name == "foo-bar"
        assert isolated_url("foo://bar", "ns-1") == "foo://ns-1"
        assert "foo" in [d.name for d in available_drivers()]
    finally:
        plugin_manager().unregister(plugin)

    with pytest.raises(UnknownDriverError):
        connect("foo://bar")


def test_connect_passes_its_keyword_options_to_the_factory(register: Any) -> None:
    seen: list[tuple[DriverUrl, dict[str, Any]]] = []

    def factory(url: DriverUrl, **options: Any) -> MemoryDriver:
        seen.append((url, options))
        return MemoryDriver("opts")

    register(
        DriverProvider(
            DriverPlugin(
                "opt", ("opt",), factory, MemoryDriver.capabilities, isolate=lambda url, ns: ""
            )
        )
    )

    connect("opt://h:1/p?x=1", client="a client object")

    ((url, options),) = seen
    assert (url.scheme, url.host, url.port, url.path, dict(url.options)) == (
        "opt",
        "h",
        1,
        "p",
        {"x": "1"},
    )
    assert options == {"client": "a client object"}


def test_two_plugins_claiming_one_scheme_is_an_error_naming_both(register: Any) -> None:
    register(DriverProvider(driver_plugin("first", "dup")), name="first-plugin")
    register(DriverProvider(driver_plugin("second", "dup")), name="second-plugin")

    with pytest.raises(ConfigurationError) as caught:
        connect("memory://x")

    text = str(caught.value)
    assert "dup://" in text
    assert "first (plugin 'first-plugin')" in text
    assert "second (plugin 'second-plugin')" in text


def test_a_plugin_claiming_an_installed_scheme_under_the_same_name_is_an_error(
    register: Any,
) -> None:
    register(DriverProvider(driver_plugin("memory", "memory")), name="impostor")

    with pytest.raises(ConfigurationError, match=r"memory://.*hermes-core.*impostor"):
        available_drivers()


# Lifecycle hooks --------------------------------------------------------------------


class Observer:
    """Records every lifecycle hook call with its keyword arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @hookimpl
    def hermes_message_emitted(self, message: Message, priority: int, driver: Any) -> None:
        self.calls.append(("emitted", {"message": message, "priority": priority, "driver": driver}))

    @hookimpl
    def hermes_message_started(self, message: Message, priority: int) -> None:
        self.calls.append(("started", {"message": message, "priority": priority}))

    @hookimpl
    def hermes_message_succeeded(
        self, message: Message, priority: int, handler: object, result: bool
    ) -> None:
        self.calls.append(
            (
                "succeeded",
                {"message": message, "priority": priority, "handler": handler, "result": result},
            )
        )

    @hookimpl
    def hermes_message_failed(
        self, message: Message, priority: int, handler: object, exception: BaseException
    ) -> None:
        self.calls.append(
            (
                "failed",
                {
                    "message": message,
                    "priority": priority,
                    "handler": handler,
                    "exception": exception,
                },
            )
        )

    @hookimpl
    def hermes_message_retried(self, message: Message, retry: Message, handler: object) -> None:
        self.calls.append(("retried", {"message": message, "retry": retry, "handler": handler}))

    @hookimpl
    def hermes_message_gave_up(
        self,
        message: Message,
        priority: int,
        handler: object,
        reason: str,
        exception: BaseException | None,
        outcome: Outcome,
    ) -> None:
        self.calls.append(
            (
                "gave_up",
                {
                    "message": message,
                    "priority": priority,
                    "handler": handler,
                    "reason": reason,
                    "exception": exception,
                    "outcome": outcome,
                },
            )
        )


class Works:
    def handle(self, message: Message) -> bool:
        return True


class Fails(RetryMixin, RetryableHandler):
    def handle(self, message: Message) -> bool:
        raise RuntimeError("flaky")


def test_lifecycle_hooks_see_emit_start_success_failure_and_retry(
    driver: MemoryDriver, register: Any
) -> None:
    observer = register(Observer())
    driver.setup_priority_queue("high", 300)
    works, fails = Works(), Fails()
    message = Message("job")
    Emitter(driver).emit(message, 300)
    compat.set_max_process_items(driver, 1)

    Dispatcher(driver).register_handlers("job", [works, fails]).handle()

    names = [name for name, _ in observer.calls]
    assert names == ["emitted", "started", "succeeded", "failed", "retried"]
    emitted, started, succeeded, failed, retried = (kwargs for _, kwargs in observer.calls)
    assert emitted == {"message": message, "priority": 300, "driver": driver}
    assert started == {"message": message, "priority": 300}
    assert succeeded == {"message": message, "priority": 300, "handler": works, "result": True}
    assert failed["handler"] is fails
    assert (failed["message"], failed["priority"]) == (message, 300)
    assert str(failed["exception"]) == "flaky"
    assert retried["message"] == message
    assert retried["handler"] is fails
    assert (retried["retry"].id, retried["retry"].retries) == (message.id, 1)


def test_a_handler_that_returns_false_is_reported_as_given_up_not_as_succeeded(
    driver: MemoryDriver, register: Any
) -> None:
    observer = Observer()
    register(observer)

    class Declines:
        def handle(self, message: Message) -> bool:
            return False

    declines = Declines()
    message = Message("job")
    dispatcher = Dispatcher(driver).register_handler("job", declines)

    dispatcher.handle_message(message, DEFAULT_PRIORITY)

    assert [name for name, _ in observer.calls if name == "succeeded"] == []
    (gave_up,) = [kwargs for name, kwargs in observer.calls if name == "gave_up"]
    assert gave_up["handler"] is declines
    assert gave_up["outcome"] is Outcome.RETURNED_FALSE
    assert (dispatcher.stats.handled, dispatcher.stats.failed) == (0, 1)


def test_an_observer_may_implement_only_the_arguments_it_needs(
    driver: MemoryDriver, register: Any
) -> None:
    seen: list[str] = []

    class Counter:
        @hookimpl
        def hermes_message_started(self, message: Message) -> None:
            seen.append(message.id)

    register(Counter())
    message = Message("job")

    Dispatcher(driver).register_handler("job", Works()).handle_message(message, DEFAULT_PRIORITY)

    assert seen == [message.id]


class Plain:
    def handle(self, message: Message) -> bool:
        raise RuntimeError("no retry for me")


class Declines:
    def handle(self, message: Message) -> bool:
        return False


def test_the_gave_up_hook_says_why_for_every_way_a_message_is_given_up(
    driver: MemoryDriver, register: Any
) -> None:
    observer = register(Observer())
    plain, declines, used_up = Plain(), Declines(), Fails()
    dispatcher = Dispatcher(driver).register_handlers("job", [plain, declines])
    dispatcher.register_handler("tired", used_up)
    job, tired, stray = Message("job"), Message("tired", retries=25), Message("stray")

    for message in (job, tired, stray):
        dispatcher.handle_message(message, DEFAULT_PRIORITY)

    gave_up = [kwargs for name, kwargs in observer.calls if name == "gave_up"]
    assert [(g["message"].id, g["handler"]) for g in gave_up] == [
        (job.id, plain),
        (job.id, declines),
        (tired.id, used_up),
        (stray.id, None),
    ]
    assert [g["reason"] for g in gave_up] == [
        "Plain is not a RetryableHandler "
        "(subclass RetryableHandler with RetryMixin to retry it when it raises)",
        "it returned False (a handler that returns False is never retried)",
        "gave up after 25 retries",
        "no handler is registered for its type",
    ]
    assert [str(g["exception"]) for g in gave_up] == ["no retry for me", "None", "flaky", "None"]
    assert dispatcher.stats.gave_up == 4


class Raising:
    """An observer with a bug in every hook it implements."""

    def __init__(self) -> None:
        self.calls = 0

    def _boom(self) -> None:
        self.calls += 1
        raise ZeroDivisionError("observer bug")

    @hookimpl
    def hermes_message_emitted(self) -> None:
        self._boom()

    @hookimpl
    def hermes_message_started(self) -> None:
        self._boom()

    @hookimpl
    def hermes_message_failed(self) -> None:
        self._boom()

    @hookimpl
    def hermes_message_retried(self) -> None:
        self._boom()

    @hookimpl
    def hermes_message_gave_up(self) -> None:
        self._boom()


def test_an_observer_that_raises_changes_nothing_the_dispatcher_or_emitter_does(
    driver: MemoryDriver, register: Any, peek: Any, caplog: pytest.LogCaptureFixture
) -> None:
    raising = register(Raising(), name="buggy-metrics")
    observer = register(Observer())  # registered later, so pluggy calls it first
    register(Raising(), name="buggy-tracing")  # ... and this one before it
    caplog.set_level(logging.DEBUG, logger="hermes")
    emitter = Emitter(driver)
    first, second = Message("job"), Message("job")

    assert emitter.emit(first) is emitter
    assert emitter.emit_batch([second]) is emitter
    compat.set_max_process_items(driver, 2)
    dispatcher = Dispatcher(driver).register_handler("job", Fails())
    dispatcher.handle()  # raises nothing: both messages are taken and retried

    assert (dispatcher.stats.received, dispatcher.stats.retried) == (2, 2)
    assert sorted(m.id for _, m in peek.scheduled(driver)) == sorted([first.id, second.id])
    names = [name for name, _ in observer.calls]
    assert names == ["emitted", "emitted"] + ["started", "failed", "retried"] * 2
    assert raising.calls == 8
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "plugin" in r.message]
    assert sorted(r.getMessage().split(" - ")[0] for r in errors) == sorted(
        f"Hermes plugin {plugin} raised in hermes_message_{hook} and was skipped"
        for plugin in ("buggy-metrics", "buggy-tracing")
        for hook in ("emitted", "started", "failed", "retried")
    )
    assert all(r.exc_info and isinstance(r.exc_info[1], ZeroDivisionError) for r in errors)
    again = [r for r in caplog.records if r.levelno == logging.DEBUG and "again" in r.message]
    assert len(again) == 8  # the second emit, start, failure and retry of each plugin


def test_an_observer_that_raises_in_gave_up_changes_nothing(
    driver: MemoryDriver, register: Any, caplog: pytest.LogCaptureFixture
) -> None:
    register(Raising(), name="buggy-alerts")
    dispatcher = Dispatcher(driver).register_handler("job", Declines())

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is False

    assert dispatcher.stats.gave_up == 1
    assert "Hermes plugin buggy-alerts raised in hermes_message_gave_up" in caplog.text


def test_a_wrapper_implementation_of_an_observer_hook_is_skipped_with_an_error(
    driver: MemoryDriver, register: Any, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    class Timing:
        @hookimpl(wrapper=True)
        def hermes_message_started(self) -> Iterator[None]:
            calls.append("before")
            yield
            calls.append("after")

    register(Timing(), name="timing-wrapper")
    dispatcher = Dispatcher(driver).register_handler("job", Works())

    assert dispatcher.handle_message(Message("job"), DEFAULT_PRIORITY) is True

    assert calls == []
    assert "Hermes plugin timing-wrapper raised in hermes_message_started" in caplog.text
    assert "without wrapper=True" in caplog.text


def test_a_plugin_whose_drivers_hook_raises_costs_only_its_own_drivers(
    register: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        @hookimpl
        def hermes_drivers(self) -> list[DriverPlugin]:
            raise RuntimeError("plugin bug")

    register(Broken(), name="broken-drivers-plugin")

    assert isinstance(connect("memory://still-works"), MemoryDriver)
    assert "Hermes plugin broken-drivers-plugin raised in hermes_drivers" in caplog.text
    with pytest.raises(UnknownDriverError, match=r"broken-drivers-plugin .* RuntimeError"):
        connect("nope://x")
    _registry._registry.broken.pop("broken-drivers-plugin")


def test_every_hook_states_its_contract_in_a_docstring() -> None:
    hooks = [
        function
        for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
        if name.startswith("hermes_")
    ]

    assert {f.__name__ for f in hooks} == {
        "hermes_drivers",
        "hermes_message_emitted",
        "hermes_message_started",
        "hermes_message_succeeded",
        "hermes_message_failed",
        "hermes_message_retried",
        "hermes_message_deferred",
        "hermes_message_finished",
        "hermes_worker_metrics",
        "hermes_message_gave_up",
        "hermes_message_rejected",
        "hermes_handler_call",
        "hermes_emit_call",
        "hermes_tick",
        "hermes_cli_commands",
        "hermes_worker_process_exited",
        "hermes_process_exiting",
        "hermes_job_finished",
    }
    assert all(len(inspect.getdoc(f) or "") > 30 for f in hooks)


def _in_a_fresh_interpreter(script: str) -> Any:
    """What ``script`` printed as JSON, run by a new interpreter (nothing imported yet)."""
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)
