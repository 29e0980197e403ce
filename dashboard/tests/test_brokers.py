"""The dashboard on each broker: each page says what that driver can tell, ``?`` for the rest.

Every broker of tools/services.py, each test in a namespace of its own
(``isolated_url``), so it shares a server with any other suite. What each
broker can say comes from its driver: every ``queue_stats()`` counts the
ready messages, not every one counts those in flight; three plugins can list
what waits without taking it; three drivers keep heartbeats, and on the
other three the workers and the dashboard need ``--registry-url``.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import hermes_test_services
import pytest
from dash_support import HERE, eventually, get, serve_dashboard

from hermes.core import Message, connect
from hermes.core.driver import SupportsHeartbeats, SupportsTeardown
from hermes.core.drivertools import isolated_url
from hermes.core.heartbeat import HeartbeatPublisher


@dataclass(frozen=True)
class Broker:
    """A broker of tools/services.py and what its driver can tell the dashboard."""

    name: str
    #: The overview's in-flight cell with one message waiting and no worker: ``?``
    #: where neither the broker nor the workers' heartbeats can count what they hold.
    in_flight: str
    #: The driver's plugin lists what waits without taking it (the Queues page).
    browses: bool
    #: The driver keeps heartbeats itself (else the Workers page needs --registry-url).
    heartbeats: bool


BROKERS = [
    Broker("filesystem", in_flight="0", browses=True, heartbeats=True),
    # At most once: a popped message is nowhere in Redis; the heartbeats count it.
    Broker("redis", in_flight="0", browses=True, heartbeats=True),
    Broker("postgres", in_flight="0", browses=True, heartbeats=True),
    Broker("sqs", in_flight="0", browses=False, heartbeats=False),
    # AMQP has no count of unacknowledged messages (only the management plugin has).
    Broker("rabbitmq", in_flight="?", browses=False, heartbeats=False),
    # The group's lag includes the records a worker holds and has not committed.
    Broker("kafka", in_flight="?", browses=False, heartbeats=False),
]

NO_HEARTBEATS = "This broker keeps no heartbeats"
CANNOT_LIST = "This broker cannot list what waits in its queues without taking it"


def row_cells(page: str, priority: int) -> dict[str, str]:
    """The overview's counts in the row of ``priority``: column class -> text."""
    row = re.search(rf'<tr data-priority="{priority}">(.*?)</tr>', page, re.S)
    assert row is not None, f"no row for priority {priority}: {page[-2000:]}"
    return dict(re.findall(r'<td class="num ([a-z-]+)">([^<]*)</td>', row.group(1)))


def shown(value: int | None) -> str:
    """A count as the pages show it."""
    return "?" if value is None else f"{value:,}"


def assert_lists_the_heartbeat(
    base: str, registry: SupportsHeartbeats, message: Message, where: str
) -> None:
    """A record beaten on ``registry`` is listed with its job; once forgotten, it is gone."""
    _, empty = get(base + "/workers")
    assert 'id="no-workers"' in empty, f"{where}: {empty[-2000:]}"
    publisher = HeartbeatPublisher(registry, url="test://dashboard", interval_s=60)
    row = f'<tr data-pid="{os.getpid()}">'

    def describe() -> dict[str, object]:
        job = {"type": message.type, "id": message.id, "since": time.time()}
        return {"concurrency": 1, "in_flight": [job]}

    with publisher.running(describe):
        _, workers = get(base + "/workers")
        assert row in workers, f"{where}: the beaten record is not listed: {workers[-2000:]}"
        listed = workers[workers.index(row) :]
        assert f"#{message.id}" in listed and message.type in listed
        _, overview = get(base + "/")
        assert re.search(r'id="live-workers">1<', overview), overview[-2000:]

    def forgotten() -> bool:
        """the forgotten record to leave the Workers page"""
        return 'id="no-workers"' in get(base + "/workers")[1]

    eventually(forgotten)


@pytest.mark.parametrize("broker", BROKERS, ids=lambda broker: broker.name)
def test_the_dashboard_shows_what_the_broker_can_say(broker: Broker, tmp_path: Path) -> None:
    with hermes_test_services.service_url(broker.name) as service:
        url = isolated_url(service, f"dash-{uuid.uuid4().hex[:8]}")
        message = Message("dash.check", {"on": broker.name})
        with connect(url) as driver:
            assert isinstance(driver, SupportsTeardown)
            try:
                driver.send(message)
                check_pages(broker, url, message, tmp_path)
            finally:
                # Errors here fail the test: a namespace left behind is a bug too.
                driver.teardown()


def check_pages(broker: Broker, url: str, message: Message, tmp_path: Path) -> None:
    # After service_url(), which sets what the dashboard needs (AWS keys for SQS).
    unset = ("HERMES_DASHBOARD_AUTH", "HERMES_REGISTRY_URL")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    log = tmp_path / "dashboard.log"
    with serve_dashboard(url, HERE, env, log) as base:
        for path in ("/", "/queues", "/failed", "/workers", "/periodic"):
            status, page = get(base + path)
            assert status == 200, (path, page[-2000:])

        _, overview = get(base + "/")
        cells = row_cells(overview, 100)
        assert cells["ready"] == "1", f"every driver counts the message waiting: {cells}"
        assert cells["in-flight"] == broker.in_flight, cells
        with connect(url) as driver:
            (row,) = [r for r in driver.queue_stats() if r.priority == 100]  # type: ignore[attr-defined]
        # What the broker cannot count in flight, the heartbeats do where it keeps them.
        held = 0 if row.in_flight is None and broker.heartbeats else row.in_flight
        said = {
            "ready": row.ready,
            "scheduled": row.scheduled,
            "in-flight": held,
            "set-aside": row.set_aside,
        }
        assert cells == {column: shown(value) for column, value in said.items()}, (cells, said)

        _, queues = get(base + "/queues")
        if broker.browses:
            assert f'<td class="id">{message.id}</td>' in queues, queues[-3000:]
            assert CANNOT_LIST not in queues
        else:
            assert CANNOT_LIST in queues, queues[-3000:]
            assert message.id not in queues

        _, workers = get(base + "/workers")
        if broker.heartbeats:
            assert NO_HEARTBEATS not in workers
            with connect(url) as registry:
                assert isinstance(registry, SupportsHeartbeats)
                assert_lists_the_heartbeat(base, registry, message, broker.name)
        else:
            assert NO_HEARTBEATS in workers and "--registry-url" in workers, workers[-2000:]
            assert 'id="live-workers">?<' in overview, "no registry: the live workers are unknown"
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]

    if not broker.heartbeats:
        registry_url = (tmp_path / "registry").as_uri()
        registry_log = tmp_path / "dashboard-registry.log"
        with (
            serve_dashboard(url, HERE, env, registry_log, "--registry-url", registry_url) as base,
            connect(registry_url) as registry,
        ):
            assert isinstance(registry, SupportsHeartbeats)
            _, workers = get(base + "/workers")
            assert NO_HEARTBEATS not in workers, workers[-2000:]
            assert_lists_the_heartbeat(base, registry, message, f"{broker.name} + registry")
        assert "Traceback" not in registry_log.read_text(), registry_log.read_text()[-3000:]
