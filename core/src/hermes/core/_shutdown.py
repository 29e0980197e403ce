from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class Shutdown(Protocol):
    """Asks running workers to stop.

    ``should_shutdown(start_time)`` is checked by the driver at the top of every
    loop and before every idle wait; it must be cheap (a stat, a GET). A request
    made before the worker started (``start_time``) is ignored, so a stale
    request does not stop a freshly started worker.
    """

    def should_shutdown(self, start_time: float) -> bool: ...

    def shutdown(self, at: float | None = None) -> bool: ...


class SharedFileShutdown:
    """Shutdown through a file every worker can see: stop when its mtime >= start."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        #: The file whose modification time is the shutdown request.
        self.path = Path(path)

    def should_shutdown(self, start_time: float) -> bool:
        try:
            return self.path.stat().st_mtime >= start_time
        except FileNotFoundError:
            return False

    def shutdown(self, at: float | None = None) -> bool:
        """Ask the workers watching this file, started at or before ``at`` (now), to stop."""
        at = time.time() if at is None else at
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        os.utime(self.path, (at, at))
        return True

    def __repr__(self) -> str:
        return f"SharedFileShutdown({str(self.path)!r})"
