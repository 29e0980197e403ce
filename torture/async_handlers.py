"""The async soak's handler: ``hermes worker --handlers torture.async_handlers:HANDLERS``.

Awaits ``ASYNC_SOAK_WORK_S`` (so kills land on coroutines in flight), then
appends ``<n>\\t<pid>\\t<threads>`` to ``ASYNC_SOAK_RECORD`` with one
``write()`` on an ``O_APPEND`` descriptor: a line written survives a SIGKILL.
``threads`` is the worker's thread count then: a coroutine that held a
thread of its own would show hundreds.
"""

from __future__ import annotations

import asyncio
import os
import threading

from hermes.core import Message

_fd = os.open(os.environ["ASYNC_SOAK_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
_work_s = float(os.environ["ASYNC_SOAK_WORK_S"])


async def record(message: Message) -> None:
    await asyncio.sleep(_work_s)
    line = f"{message.payload['n']}\t{os.getpid()}\t{threading.active_count()}\n"
    os.write(_fd, line.encode())


HANDLERS = {"torture": record}
