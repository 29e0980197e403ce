"""``hermes worker``: a Dispatcher on a broker URL with handlers from ``module:object``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from hermes.core._cli._common import (
    CliError,
    configure_logging,
    default_url,
    one_line,
    raise_site,
    setup_priorities,
)
from hermes.core._dispatcher import Dispatcher
from hermes.core._driver import DEFAULT_PRIORITY, Driver
from hermes.core._handler import Handler
from hermes.core._registry import connect, driver_for_url
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
            f"--handlers {spec!r} must be module:object, e.g. myapp.jobs:register "
            "(a function that registers handlers, or a dict of type -> handler)"
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


def register_handlers(dispatcher: Dispatcher, target: object, spec: str) -> None:
    """Register ``target``: a mapping type -> handler(s), or a callable given the dispatcher.

    A handler class in a mapping is instantiated without arguments.
    """
    if isinstance(target, Mapping):
        for type_, value in target.items():
            if not isinstance(type_, str):
                raise CliError(f"--handlers {spec}: key {type_!r} is not a message type string")
            handlers = value if isinstance(value, list | tuple) else [value]
            for handler in handlers:
                dispatcher.register_handler(type_, _instance(handler, type_, spec))
        return
    if isinstance(target, type) or callable(getattr(target, "handle", None)):
        raise CliError(
            f"--handlers {spec} is a handler, not a registration: point it at a function "
            "taking the Dispatcher (dispatcher.register_handler('type', Handler())) or at a "
            "dict {'type': Handler()}"
        )
    if not callable(target):
        raise CliError(
            f"--handlers {spec} is a {type(target).__name__}: it must be a function taking "
            "the Dispatcher, or a dict of type -> handler(s)"
        )
    try:
        target(dispatcher)
    except Exception as exc:
        site = raise_site(exc) or "no traceback"
        raise CliError(f"--handlers {spec} raised {type(exc).__name__}: {exc} ({site})") from None


def _instance(handler: object, type_: str, spec: str) -> Handler:
    if isinstance(handler, type):
        cls = handler
        try:
            handler = cls()
        except Exception as exc:
            raise CliError(
                f"--handlers {spec}: cannot create {cls.__name__}() for {type_!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    if not callable(getattr(handler, "handle", None)):
        raise CliError(
            f"--handlers {spec}: the handler for {type_!r} ({handler!r}) has no "
            "handle(message) method"
        )
    return handler  # type: ignore[return-value]


def run(args: argparse.Namespace) -> int:
    url: str = args.url or default_url()
    spec: str = args.handlers
    target = load_object(spec)
    verbosity = args.verbose - args.quiet
    configure_logging(verbosity)
    priorities: list[int] = sorted(set(args.priority), reverse=True)

    with connect(url) as driver:
        setup_priorities(driver, priorities)
        if args.max_items:
            driver.set_max_process_items(args.max_items)
        shutdowns: list[Shutdown] = []
        if args.shutdown_file:
            shutdowns.append(SharedFileShutdown(args.shutdown_file))
        broker_shutdown = driver_for_url(url)[0].shutdown
        if broker_shutdown is not None:  # e.g. Redis: the key hermes shutdown --url sets
            shutdowns.append(broker_shutdown(driver))
        shutdown = AnyShutdown(shutdowns) if shutdowns else None
        dispatcher = Dispatcher(driver, logger, shutdown=shutdown)
        dispatcher.log_each_message = verbosity > 0
        register_handlers(dispatcher, target, spec)
        registered = dispatcher.registered()
        if not registered:
            raise CliError(f"--handlers {spec} registered no handlers")
        _log_start(url, driver, registered, priorities, args.max_items, shutdown)
        started = time.monotonic()
        try:
            dispatcher.handle(priorities)
        finally:
            stats = dispatcher.stats
            print(
                f"Worker stopped after {time.monotonic() - started:.1f} s: "
                f"received {stats.received}, handled {stats.handled}, "
                f"failed {stats.failed}, retried {stats.retried}",
                flush=True,
            )
    return 0


def _log_start(
    url: str,
    driver: Driver,
    registered: Mapping[str, list[Handler]],
    priorities: list[int],
    max_items: int,
    shutdown: Shutdown | None,
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
        f"{t} -> {', '.join(type(h).__name__ for h in hs)}" for t, hs in registered.items()
    )
    logger.info("Handlers: %s", handlers)
    reading = (
        f"Reading priorities {', '.join(map(str, priorities))}"
        if priorities
        else f"Reading priority {DEFAULT_PRIORITY} and the queues the handlers set up "
        "(--priority P for others)"
    )
    stops = [f"after {max_items} message{'s' if max_items != 1 else ''}"] if max_items else []
    stops += ["on Ctrl-C", "SIGTERM"] + ([repr(shutdown)] if shutdown else [])
    logger.info(one_line(f"{reading}; stopping {', '.join(stops)}"))
