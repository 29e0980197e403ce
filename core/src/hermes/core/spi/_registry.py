from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import pluggy

from hermes.core import hookspecs
from hermes.core.model._errors import ConfigurationError, UnknownDriverError
from hermes.core.spi import _entry_points
from hermes.core.spi._driver import Capabilities, Driver
from hermes.core.spi._queues import url_queues, without_queues
from hermes.core.spi._shutdown import Shutdown
from hermes.core.spi._url import DriverUrl

if TYPE_CHECKING:
    from hermes.core.app._failed import QueueBrowser
    from hermes.core.model._message import Message

#: Marks the functions of a plugin module that implement :mod:`hermes.core.hookspecs`.
hookimpl = pluggy.HookimplMarker("hermes")

#: The distributions that add the schemes Hermes knows of, for error messages.
KNOWN_DISTRIBUTIONS = {
    "redis": "hermes-redis",
    "rediss": "hermes-redis",
    "amqp": "hermes-rabbitmq",
    "amqps": "hermes-rabbitmq",
    "sqs": "hermes-sqs",
    "kafka": "hermes-kafka",
    "file": "hermes-filesystem",
}


@dataclass(frozen=True)
class DriverPlugin:
    """What a driver distribution tells Hermes about one driver."""

    #: Short name shown by ``hermes drivers``.
    name: str
    #: URL schemes this driver handles, without ``://``.
    schemes: tuple[str, ...]
    #: Builds a driver from a parsed URL; rejects unknown options with
    #: :class:`ConfigurationError`. Keyword options of ``connect()`` are passed on.
    factory: Callable[..., Driver]
    #: What a driver built from a URL without options promises.
    capabilities: Capabilities
    #: Returns a URL on the same broker whose queues no other namespace uses;
    #: the conformance kit gives every test its own namespace this way.
    isolate: Callable[[DriverUrl, str], str]
    #: An example URL for help texts.
    example_url: str = ""
    #: Builds, from a driver of this plugin, a :class:`Shutdown` kept on its
    #: broker, so the workers that watch it there stop at once (``hermes shutdown
    #: --url`` sets it, ``hermes worker`` watches it); None when the broker cannot.
    shutdown: Callable[[Driver], Shutdown] | None = None
    #: Builds, from a driver of this plugin, a :class:`QueueBrowser` that lists and
    #: deletes the messages waiting on its queues without taking them, which reading
    #: a failed-message store (``hermes failed``) needs; None when the broker cannot.
    browse: Callable[[Driver], QueueBrowser] | None = None
    #: The distribution that registered it (filled in by the registry).
    distribution: str = ""
    version: str = ""


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._manager: pluggy.PluginManager | None = None
        #: id(plugin) -> (distribution, version) of entry-point plugins.
        self._origins: dict[int, tuple[str, str]] = {}
        #: Entry points that failed to import: name -> (distribution, the error).
        self.broken: dict[str, tuple[str, Exception]] = {}

    @property
    def manager(self) -> pluggy.PluginManager:
        manager = self._manager
        if manager is None:
            with self._lock:
                if self._manager is None:
                    manager = pluggy.PluginManager("hermes")
                    manager.add_hookspecs(hookspecs)
                    self._load_entry_points(manager)
                    self._manager = manager
                manager = self._manager
        return manager

    def _load_entry_points(self, manager: pluggy.PluginManager) -> None:
        # One by one rather than pluggy's load_setuptools_entrypoints: a plugin
        # that fails to import costs its own drivers, not every other one. And
        # read without importlib.metadata, whose import alone costs a tenth of a
        # worker's start-up (see _entry_points).
        for entry_point in _entry_points.entry_points("hermes"):
            if manager.get_plugin(entry_point.name) or manager.is_blocked(entry_point.name):
                continue
            origin = (entry_point.distribution, entry_point.version)
            try:
                plugin = entry_point.load()
                # A plugin whose hooks do not match this core's hookspecs (written
                # for another version) fails here: it is skipped like one that
                # does not import, so one stale plugin cannot stop every command.
                manager.register(plugin, name=entry_point.name)
            except Exception as exc:
                self.broken[entry_point.name] = (origin[0], exc)
                logger.warning(
                    "Hermes plugin %s (%s) could not be loaded and is skipped - %s: %s",
                    entry_point.name,
                    origin[0] or entry_point.value,
                    type(exc).__name__,
                    exc,
                )
                continue
            self._origins[id(plugin)] = origin

    def drivers(self) -> dict[str, DriverPlugin]:
        """Scheme -> driver, from every registered plugin (entry points or ``register()``)."""
        manager = self.manager
        drivers: dict[str, DriverPlugin] = {}
        #: scheme -> who claimed it, for the error message.
        claimed_by: dict[str, str] = {}
        for impl in manager.hook.hermes_drivers.get_hookimpls():
            dist = self._origins.get(id(impl.plugin))
            try:
                provided = cast(Sequence[DriverPlugin], impl.function())
            except Exception as exc:
                # One broken plugin costs its own drivers, not connect() to every other one.
                hook_failed(impl.plugin_name, "hermes_drivers", exc)
                self.broken[impl.plugin_name] = (dist[0] if dist else "", exc)
                continue
            for driver in provided:
                if dist is not None:
                    driver = replace(driver, distribution=dist[0], version=dist[1])
                origin = driver.distribution or f"plugin {impl.plugin_name!r}"
                for scheme in driver.schemes:
                    other = drivers.get(scheme)
                    # Any second claim is an error, even under the same driver name:
                    # which one won would depend on the plugin load order.
                    if other is not None:
                        raise ConfigurationError(
                            f"URL scheme {scheme}:// is claimed by two drivers: "
                            f"{other.name} ({claimed_by[scheme]}) and "
                            f"{driver.name} ({origin}); uninstall or unregister one of them"
                        )
                    drivers[scheme] = driver
                    claimed_by[scheme] = origin
        return drivers


