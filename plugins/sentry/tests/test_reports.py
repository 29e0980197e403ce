"""Sentry events from failing handlers, recorded by a transport instead of sent."""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.integrations.logging import LoggingIntegration
from sentry_sdk.transport import Transport

from hermes.core import Dispatcher, Emitter, Message, connect
from hermes.core.driver import Driver
from hermes.core.spi._registry import notify, plugin_manager
from hermes.core.testing import drain
from hermes.plugins.sentry import _plugin

_names = itertools.count()
#: ERROR lines as events: sentry-sdk 2's default, which sentry-sdk 3 leaves to the
#: application. Set here so both versions would turn the Dispatcher's ERROR line
#: about a failure into a second event, were the plugin not to prevent it.
LOGGING = LoggingIntegration(event_level=logging.ERROR)
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


class RecordingTransport(Transport):
    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        event = envelope.get_event()
        if event is not None:
            self.events.append(event)


@pytest.fixture
def events() -> Iterator[list[dict[str, Any]]]:
    transport = RecordingTransport()
    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=transport, integrations=[LOGGING])
    yield transport.events
    sentry_sdk.get_client().close()
    sentry_sdk.init()  # no DSN: nothing is sent by the tests after this one


@pytest.fixture
def driver() -> Iterator[Driver]:
    driver = connect(f"memory://sentry-{next(_names)}")
    yield driver
    driver.close()


