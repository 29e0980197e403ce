from __future__ import annotations

import logging

from hermes.core._driver import DEFAULT_PRIORITY, Driver
from hermes.core._message import Message
from hermes.core._registry import plugin_manager


class Emitter:
    """Puts messages on a driver's broker; what a web request uses.

    ``emit`` returns as soon as ``driver.send`` returns. It is as thread-safe
    as ``driver.send``, which every driver makes thread-safe.
    """

    def __init__(self, driver: Driver, logger: logging.Logger | None = None) -> None:
        self.driver = driver
        self.logger = logger or logging.getLogger("hermes")
        self._hooks = plugin_manager().hook

    def emit(self, message: Message, priority: int = DEFAULT_PRIORITY) -> Emitter:
        self.driver.send(message, priority)
        if self.logger.isEnabledFor(logging.INFO):
            self.logger.info(
                "Dispatcher send message #%s to driver %s", message.id, type(self.driver).__name__
            )
        emitted = self._hooks.hermes_message_emitted
        if emitted.get_hookimpls():  # skip pluggy's call machinery when nobody observes
            emitted(message=message, priority=priority, driver=self.driver)
        return self
