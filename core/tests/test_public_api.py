"""The public API importable from ``hermes.core``."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import hermes.core
import hermes.core.driver
import hermes.core.drivertools
from hermes.core import Dispatcher, Emitter, Message

REQUIRED = {
    "Message", "Emitter", "Dispatcher", "Worker", "Handler", "HandlerRegistry",
    "RetryableHandler", "RetryMixin", "EchoHandler", "DEFAULT_PRIORITY", "Shutdown",
    "SharedFileShutdown", "HermesError", "SerializeError", "NotSupportedError",
    "UnknownPriorityError", "BrokerRefusedError", "Outcome", "connect", "available_drivers",
}  # fmt: skip
#: The driver contract: what a driver author implements and declares, and the
#: types in those signatures.
DRIVER_CONTRACT = {
    "Driver", "Consumer", "Received", "Outgoing", "DriverPlugin", "DriverUrl", "hookimpl",
    "Capabilities", "Delay", "Delivery", "QueueStats", "BrowsePage", "QueueBrowser",
    "DEFAULT_PRIORITY", "IDLE_WAIT_S", "SupportsClaim", "SupportsHeartbeats", "SupportsPurge",
    "SupportsRecordPages", "SupportsRecordWatch", "SupportsRecords", "SupportsStats",
    "SupportsTally", "SupportsTeardown", "SupportsLimits", "LimitRule", "Take",
}  # fmt: skip
#: Core's helpers for a driver.
DRIVER_TOOLS = {
    "AckBatch", "Handover", "LeaseKeeper", "PerProcess", "owner_id", "current_received",
    "TlsOptions", "CertificateRefusedError", "isolated_url", "redact_url", "lazy_exports",
    "outgoing", "page_of", "limit_state", "error_text", "plugin_manager", "Door",
    "MessageSerializer", "Serializer", "Message", "SHUTDOWN_CHECK_INTERVAL_S", "MemoryDriver",
}  # fmt: skip
#: Names both an application and a driver use, in both modules.
SHARED = {"DEFAULT_PRIORITY", "hookimpl", "Message", "redact_url"}


def test_every_required_name_is_exported_and_importable() -> None:
    assert set(hermes.core.__all__) >= REQUIRED
    for name in hermes.core.__all__:
        assert getattr(hermes.core, name) is not None, name


def test_application_code_and_driver_authors_have_a_module_each() -> None:
    assert len(hermes.core.__all__) <= 31
    assert set(hermes.core.driver.__all__) == DRIVER_CONTRACT
    assert set(hermes.core.drivertools.__all__) == DRIVER_TOOLS
    assert not DRIVER_CONTRACT & DRIVER_TOOLS
    assert not [name for name in DRIVER_TOOLS if hasattr(hermes.core.driver, name)]
    assert set(hermes.core.__all__) & (DRIVER_CONTRACT | DRIVER_TOOLS) == SHARED
    for module in (hermes.core.driver, hermes.core.drivertools):
        assert len(module.__all__) == len(set(module.__all__)), module.__name__
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"


def test_a_driver_author_name_is_not_an_application_name() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'Driver'"):
        hermes.core.Driver  # type: ignore[attr-defined]  # noqa: B018


def test_php_spelling_runs_a_worker_from_the_compat_module() -> None:
    from hermes.core import compat
    from hermes.core.drivertools import MemoryDriver

    driver = MemoryDriver()
    Emitter(driver).emit(Message("job", {"n": 1})).emit(Message("job", {"n": 2}))
    seen: list[int] = []
    compat.set_max_process_items(driver, 1)
    dispatcher = compat.Dispatcher(driver).register_handler(
        "job", lambda message: seen.append(message.payload["n"])
    )

    dispatcher.handle()
    compat.wait(driver, lambda message, priority: seen.append(message.payload["n"]) is None)

    assert seen == [1, 2]
    assert not hasattr(Dispatcher, "handle")
    assert not hasattr(hermes.core.driver.Driver, "wait")


def test_all_lists_no_private_names_and_no_duplicates() -> None:
    assert not [name for name in hermes.core.__all__ if name.startswith("_")]
    assert len(hermes.core.__all__) == len(set(hermes.core.__all__))


def test_hermes_and_hermes_drivers_are_namespace_packages() -> None:
    core_src = Path(hermes.core.__file__).parents[2]

    assert not (core_src / "hermes" / "__init__.py").exists()
    assert not (core_src / "hermes" / "drivers" / "__init__.py").exists()
    assert (core_src / "hermes" / "core" / "py.typed").exists()


def test_the_signatures_are_the_documented_ones() -> None:
    assert str(inspect.signature(Message)) == (
        "(type: 'str', payload: 'dict[str, Any] | list[Any] | None' = None, *, "
        "id: 'str | None' = None, "
        "created: 'float | None' = None, "
        "execute_at: 'float | datetime.datetime | None' = None, retries: 'int' = 0, "
        "headers: 'Mapping[str, str] | None' = None) -> 'None'"
    )
    parameters = inspect.signature(Dispatcher).parameters
    assert list(parameters)[:4] == ["driver", "logger", "shutdown", "randomizer"]
    # Everything after PHP's four is keyword-only, so positional PHP-style calls keep working.
    assert all(p.kind is p.KEYWORD_ONLY for p in list(parameters.values())[4:])
    assert parameters["failed"].default is None
    emit = inspect.signature(Emitter.emit).parameters
    assert list(emit) == ["self", "message", "priority", "unique_for", "unique_key", "expires_in"]
    assert emit["priority"].default == 100
    assert emit["unique_for"].kind is inspect.Parameter.KEYWORD_ONLY
    assert emit["expires_in"].kind is inspect.Parameter.KEYWORD_ONLY


def test_the_echo_handler_prints_the_message_and_succeeds(capsys: object) -> None:
    message = Message("hello", {"name": "Žilina"})

    assert hermes.core.EchoHandler().handle(message) is True

    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert f"#{message.id}" in out
    assert "Žilina" in out


#: Imported where they are used, not by ``import hermes.core``: each cost a few
#: milliseconds of every process's start-up, and most processes never need them.
IMPORTED_LATER = ("uuid", "decimal", "zoneinfo", "hashlib", "ctypes", "pathlib", "asyncio", "ssl")


def test_importing_hermes_core_leaves_out_what_only_some_processes_use() -> None:
    code = (
        "import sys; before = set(sys.modules); import hermes.core; "
        f"print(sorted(m for m in {IMPORTED_LATER!r} if m in sys.modules and m not in before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
