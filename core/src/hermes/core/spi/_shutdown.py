from __future__ import annotations

import os
import time
from typing import Protocol, runtime_checkable

#: How long a Shutdown that asks something outside the process (a file, a
#: broker key) trusts its last answer: a busy worker stops at most this much
#: later than it would with a check per message, and pays one look per
#: interval instead of one per message.
SHUTDOWN_CHECK_INTERVAL_S = 0.5


@runtime_checkable
class Shutdown(Protocol):
    """Asks running workers to stop.

    ``should_shutdown(start_time)`` is checked at the top of every worker loop
    and before every idle wait, so once per message on a busy worker: it must
    be cheap. The shipped ones look at their file or key at most every
    :data:`SHUTDOWN_CHECK_INTERVAL_S` and answer from that look in between. A request
    made before the worker started (``start_time``) is ignored, so a stale
    request does not stop a freshly started worker.
    """

    def should_shutdown(self, start_time: float) -> bool: ...

    def shutdown(self, at: float | None = None) -> bool: ...


class SharedFileShutdown:
    """Shutdown through a file every worker can see: stop when its mtime >= start.

    The file is looked at (one ``stat``) at most every ``check_interval_s``
    seconds; ``check_interval_s=0`` looks at every check. :meth:`shutdown` on
    this object is seen at once.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, check_interval_s: float = SHUTDOWN_CHECK_INTERVAL_S
    ) -> None:
        if isinstance(check_interval_s, bool) or not check_interval_s >= 0:
            raise ValueError(
                f"check_interval_s must be a number of seconds >= 0, got {check_interval_s!r}"
            )
        #: The file whose modification time is the shutdown request.
        from pathlib import Path  # here: most workers never watch a file

        self.path = Path(path)
        self.check_interval_s = float(check_interval_s)
        #: The file's mtime at the last look (None: no file), and when to look again.
        self._requested: float | None = None
        self._look_at = 0.0

    def should_shutdown(self, start_time: float) -> bool:
        now = time.monotonic()
        if now >= self._look_at:
            self._look_at = now + self.check_interval_s
            try:
                self._requested = os.stat(self.path).st_mtime
            except FileNotFoundError:
                self._requested = None
        return self._requested is not None and self._requested >= start_time

    def shutdown(self, at: float | None = None) -> bool:
        """Ask the workers watching this file, started at or before ``at`` (now), to stop."""
        at = time.time() if at is None else at
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        os.utime(self.path, (at, at))
        self._look_at = 0.0
        return True

    def __repr__(self) -> str:
        return f"SharedFileShutdown({str(self.path)!r})"
