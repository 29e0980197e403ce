from __future__ import annotations

import logging
from collections.abc import Sequence

from hermes.core._driver import DEFAULT_PRIORITY, Driver
from hermes.core._message import Message
from hermes.core._registry import enter_emit_calls, exit_calls, notify, plugin_manager


class Emitter:
    """Puts messages on a driver's broker; what a web request uses.

    ``emit`` returns as soon as ``driver.send`` returns. It is as thread-safe
    as ``driver.send``, which every driver makes thread-safe.

    Plugins implementing ``hermes_emit_call`` (tracing) run around each send
    and may add headers: the message sent is then a copy of the one given,
    with them.
    """

    def __init__(self, driver: Driver, logger: logging.Logger | None = None) -> None:
        self.driver = driver
        self.logger = logger or logging.getLogger("hermes")
        self._hooks = plugin_manager().hook

    def emit(self, message: Message, priority: int = DEFAULT_PRIORITY) -> Emitter:
        hook = self._hooks.hermes_emit_call
        if not hook.get_hookimpls():
            self.driver.send(message, priority)
        else:
            message, entered = enter_emit_calls(
                hook, message, priority=priority, driver=self.driver
            )
            try:
                self.driver.send(message, priority)
            except BaseException as exc:
                exit_calls(hook, entered, exc)
                raise
            exit_calls(hook, entered, None)
        self._emitted(message, priority)
        return self

    async def emit_async(self, message: Message, priority: int = DEFAULT_PRIORITY) -> Emitter:
        """``emit`` for async code: the send runs in a thread, so the event loop keeps serving.

        The blocking ``driver.send`` runs in the loop's default thread pool
        (``asyncio.to_thread``); the await ends when the broker took the message,
        and raises what ``emit`` would. Cancelling the awaiting task does not stop a
        send already under way: the message may still be emitted.
        """
        import asyncio  # imported here: synchronous users do not pay for it

        await asyncio.to_thread(self.emit, message, priority)
        return self

    def emit_batch(self, messages: Sequence[Message], priority: int = DEFAULT_PRIORITY) -> Emitter:
        """``emit`` each of ``messages``, in one broker round trip where the driver can."""
        hook = self._hooks.hermes_emit_call
        if not hook.get_hookimpls():
            self.driver.send_batch(messages, priority)
        else:
            sent: list[Message] = []
            entered = []
            for message in messages:
                message, entered_for_one = enter_emit_calls(
                    hook, message, priority=priority, driver=self.driver
                )
                sent.append(message)
                entered += entered_for_one
            try:
                self.driver.send_batch(sent, priority)
            except BaseException as exc:
                exit_calls(hook, entered, exc)
                raise
            exit_calls(hook, entered, None)
            messages = sent
        for message in messages:
            self._emitted(message, priority)
        return self

    def _emitted(self, message: Message, priority: int) -> None:
        if self.logger.isEnabledFor(logging.INFO):
            self.logger.info(
                "Emitted message #%s (%s) priority:%s to %r",
                message.id,
                message.type,
                priority,
                self.driver,
            )
        notify(
            self._hooks.hermes_message_emitted,
            message=message,
            priority=priority,
            driver=self.driver,
        )
