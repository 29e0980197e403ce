"""An installed plugin costs a worker nothing until something can read the metrics."""

from __future__ import annotations

import subprocess
import sys

#: In a fresh interpreter: a worker handles a job with the plugin registered and
#: nothing importing prometheus_client; then the application imports it, and the
#: next job is counted.
SCRIPT = """
import sys

from hermes.core import Dispatcher, Emitter, Message, Worker, connect
from hermes.core.spi._registry import plugin_manager

assert "prometheus" in dict(plugin_manager().list_name_plugin()), "the plugin is not registered"
driver = connect("memory://lazy-metrics")
dispatcher = Dispatcher(driver).register_handler("job", lambda message: None)


def one_job():
    Emitter(driver).emit(Message("job"))
    Worker(driver, dispatcher, max_items=1, handle_signals=False).run()


one_job()
print("client imported after a job:", "prometheus_client" in sys.modules)
from prometheus_client import REGISTRY

one_job()
print("counted:", REGISTRY.get_sample_value("hermes_messages_handled_total", {"type": "job"}))
"""


def test_registering_the_plugin_imports_no_client_and_counting_starts_once_it_is_imported() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["client imported after a job: False", "counted: 1.0"]