logger = logging.getLogger("hermes")
_registry = _Registry()


#: (plugin, hook) pairs whose failure was logged at ERROR; later failures go to DEBUG.
_failures_logged: set[tuple[str, str]] = set()
_failures_lock = threading.Lock()


def hook_failed(plugin: str, hook: str, exc: BaseException) -> None:
    """Log that ``plugin``'s implementation of ``hook`` raised ``exc``, and go on.

    The first failure of a plugin in a hook is an ERROR with the traceback;
    the next ones are DEBUG lines, so a plugin that fails on every message
    does not bury the worker's log.
    """
    with _failures_lock:
        first = (plugin, hook) not in _failures_logged
        _failures_logged.add((plugin, hook))
    if first:
        logger.error(
            "Hermes plugin %s raised in %s and was skipped - %s: %s "
            "(its next failures in this hook are logged at DEBUG)",
            plugin,
            hook,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
    else:
        logger.debug(
            "Hermes plugin %s raised in %s again - %s: %s", plugin, hook, type(exc).__name__, exc
        )


def notify(hook: Any, **kwargs: Any) -> None:
    """Call an observer hook: each implementation in pluggy's order, none able to hurt the caller.

    An implementation that raises is logged by :func:`hook_failed` and the next
    one is called; the caller (Dispatcher, Emitter) never sees the exception.
    Wrapper implementations (``wrapper=True``/``hookwrapper=True``) have nothing
    to wrap here: they are skipped with an error. Nothing is called when nobody
    observes the hook (most workers): pluggy's empty call was a few per cent of
    a fast driver's per-message cost.
    """
    impls = hook.get_hookimpls()
    if not impls:
        return
    for impl in reversed(impls):
        try:
            if impl.wrapper or impl.hookwrapper:
                raise TypeError(
                    "observer hooks are called one implementation at a time; "
                    "implement it without wrapper=True/hookwrapper=True"
                )
            args = [kwargs[name] for name in impl.argnames]
            if impl.kwargnames:
                impl.function(
                    *args, **{name: kwargs[name] for name in impl.kwargnames if name in kwargs}
                )
            else:  # the usual implementation: positional arguments only
                impl.function(*args)
        except Exception as exc:
            hook_failed(impl.plugin_name, hook.name, exc)


#: A context manager a plugin returned and Hermes entered, with the plugin's name.
Entered = tuple[str, contextlib.AbstractContextManager[Any]]


def enter_calls(hook: Any, **kwargs: Any) -> list[Entered]:
    """Enter the context manager each implementation of ``hook`` returns; those entered.

    For the hooks around a handler call (tracing, error reports), whose call
    need not be one Python call (a handler's coroutine is awaited elsewhere):
    the caller runs it, then calls :func:`exit_calls` with the list and the
    exception it raised, if any. Implementations are entered in pluggy's
    order and exited in reverse, each seeing that exception. None of them can
    change what happens: one that raises (returning, entering or exiting) is
    logged by :func:`hook_failed` and left out, and a context manager that
    would swallow the exception does not.
    """
    entered: list[Entered] = []
    for impl in reversed(hook.get_hookimpls()):
        try:
            manager = impl.function(*[kwargs[name] for name in impl.argnames])
            if manager is None:
                continue
            manager.__enter__()
            entered.append((impl.plugin_name, manager))
        except Exception as exc:
            hook_failed(impl.plugin_name, hook.name, exc)
    return entered


def _exit_all(hook_name: str, entered: list[Entered], exc: BaseException | None) -> None:
    for plugin_name, manager in reversed(entered):
        try:
            manager.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        except Exception as error:
            hook_failed(plugin_name, hook_name, error)


def enter_emit_calls(hook: Any, message: Message, **kwargs: Any) -> tuple[Message, list[Entered]]:
    """Enter the managers ``hermes_emit_call`` returns for ``message``; the message to send.

    Each implementation is called with the message as the ones before it left
    it; the headers a manager's ``__enter__`` returns are added. What raises is
    logged by :func:`hook_failed` and left out. The caller sends the message
    and then calls :func:`exit_calls` with the list, and the exception if any.
    """
    entered: list[Entered] = []
    for impl in reversed(hook.get_hookimpls()):
        try:
            kwargs["message"] = message
            manager = impl.function(*[kwargs[name] for name in impl.argnames])
            if manager is None:
                continue
            headers = manager.__enter__()
            entered.append((impl.plugin_name, manager))
            if headers:
                message = message.replace(headers={**message.headers, **headers})
        except Exception as exc:
            hook_failed(impl.plugin_name, hook.name, exc)
    return message, entered


def exit_calls(hook: Any, entered: list[Entered], exc: BaseException | None) -> None:
    """Exit what :func:`enter_calls` or :func:`enter_emit_calls` entered, last first,
    each seeing ``exc``."""
    _exit_all(hook.name, entered, exc)


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide ``PluginManager("hermes")``, loaded from entry points on first use.

    ``plugin_manager().register(module)`` adds a plugin that is not installed
    (a test's own driver, say); its drivers are seen by the next ``connect()``.
    """
    return _registry.manager


@dataclass(frozen=True)
class PluginInfo:
    """One registered Hermes plugin, for ``hermes plugins``."""

    name: str
    distribution: str
    version: str
    #: The hooks it implements, e.g. ``("hermes_drivers",)``.
    hooks: tuple[str, ...]


def installed_plugins() -> list[PluginInfo]:
    """Every registered plugin (entry points and ``register()``), by name."""
    manager = _registry.manager
    found = []
    for name, plugin in manager.list_name_plugin():
        if plugin is None:
            continue  # blocked
        dist, version = _registry._origins.get(id(plugin), ("", ""))
        hooks = tuple(sorted(impl.name for impl in manager.get_hookcallers(plugin) or ()))
        found.append(PluginInfo(name, dist, version, hooks))
    return sorted(found, key=lambda info: info.name)


def available_drivers() -> list[DriverPlugin]:
    """The installed drivers, one entry each, sorted by name."""
    unique = {driver.name: driver for driver in _registry.drivers().values()}
    return sorted(unique.values(), key=lambda driver: driver.name)


def driver_for_url(url: str | DriverUrl) -> tuple[DriverPlugin, DriverUrl]:
    """The installed driver for ``url``'s scheme.

    Raises :class:`UnknownDriverError` saying which distribution to install.
    """
    parsed = url if isinstance(url, DriverUrl) else DriverUrl.parse(url)
    drivers = _registry.drivers()
    driver = drivers.get(parsed.scheme)
    if driver is None:
        installed = ", ".join(f"{scheme}://" for scheme in sorted(drivers)) or "none"
        dist = KNOWN_DISTRIBUTIONS.get(parsed.scheme)
        broken = [
            f"{name} ({origin}) is installed but failed to load: {type(exc).__name__}: {exc}"
            for name, (origin, exc) in _registry.broken.items()
            if dist is None or origin == dist
        ]
        if broken:
            hint = "; ".join(broken)
        elif dist:
            hint = f"`pip install {dist}` adds it"
        else:
            hint = f"install the distribution that provides {parsed.scheme}://"
        raise UnknownDriverError(
            f"no installed Hermes driver handles {parsed.scheme}:// ({parsed.redacted}); "
            f"installed schemes: {installed}; {hint}",
            parsed.scheme,
        )
    return driver, parsed


def connect(url: str, **options: Any) -> Driver:
    """Build the driver for ``url`` through its plugin, e.g. ``connect("redis://localhost:6379/0")``.

    Keyword ``options`` go to the driver's factory (objects a URL cannot carry).
    Bad URLs and options raise :class:`ConfigurationError` naming the problem.

    Every URL accepts ``priority_queues=NAME:P,NAME:P``: the driver is returned
    with ``setup_priority_queue(NAME, P)`` done for each, so a URL can carry the
    queue names a deployment uses (``?priority_queues=hermes_high:200,hermes_low:50``).
    """
    driver, parsed = driver_for_url(url)
    queues = url_queues(parsed)
    built = driver.factory(without_queues(parsed), **options)
    try:
        for priority, name in queues.items():
            built.setup_priority_queue(name, priority)
    except BaseException:
        built.close()
        raise
    return built


def isolated_url(url: str, namespace: str) -> str:
    """A URL on the same broker as ``url`` whose queues belong to ``namespace`` alone."""
    driver, parsed = driver_for_url(url)
    return driver.isolate(parsed, namespace)
