"""An installed plugin imports no OpenTelemetry until the process could trace."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import sys

from hermes.core import Emitter, Message, Worker, connect
from hermes.core.spi._registry import plugin_manager

assert "opentelemetry" in dict(plugin_manager().list_name_plugin()), "the plugin is not registered"
driver = connect("memory://lazy-otel")
Emitter(driver).emit(Message("job"))
Worker(driver, {"job": lambda message: None}, max_items=1, handle_signals=False).run()
print("untraced:", "opentelemetry.trace" in sys.modules)
traceparent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
Emitter(driver).emit(Message("job", headers={"traceparent": traceparent}))
Worker(driver, {"job": lambda message: None}, max_items=1, handle_signals=False).run()
print("a message carrying a trace context:", "opentelemetry.trace" in sys.modules)
"""


def test_the_api_is_imported_only_once_a_message_carries_a_trace_context_to_pass_on() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "untraced: False",
        "a message carrying a trace context: True",
    ]
