"""``hermes worker``: a Dispatcher on a broker URL with handlers from ``module:object``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from hermes.core._cli._common import (
    CliError,
    configure_logging,
    default_url,
    named_queues,
    one_line,
    raise_site,
    setup_priorities,
)
from hermes.core._cli._failed import FAILED_URL_ENV
from hermes.core._dispatcher import Dispatcher
from hermes.core._driver import DEFAULT_PRIORITY, Driver
from hermes.core._errors import ConfigurationError
from hermes.core._failed import FailedStore
from hermes.core._handler import Handler, HandlerRegistry, as_handler, handler_name
from hermes.core._message import Message
from hermes.core._registry import connect, driver_for_url, plugin_manager
from hermes.core._shutdown import SharedFileShutdown, Shutdown
from hermes.core._url import redact_url

logger = logging.getLogger("hermes")


class AnyShutdown:
    """Stops when any of several shutdowns asks (a shared file, a Redis key)."""

    def __init__(self, shutdowns: Iterable[Shutdown]) -> None:
        self.shutdowns = tuple(shutdowns)

    def should_shutdown(self, start_time: float) -> bool:
        return any(s.should_shutdown(start_time) for s in self.shutdowns)

    def shutdown(self, at: float | None = None) -> bool:
        results = [s.shutdown(at) for s in self.shutdowns]
        return any(results)

    def __repr__(self) -> str:
        return " or ".join(repr(s) for s in self.shutdowns)


def load_object(spec: str) -> object:
    """Import ``module:attr.path`` from the current directory or ``sys.path``.

    Every way it can go wrong is a :class:`CliError` that names the module and why.
    """
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise CliError(
            f"--handlers {spec!r} must be module:object, e.g. myapp.jobs:handlers "
            "(a HandlerRegistry, a dict of type -> handler, or a function that registers handlers)"
        )
    # Like `python -m`: modules in the current directory are importable.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise CliError(
                f"cannot import handlers module {module_name!r}: no module named {missing!r} "
                f"in the current directory ({cwd}) or on sys.path"
            ) from None
        raise CliError(
            f"cannot import handlers module {module_name!r}: it imports {missing!r}, "
            "which is not installed"
        ) from None
    except SyntaxError as exc:
        where = f"{Path(exc.filename or '?').name}:{exc.lineno}"
        raise CliError(
            f"cannot import handlers module {module_name!r}: SyntaxError at {where}: {exc.msg}"
        ) from None
    except Exception as exc:
        raise CliError(
            f"cannot import handlers module {module_name!r}: it raised "
            f"{type(exc).__name__}: {exc} ({raise_site(exc) or 'no traceback'})"
        ) from None
    obj: object = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(
                f"handlers module {module_name!r} ({_module_file(module)}) has no "
                f"attribute {attr_path!r}"
            ) from None
    return obj


def _module_file(module: object) -> str:
    return str(getattr(module, "__file__", None) or getattr(module, "__name__", "?"))


#: What to do with a handler function that was given to --handlers as if it registered handlers.
_FUNCTION_HINT = (
    "a function named by --handlers is called once with the Dispatcher to register "
    "handlers; to run a function for every message, name a dict {{'TYPE': {name}}} or a "
    "hermes.core.HandlerRegistry whose @registry.handler('TYPE') decorates it"
)


def register_handlers(dispatcher: Dispatcher, target: object, spec: str) -> None:
    """Register ``target`` on ``dispatcher``; every way it can be wrong is a :class:`CliError`.

    ``target`` is a :class:`HandlerRegistry`; a mapping type -> handler(s), where a
    handler is a function taking the message, an object with ``handle`` or a class
    (created once, without arguments); or a function taking the Dispatcher.
    """
    if isinstance(target, HandlerRegistry):
        target.register(dispatcher)
        return
    if isinstance(target, Mapping):
        for type_, value in target.items():
            if not isinstance(type_, str):
                raise CliError(f"--handlers {spec}: key {type_!r} is not a message type string")
            handlers = value if isinstance(value, list | tuple) else [value]
            for item in handlers:
                try:
                    handler = as_handler(_instance(item, type_, spec), type_)
                    dispatcher.register_handler(type_, handler)
                except ConfigurationError as exc:
                    raise CliError(f"--handlers {spec}: {exc}") from None
        return
    if isinstance(target, type) or callable(getattr(target, "handle", None)):
        name = getattr(target, "__name__", None) or type(target).__name__
        raise CliError(
            f"--handlers {spec} is a handler, not a registration: name a dict "
            f"{{'TYPE': {name}}}, a HandlerRegistry, or a function taking the Dispatcher "
            f"(dispatcher.register_handler('TYPE', {name}))"
        )
    if not callable(target):
        raise CliError(
            f"--handlers {spec} is a {type(target).__name__}: it must be a HandlerRegistry, a "
            "dict of type -> handler(s), or a function taking the Dispatcher"
        )
    name = getattr(target, "__name__", None) or spec
    parameter = _message_parameter(target)
    if parameter is not None:
        raise CliError(
            f"--handlers {spec} looks like a handler function (it takes {parameter!r}): "
            + _FUNCTION_HINT.format(name=name)
        )
    try:
        target(dispatcher)
    except Exception as exc:
        site = raise_site(exc) or "no traceback"
        raise CliError(
            f"--handlers {spec} raised {type(exc).__name__}: {exc} ({site}); if it is a "
            "handler rather than a registration: " + _FUNCTION_HINT.format(name=name)
        ) from None


def _message_parameter(function: Callable[..., object]) -> str | None:
    """The first parameter's name when it says "message" (by name or annotation), else None."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    if not parameters:
        return None
    first = parameters[0]
    annotation = first.annotation
    annotated = annotation is Message or (
        isinstance(annotation, str) and annotation.rpartition(".")[2] == "Message"
    )
    return first.name if annotated or first.name in ("message", "msg") else None


