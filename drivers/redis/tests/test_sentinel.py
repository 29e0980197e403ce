"""redis+sentinel://: a real master, one replica and three Sentinels; the master is killed.

The worker (at least once) and the emitter follow the failover to the
promoted replica, and no message the emitter was told was sent is lost:
the emitter's ``wait_replicas=1`` confirms each send on the replica, and the
leases are keys like any other, replicated with the rest.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from hermes.core import DriverError, Message, Worker, connect

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None,
    reason="needs redis-server (Sentinel runs as redis-server --sentinel)",
)

#: How long the worker and the emitter may take to follow a failover.
FOLLOW_S = 30.0


def _start(argv: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    import hermes_test_services

    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    hermes_test_services.wait_for_port(port, 30, argv[0], process)
    return process


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[dict[str, Any]]:
    import hermes_test_services

    master, replica = hermes_test_services.free_port(), hermes_test_services.free_port()
    base = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    processes = {"master": _start([*base, "--port", str(master)], master, tmp_path / "m.log")}
    processes["replica"] = _start(
        [*base, "--port", str(replica), "--replicaof", "127.0.0.1", str(master)],
        replica,
        tmp_path / "r.log",
    )
    ports = [hermes_test_services.free_port() for _ in range(3)]
    for index, port in enumerate(ports):
        config = tmp_path / f"sentinel-{index}.conf"
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
            f"sentinel monitor mymaster 127.0.0.1 {master} 2\n"
            "sentinel down-after-milliseconds mymaster 1000\n"
            "sentinel failover-timeout mymaster 10000\n"
        )
        processes[f"sentinel-{index}"] = _start(
            ["redis-server", str(config), "--sentinel"], port, tmp_path / f"s{index}.log"
        )
    try:
        # The Sentinels must know the replica (and each other) before the master dies.
        first = redis.Redis(port=ports[0])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = first.sentinel_master("mymaster")
            if info.get("num-slaves") == 1 and info.get("num-other-sentinels") == 2:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the Sentinels did not find the replica and each other: {info}")
        first.close()
        yield {
            "master": master,
            "replica": replica,
            "sentinels": ports,
            "processes": processes,
            "argv": [*base, "--port", str(master)],
            "log": tmp_path / "m2.log",
        }
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        for process in processes.values():
            process.wait(10)


def test_the_worker_and_the_emitter_follow_a_failover_and_lose_nothing(
    sentinels: dict[str, Any],
) -> None:
    hosts = ",".join(f"127.0.0.1:{port}" for port in sentinels["sentinels"])
    key = f"sentinel-{uuid.uuid4().hex[:8]}"
    base = f"redis+sentinel://{hosts}/mymaster/0?key={key}&schedule_key={key}_schedule"
    emitter = connect(f"{base}&wait_replicas=1&wait_timeout=1")
    worker_driver = connect(f"{base}&delivery=at-least-once&lease_timeout=5")
    sent: list[str] = []
    handled: set[str] = set()
    failures: list[float] = []
    stop = threading.Event()

    def emit() -> None:
        while not stop.is_set():
            message = Message("job")
            try:
                emitter.send(message)
            except DriverError:
                failures.append(time.monotonic())
                time.sleep(0.1)
                continue
            sent.append(message.id)
            time.sleep(0.02)

    worker = Worker(
        worker_driver,
        {"job": lambda m: handled.add(m.id)},
        handle_signals=False,
        stop_when=lambda: stop.is_set() and set(sent) <= handled,
    )
    threads = [threading.Thread(target=emit, daemon=True), threading.Thread(target=worker.run)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(handled) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(handled) >= 20, "the worker handled nothing before the failover"
        sentinels["processes"]["master"].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        sentinels["processes"]["master"].wait(10)
        # As a supervisor would, bring the dead node back -- once the Sentinels
        # promoted the replica, so that it rejoins as the new master's replica
        # (sooner, it would come back as an empty master). Until then the
        # emitter's wait_replicas=1 refuses to call a send confirmed.
        watcher = redis.Redis(port=sentinels["sentinels"][0])
        while time.monotonic() < killed_at + FOLLOW_S:
            _, port = watcher.sentinel_get_master_addr_by_name("mymaster")
            if int(port) != sentinels["master"]:
                break
            time.sleep(0.1)
        watcher.close()
        promoted_s = time.monotonic() - killed_at
        sentinels["processes"]["master"] = _start(
            sentinels["argv"], sentinels["master"], sentinels["log"]
        )
        before = len(sent)
        handled_before = len(handled)
        # Followed: new sends succeed and the worker handles them.
        while time.monotonic() < killed_at + FOLLOW_S:
            if len(sent) > before + 20 and len(handled) > handled_before + 20:
                break
            time.sleep(0.1)
        followed_s = time.monotonic() - killed_at
        assert len(sent) > before + 20, f"the emitter sent nothing new for {FOLLOW_S} s"
        assert len(handled) > handled_before + 20, (
            f"the worker handled nothing new for {FOLLOW_S} s"
        )
        print(
            f"replica promoted {promoted_s:.1f} s after the kill; worker and emitter followed "
            f"in {followed_s:.1f} s; {len(failures)} sends failed meanwhile"
        )
    finally:
        stop.set()
        threads[0].join(10)
        threads[1].join(FOLLOW_S)
    assert not threads[1].is_alive(), f"the worker did not drain: {len(set(sent) - handled)} left"
    lost = set(sent) - handled
    assert lost == set(), f"{len(lost)} of {len(sent)} confirmed sends were lost in the failover"
    emitter.close()
    worker_driver.close()
