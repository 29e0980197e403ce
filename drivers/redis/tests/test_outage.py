"""A Redis restart while a worker waits: logged, reconnected with core's backoff, work goes on.

Uses a throwaway redis-server of its own: the shared one on 6379 is never restarted.
"""

from __future__ import annotations

import logging

import pytest

from hermes.core import BrokerUnavailableError, HermesError, Message, connect


def test_a_waiting_worker_survives_a_redis_restart_and_send_fails_loudly_meanwhile(
    redis_url, start_worker, eventually, caplog, redis_server
):
    import hermes_test_services

    caplog.set_level(logging.INFO, logger="hermes")
    port = hermes_test_services.free_port()
    url = f"redis://127.0.0.1:{port}/0?refresh_interval=0.2"
    driver = connect(url)
    emitter = connect(url)
    with redis_server(port):
        worker = start_worker(driver)
        emitter.send(Message("before"))
        eventually(lambda: len(worker.handled) == 1, "the message sent before the restart")

    eventually(lambda: "unavailable while" in caplog.text, "the worker to log the outage")
    with pytest.raises(BrokerUnavailableError) as info:
        emitter.send(Message("during"))
    assert isinstance(info.value, HermesError)
    assert info.value.__cause__ is not None
    assert worker.thread.is_alive()

    with redis_server(port):
        emitter.send(Message("after"))
        eventually(lambda: len(worker.handled) == 2, "the message sent after the restart")
        worker.join()
    assert [m.type for m, _ in worker.handled] == ["before", "after"]
    assert "broker is back after" in caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings
    assert all("retrying in" in text and "unavailable while" in text for text in warnings)
    driver.close()
    emitter.close()
