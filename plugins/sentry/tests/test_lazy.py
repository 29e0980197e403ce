"""An installed plugin imports no Sentry SDK: a process that never imported it has no init()."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys

from hermes.core import Emitter, Message, Worker, connect
from hermes.core.spi._registry import plugin_manager

assert "sentry" in dict(plugin_manager().list_name_plugin()), "the plugin is not registered"
driver = connect("memory://lazy-sentry")


def fails(message):
    raise RuntimeError("reported nowhere: Sentry is not initialized")


Emitter(driver).emit(Message("job"))
Worker(driver, {"job": fails}, max_items=1, handle_signals=False).run()
print("sentry_sdk imported:", "sentry_sdk" in sys.modules)
"""


def test_a_worker_whose_handler_fails_imports_no_sentry_sdk_unless_the_application_did() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["sentry_sdk imported: False"]
    assert "reported nowhere" in done.stderr  # the worker's own log line, as always