def test_every_failure_is_one_event_warning_while_retried_error_when_given_up(
    events: list[dict[str, Any]], driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver.setup_priority_queue("high", 200)
    Emitter(driver).emit(Message("mail", {"to": "ana@example.com"}, headers=TRACE), 200)
    dispatcher = Dispatcher(driver)
    monkeypatch.setattr(dispatcher, "next_retry", lambda message: 0.0)  # copies due at once

    @dispatcher.handler("mail", max_retry=2)
    def send_mail(message: Message) -> None:
        sentry_sdk.add_breadcrumb(message=f"try {message.retries}")
        raise ConnectionError(f"smtp down (try {message.retries})")

    drain(dispatcher)
    assert [(e["level"], e["tags"]["hermes.outcome"]) for e in events] == [
        ("warning", "retried"),
        ("warning", "retried"),
        ("error", "gave_up"),
    ]
    first, _, last = events
    [exception] = first["exception"]["values"]
    assert (exception["type"], exception["value"]) == ("ConnectionError", "smtp down (try 0)")
    context = first["contexts"]["hermes_message"]
    assert {k: context[k] for k in ("type", "retries", "priority", "headers")} == {
        "type": "mail",
        "retries": 0,
        "priority": 200,
        "headers": TRACE,
    }
    assert context["retry_retries"] == 1
    assert "payload" not in context
    assert last["contexts"]["hermes_message"]["retries"] == 2
    # Retry copies go to the default priority.
    assert last["contexts"]["hermes_message"]["priority"] == 100
    assert first["contexts"]["hermes_message"]["id"] == last["contexts"]["hermes_message"]["id"]
    assert last["tags"]["hermes.handler"].endswith("send_mail")
    # A call's breadcrumbs are its own: the last event does not show the first tries.
    crumbs = [c.get("message") for c in last.get("breadcrumbs", {}).get("values", [])]
    assert "try 2" in crumbs
    assert "try 0" not in crumbs


def test_a_handler_that_returns_false_is_one_error_event(
    events: list[dict[str, Any]], driver: Driver
) -> None:
    Emitter(driver).emit(Message("refused"))
    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("refused", lambda message: False)
    drain(dispatcher)
    [event] = events
    assert (event["level"], event["tags"]["hermes.outcome"]) == ("error", "returned_false")
    assert "returned False" in str(event.get("logentry") or event.get("message"))


def test_successes_and_messages_without_a_handler_report_nothing(
    events: list[dict[str, Any]], driver: Driver
) -> None:
    Emitter(driver).emit(Message("fine"))
    Emitter(driver).emit(Message("nobody-handles-this"))
    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("fine", lambda message: None)
    drain(dispatcher)
    assert events == []


def test_a_sentry_sdk_that_raises_is_logged_and_changes_nothing_about_the_job(
    events: list[dict[str, Any]],
    driver: Driver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("sentry is broken")

    monkeypatch.setattr(sentry_sdk, "isolation_scope", broken)
    Emitter(driver).emit(Message("mail"))
    dispatcher = Dispatcher(driver)
    calls: list[int] = []

    @dispatcher.handler("mail", max_retry=1)
    def send_mail(message: Message) -> None:
        calls.append(message.retries)
        raise ConnectionError("smtp down")

    with caplog.at_level(logging.ERROR, "hermes"):
        drain(dispatcher)
    assert calls == [0]
    assert dispatcher.stats.retried == 1
    assert events == []
    assert "sentry raised in hermes_handler_call" in caplog.text


def test_without_a_dsn_no_scope_is_opened(driver: Driver) -> None:
    sentry_sdk.init()  # no DSN: the client has no transport, nothing could be sent
    assert sentry_sdk.get_client().transport is None
    assert _plugin.hermes_handler_call(message=Message("x"), priority=100, handler=object()) is None
    dispatcher = Dispatcher(driver)
    failed: list[int] = []

    @dispatcher.handler("failing")
    def failing(message: Message) -> None:
        failed.append(message.retries)
        raise ValueError("no report, and no error either")

    Emitter(driver).emit(Message("failing"))
    drain(dispatcher)
    assert failed == [0]
    assert dispatcher.stats.failed == 1


def test_a_process_exiting_flushes_the_events_the_client_still_holds(
    driver: Driver,
) -> None:
    class Buffering(RecordingTransport):
        """Holds events until flushed, as the SDK's own transport does on its thread."""

        def __init__(self) -> None:
            super().__init__()
            self.held: list[Envelope] = []

        def capture_envelope(self, envelope: Envelope) -> None:
            self.held.append(envelope)

        def flush(self, timeout: float, callback: Any = None) -> None:
            for envelope in self.held:
                super().capture_envelope(envelope)
            self.held.clear()

    transport = Buffering()
    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=transport, integrations=[LOGGING])
    try:
        Emitter(driver).emit(Message("refused"))
        dispatcher = Dispatcher(driver)
        dispatcher.register_handler("refused", lambda message: False)
        drain(dispatcher)
        assert transport.events == []

        notify(plugin_manager().hook.hermes_process_exiting)

        [event] = transport.events
        assert event["tags"]["hermes.outcome"] == "returned_false"
    finally:
        sentry_sdk.get_client().close()


def test_a_process_exiting_without_a_client_does_nothing() -> None:
    _plugin.hermes_process_exiting()


#: In a fresh interpreter: Sentry initialized, the plugin imported, an ERROR line on
#: the ``hermes`` logger before any handler ran: how many events Sentry made of it.
IMPORT_ONLY = """
import logging

import sentry_sdk
from sentry_sdk.integrations.logging import LoggingIntegration
from sentry_sdk.transport import Transport

events = []


class Recording(Transport):
    def capture_envelope(self, envelope):
        if envelope.get_event() is not None:
            events.append(envelope.get_event())


sentry_sdk.init(
    dsn="https://key@sentry.invalid/1",
    transport=Recording(),
    integrations=[LoggingIntegration(event_level=logging.ERROR)],
)
import hermes.plugins.sentry  # noqa: E402, F401

logging.getLogger("hermes").error("the application's own line")
sentry_sdk.flush(timeout=30)  # returns once sent; the default 2 s is short on a busy machine
print(len(events))
"""


def test_importing_the_plugin_leaves_sentry_s_logging_integration_as_it_was() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ONLY], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_async_handlers_failing_at_once_each_report_their_own_message_on_the_async_path(
    events: list[dict[str, Any]], driver: Driver
) -> None:
    import asyncio

    from hermes.core import Worker
    from hermes.core.run._worker import handler_mix

    for n in range(5):
        Emitter(driver).emit(Message("charge", {"n": n}))
    dispatcher = Dispatcher(driver)

    @dispatcher.handler("charge", max_retry=0)
    async def charge(message: Message) -> None:
        sentry_sdk.add_breadcrumb(message=f"charging {message.payload['n']}")
        await asyncio.sleep(0.05)  # the five are in flight together
        raise ValueError(f"card {message.payload['n']} declined")

    assert handler_mix(dispatcher) == "async", "the plugin keeps the async path"
    Worker(driver, dispatcher, handle_signals=False, concurrency=5, max_items=5).run()

    assert len(events) == 5
    ids = set()
    for event in events:
        [exception] = event["exception"]["values"]
        n = exception["value"].split()[1]  # "card N declined"
        crumbs = [crumb.get("message", "") for crumb in event["breadcrumbs"]["values"]]
        charging = [crumb for crumb in crumbs if crumb.startswith("charging")]
        assert charging == [f"charging {n}"], "each handler's breadcrumbs, in its own scope"
        ids.add(event["contexts"]["hermes_message"]["id"])
    assert len(ids) == 5, "each event carries its own message"
