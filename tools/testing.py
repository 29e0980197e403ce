"""What the driver test suites share: waiting to a deadline, and a Shutdown set by hand.

The root ``conftest.py`` loads this file as the module ``hermes_test_support``
(test directories are not packages, so there is nothing else to import it
from); ``from hermes_test_support import eventually, StopFlag, StopWhen`` then
works in every conftest and test module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

#: How long a test polls for something that should take milliseconds.
DEADLINE_S = 10.0


def eventually(
    condition: Callable[[], Any],
    what: str,
    timeout_s: float = DEADLINE_S,
    interval_s: float = 0.01,
) -> Any:
    """``condition()``'s first truthy value, polled until ``timeout_s``; fails naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


class StopFlag:
    """A Shutdown a test sets by hand, from any thread."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def should_shutdown(self, start_time: float) -> bool:
        return self.event.is_set()

    def shutdown(self, at: float | None = None) -> bool:
        self.event.set()
        return True


class StopWhen:
    """A Shutdown that stops ``wait()`` once ``condition()`` holds, at ``timeout_s``, or when set.

    The deadline turns a worker that never gets its messages into a failing
    test instead of a hanging one.
    """

    def __init__(
        self, condition: Callable[[], Any] = lambda: False, timeout_s: float = DEADLINE_S
    ) -> None:
        self.condition = condition
        self.deadline = time.monotonic() + timeout_s
        self.event = threading.Event()

    def should_shutdown(self, start_time: float) -> bool:
        return self.event.is_set() or bool(self.condition()) or time.monotonic() > self.deadline

    def shutdown(self, at: float | None = None) -> bool:
        self.event.set()
        return True
