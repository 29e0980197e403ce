"""Loading what ``--handlers MODULE:OBJECT`` names, and registering it on a Dispatcher."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from hermes.core._cli._common import (
    CliError,
    raise_site,
)
from hermes.core.app._dispatcher import Dispatcher
from hermes.core.app._handler import HandlerRegistry, as_handler
from hermes.core.model._errors import ConfigurationError
from hermes.core.model._message import Message

if TYPE_CHECKING:
    pass


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
    if "/" in module_name or "\\" in module_name or module_name.endswith(".py"):
        raise CliError(_file_path_hint(spec, module_name, attr_path))
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
        where = f"{os.path.basename(exc.filename or '?')}:{exc.lineno}"
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


def _file_path_hint(spec: str, path: str, attr_path: str) -> str:
    """What to give instead of a file path: the module, and where to run the worker."""
    from pathlib import Path

    file = Path(path.removesuffix(".py"))
    if file.is_absolute():
        module, where = file.name, f"{file.name}.py ({file.parent})"
    else:
        parts = [part for part in file.parts if part not in (".", "")]
        module = ".".join(parts) or path
        where = f"{parts[0]}/" if len(parts) > 1 else f"{module}.py"
    return (
        f"--handlers {spec!r} names a file; give the module: --handlers {module}:{attr_path}, "
        f"run from the directory that holds {where}"
    )


def _module_file(module: object) -> str:
    return str(getattr(module, "__file__", None) or getattr(module, "__name__", "?"))


#: What to do with a handler function that was given to --handlers as if it registered handlers.
FUNCTION_HINT = (
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
            + FUNCTION_HINT.format(name=name)
        )
    try:
        target(dispatcher)
    except Exception as exc:
        site = raise_site(exc) or "no traceback"
        raise CliError(
            f"--handlers {spec} raised {type(exc).__name__}: {exc} ({site}); if it is a "
            "handler rather than a registration: " + FUNCTION_HINT.format(name=name)
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
