"""queue_stats() and clear(): what hermes stats and hermes purge show and do on Redis."""

from __future__ import annotations

import json
import time

import pytest

from hermes.core import Message, UnknownPriorityError
from hermes.core.cli import main
from hermes.core.driver import QueueStats, SupportsPurge, SupportsStats
from hermes.drivers.redis import RedisSetDriver, rejected_key

HIGH, LOW = 200, 50


@pytest.fixture
def queues(driver: RedisSetDriver, namespace: str) -> RedisSetDriver:
    """The driver with three priorities: 3 high, 2 default and 4 scheduled, 1 low."""
    driver.setup_priority_queue(f"{namespace}-high", HIGH)
    driver.setup_priority_queue(f"{namespace}-low", LOW)
    driver.send_batch([Message("h", {"i": i}) for i in range(3)], HIGH)
    driver.send_batch([Message("d", {"i": i}) for i in range(2)])
    later = time.time() + 600
    driver.send_batch([Message("s", {"i": i}, execute_at=later) for i in range(3)])
    driver.send(Message("s-high", execute_at=later), HIGH)  # lands on 100 when due
    driver.send(Message("l"), LOW)
    return driver


def test_each_priority_counts_its_set_and_the_schedule_is_on_the_default_row(
    queues, client, namespace
):
    client.lpush(rejected_key(f"{namespace}-low"), b"bad 1", b"bad 2")
    assert isinstance(queues, SupportsStats)
    assert queues.queue_stats() == [
        QueueStats(HIGH, f"{namespace}-high", ready=3, scheduled=None, set_aside=0),
        QueueStats(100, namespace, ready=2, scheduled=4, set_aside=0),
        QueueStats(LOW, f"{namespace}-low", ready=1, scheduled=None, set_aside=2),
    ]


def test_an_at_least_once_driver_counts_what_every_worker_holds_as_in_flight(client, namespace):
    driver = RedisSetDriver(
        client, key=namespace, schedule_key=f"{namespace}_schedule", delivery="at-least-once"
    )
    driver.send_batch([Message("m", {"i": i}) for i in range(5)])
    with driver.consumer([]) as one, driver.consumer([]) as two:
        received = one.receive(1)
        assert received is not None
        [row] = driver.queue_stats()
        assert (row.ready, row.in_flight, row.scheduled, row.set_aside) == (4, 1, 0, 0)
        assert two.receive(1) is not None and two.receive(1) is not None
        [row] = driver.queue_stats()
        assert (row.ready, row.in_flight) == (2, 3)
        one.release(received)
        [row] = driver.queue_stats()
        assert (row.ready, row.in_flight) == (3, 2)


def test_purge_deletes_every_set_and_the_schedule_and_says_how_many(queues, client, namespace):
    assert isinstance(queues, SupportsPurge)
    client.lpush(rejected_key(namespace), b"bad")
    assert queues.purge() == 3 + 2 + 4 + 1
    assert [(r.ready, r.scheduled) for r in queues.queue_stats()] == [
        (0, None),
        (0, 0),
        (0, None),
    ]
    assert client.llen(rejected_key(namespace)) == 1  # set aside stays
    assert queues.purge() == 0


def test_purging_one_priority_leaves_the_others_and_the_schedule_goes_with_the_default(
    queues, client, namespace
):
    assert queues.purge(HIGH) == 3
    assert client.scard(f"{namespace}-high") == 0
    assert client.scard(namespace) == 2 and client.zcard(f"{namespace}_schedule") == 4
    assert queues.purge(100) == 2 + 4
    assert client.scard(f"{namespace}-low") == 1
    with pytest.raises(UnknownPriorityError, match="priority 7"):
        queues.purge(7)
    assert client.scard(f"{namespace}-low") == 1


def test_hermes_stats_and_purge_on_a_redis_url(redis_url, client, namespace, capsys):
    url = f"{redis_url}?prefix={namespace}:&delivery=at-least-once"
    emitter_queue = f"{namespace}:hermes"
    client.sadd(emitter_queue, b"one", b"two")
    assert main(["stats", "--url", url, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["queues"]
    assert row == {
        "priority": 100,
        "name": emitter_queue,
        "ready": 2,
        "scheduled": 0,
        "in_flight": 0,
        "set_aside": 0,
    }
    assert main(["stats", "--url", url.replace("&delivery=at-least-once", "")]) == 0
    table = capsys.readouterr().out
    assert "?: this broker cannot say" in table  # in flight, at most once
    assert main(["purge", "--url", url, "--yes"]) == 0
    assert "Deleted 2 waiting messages" in capsys.readouterr().out
    assert client.exists(emitter_queue) == 0


def test_stats_and_purge_of_a_priority_use_the_name_the_url_gives_it(
    redis_url, client, namespace, capsys
):
    url = f"{redis_url}?prefix={namespace}:&priority_queues=php_high:{HIGH}"
    client.sadd(f"{namespace}:php_high", b"one")

    assert main(["stats", "--url", url, "--priority", str(HIGH), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["queues"]
    assert [(r["name"], r["ready"]) for r in rows if r["priority"] == HIGH] == [
        (f"{namespace}:php_high", 1)
    ]
    assert main(["purge", "--url", url, "--priority", str(HIGH), "--yes"]) == 0
    assert "Deleted 1 waiting message from priority 200" in capsys.readouterr().out
    assert client.exists(f"{namespace}:php_high") == 0


def test_a_priority_the_cli_names_gets_the_prefix_once(client, namespace, redis_url, capsys):
    # What a worker on the same prefix given --priority 200 reads: the CLI's name for it.
    emitter = RedisSetDriver(client, prefix=f"{namespace}:")
    emitter.setup_priority_queue("hermes_priority_200", 200)
    emitter.send(Message("job"), 200)

    assert main(["stats", "--url", f"{redis_url}?prefix={namespace}:", "--priority", "200",
                 "--json"]) == 0  # fmt: skip

    document = json.loads(capsys.readouterr().out.splitlines()[-1])
    high = document["queues"][0]
    assert (high["name"], high["ready"]) == (f"{namespace}:hermes_priority_200", 1)


# Queues this process was not told about ------------------------------------------------


@pytest.fixture
def unnamed_high(client, namespace, redis_url):
    """A message on ``<ns>:hermes_priority_200``, a queue the CLI names and nobody told stats."""
    emitter = RedisSetDriver(client, prefix=f"{namespace}:")
    emitter.setup_priority_queue("hermes_priority_200", 200)
    emitter.send(Message("job"), 200)
    emitter.send_batch([Message("d", {"i": i}) for i in range(2)])
    return f"{redis_url}?prefix={namespace}:"


def test_stats_shows_a_priority_set_it_was_not_told_about(unnamed_high, namespace, capsys):
    assert main(["stats", "--url", unnamed_high, "--json"]) == 0

    queues = json.loads(capsys.readouterr().out)["queues"]
    assert [(q["priority"], q["name"], q["ready"]) for q in queues] == [
        (200, f"{namespace}:hermes_priority_200", 1),
        (100, f"{namespace}:hermes", 2),
    ]


def test_purge_of_every_queue_deletes_a_set_it_was_not_told_about_and_names_each(
    unnamed_high, client, namespace, capsys
):
    assert main(["purge", "--url", unnamed_high, "--yes"]) == 0

    out = capsys.readouterr().out
    assert "Deleted 3 waiting messages" in out
    assert f"{namespace}:hermes_priority_200" in out and f"{namespace}:hermes (100)" in out
    assert client.scard(f"{namespace}:hermes_priority_200") == 0