def _instance(handler: object, type_: str, spec: str) -> object:
    """``handler``, or an instance of it when it is a class."""
    if not isinstance(handler, type):
        return handler
    cls = handler
    try:
        return cls()
    except Exception as exc:
        raise CliError(
            f"--handlers {spec}: cannot create {cls.__name__}() for {type_!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def run(args: argparse.Namespace) -> int:
    url: str = args.url or default_url()
    failed_url: str | None = args.failed_url or os.environ.get(FAILED_URL_ENV) or None
    spec: str = args.handlers
    target = load_object(spec)
    verbosity = args.verbose - args.quiet
    configure_logging(verbosity)
    from_cli, from_url = named_queues(url, args.queue)
    priorities: list[int] = sorted(set(args.priority) | set(from_cli), reverse=True)

    with contextlib.ExitStack() as stack:
        driver = stack.enter_context(connect(url))
        store = stack.enter_context(FailedStore.connect(failed_url)) if failed_url else None
        if store is not None and repr(store.driver) == repr(driver):
            raise CliError(
                f"--failed-url is the worker's own queue ({driver!r}): messages given up on "
                "would come straight back; give the store its own queue, e.g. "
                "redis://HOST:6379/0?prefix=failed: or another file:// directory"
            )
        setup_priorities(driver, priorities, from_cli, preset=from_url)
        if args.max_items:
            driver.set_max_process_items(args.max_items)
        shutdowns: list[Shutdown] = []
        if args.shutdown_file:
            shutdowns.append(SharedFileShutdown(args.shutdown_file))
        broker_shutdown = driver_for_url(url)[0].shutdown
        if broker_shutdown is not None:  # e.g. Redis: the key hermes shutdown --url sets
            shutdowns.append(broker_shutdown(driver))
        shutdown = AnyShutdown(shutdowns) if shutdowns else None
        dispatcher = Dispatcher(
            driver,
            logger,
            shutdown=shutdown,
            concurrency=args.concurrency,
            time_limit_s=args.time_limit,
            grace_s=args.grace,
            failed=store,
        )
        dispatcher.log_each_message = verbosity > 0
        register_handlers(dispatcher, target, spec)
        if args.metrics_port is not None:
            served = plugin_manager().hook.hermes_worker_metrics(port=args.metrics_port, url=url)
            if served is None:
                raise CliError(
                    "--metrics-port needs a metrics plugin: pip install hermes-prometheus"
                )
            logger.info("Metrics on %s", served)
        registered = dispatcher.registered()
        if not registered:
            name = getattr(target, "__name__", None) or spec
            hint = _FUNCTION_HINT.format(name=name) if callable(target) else ""
            raise CliError(
                f"--handlers {spec} registered no handlers" + (f"; {hint}" if hint else "")
            )
        names = {**from_url, **from_cli}
        _log_start(
            url,
            driver,
            registered,
            priorities,
            names,
            args.max_items,
            shutdown,
            args.concurrency,
            failed_url,
        )
        # Imported here: _scheduler imports this module for load_object.
        from hermes.core._cli import _scheduler

        scheduler = None
        if args.scheduler:
            scheduler = _scheduler.start_in_worker(args, target, driver, url)
        started = time.monotonic()
        try:
            dispatcher.handle(priorities)
        finally:
            if scheduler is not None:
                scheduler.stop()
            print(_summary(dispatcher, time.monotonic() - started), flush=True)
    return 0


def _summary(dispatcher: Dispatcher, elapsed_s: float) -> str:
    stats = dispatcher.stats
    text = (
        f"Worker stopped after {elapsed_s:.1f} s: received {stats.received}, "
        f"handled {stats.handled}, failed {stats.failed}, retried {stats.retried}, "
        f"gave up {stats.gave_up}"
    )
    if dispatcher.failed is not None:
        text += f" ({stats.stored} kept in the failed-message store)"
    return text


def _log_start(
    url: str,
    driver: Driver,
    registered: Mapping[str, list[Handler]],
    priorities: list[int],
    names: Mapping[int, str],
    max_items: int,
    shutdown: Shutdown | None,
    concurrency: int,
    failed_url: str | None,
) -> None:
    caps = driver.capabilities
    logger.info(
        "Worker on %s (%s: %s, delay %s%s)",
        redact_url(url),
        type(driver).__name__,
        caps.delivery.value,
        caps.delay.value,
        ", priorities" if caps.priorities else "",
    )
    handlers = "; ".join(
        f"{t} -> {', '.join(handler_name(h) for h in hs)}" for t, hs in registered.items()
    )
    logger.info("Handlers: %s", handlers)

    def named(priority: int) -> str:
        return f"{priority} ({names[priority]})" if priority in names else str(priority)

    if priorities:
        reading = f"Reading priorities {', '.join(map(named, priorities))}"
    else:
        from_url = sorted(set(names) - {DEFAULT_PRIORITY}, reverse=True)
        reading = f"Reading priority {named(DEFAULT_PRIORITY)}" + (
            f", the URL's queues {', '.join(map(named, from_url))}" if from_url else ""
        )
        reading += " and the queues the handlers set up (--priority P or --queue NAME:P for others)"
    if concurrency > 1:
        reading += f"; {concurrency} handlers at once"
    stops = [f"after {max_items} message{'s' if max_items != 1 else ''}"] if max_items else []
    stops += ["on Ctrl-C", "SIGTERM"] + ([repr(shutdown)] if shutdown else [])
    logger.info(one_line(f"{reading}; stopping {', '.join(stops)}"))
    if failed_url:
        shown = redact_url(failed_url)
        logger.info("Messages given up on go to %s (hermes failed --url %s list)", shown, shown)
    else:
        logger.info(
            "Messages given up on are dropped after their log line; --failed-url keeps them"
        )
