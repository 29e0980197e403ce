"""Tallies on Redis: each member added once, atomically, counted, expired by the server."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from hermes_test_support import concurrently, eventually

from hermes.core import BrokerUnavailableError, connect
from hermes.core.driver import Delivery, SupportsTally
from hermes.core.spi._door import translate_errors
from hermes.drivers.redis import RedisSetDriver, _tally


def test_a_tally_is_a_hash_beside_the_queue_key_under_the_prefix(
    client: redis.Redis[Any], namespace: str
) -> None:
    assert _tally.tally_key("app:hermes", "workflow-members:wf-1") == (
        "app:hermes_tally:workflow-members:wf-1"
    )
    driver = RedisSetDriver(client, prefix=f"{namespace}:")
    assert isinstance(driver, SupportsTally)

    assert driver.tally_add("g", "0", b"ok", 60) == (True, 1)

    assert client.hgetall(f"{namespace}:hermes_tally:g") == {b"0": b"ok"}
    assert 0 < client.pttl(f"{namespace}:hermes_tally:g") <= 60_000


def test_both_delivery_modes_keep_tallies(client: redis.Redis[Any], namespace: str) -> None:
    for delivery in Delivery.AT_MOST_ONCE, Delivery.AT_LEAST_ONCE:
        driver = RedisSetDriver(
            client,
            key=f"{namespace}-{delivery.name}",
            schedule_key=f"{namespace}-s",
            delivery=delivery,
        )
        assert isinstance(driver, SupportsTally)
        assert driver.tally_add("g", "m", b"v", 60) == (True, 1)


def test_a_member_added_twice_is_counted_once_and_keeps_its_first_value(
    driver: RedisSetDriver,
) -> None:
    assert driver.tally_add("g", "a", b"first", 60) == (True, 1)

    assert driver.tally_add("g", "a", b"second", 60) == (False, 1)

    assert driver.tally_read("g") == {"a": b"first"}


def test_eight_threads_adding_fifty_members_each_count_every_one_once(
    driver: RedisSetDriver,
) -> None:
    def add_fifty(thread: int) -> list[tuple[bool, int]]:
        return [driver.tally_add("g", f"{thread}.{n}", b"x", 60) for n in range(50)]

    calls = [call for results in concurrently(8, add_fifty)[0] for call in results]

    assert len(calls) == 400
    assert sum(added for added, _ in calls) == 400
    assert max(count for _, count in calls) == 400, "no add saw the whole count"
    assert len(driver.tally_read("g")) == 400


def test_of_eight_threads_adding_one_member_exactly_one_adds_it(driver: RedisSetDriver) -> None:
    results, _ = concurrently(8, lambda thread: driver.tally_add("g", "same", b"%d" % thread, 60))

    assert sorted(results) == [(False, 1)] * 7 + [(True, 1)]
    winner = next(thread for thread, (added, _) in enumerate(results) if added)
    assert driver.tally_read("g") == {"same": b"%d" % winner}


def test_read_returns_every_member_with_its_value(driver: RedisSetDriver) -> None:
    values = {"0": b'{"state":"succeeded"}', "1": b"", "2": bytes(range(256)), "\u00e9": b"\xff"}
    for member, value in values.items():
        driver.tally_add("g", member, value, 60)

    assert driver.tally_read("g") == values
    assert driver.tally_read("unknown") == {}


def test_a_decoding_client_still_reads_bytes(
    client: redis.Redis[Any], namespace: str, redis_url: str
) -> None:
    decoding: redis.Redis[Any] = redis.Redis.from_url(redis_url, decode_responses=True)
    driver = RedisSetDriver(decoding, key=namespace, close_client=True)
    try:
        assert driver.tally_add("g", "a", b"\xff\x00", 60) == (True, 1)
        assert driver.tally_read("g") == {"a": b"\xff\x00"}
    finally:
        driver.close()


def test_a_tally_expires_its_ttl_after_the_last_add(
    driver: RedisSetDriver, client: redis.Redis[Any]
) -> None:
    driver.tally_add("g", "a", b"x", 1)
    driver.tally_add("g", "b", b"y", 1)
    assert client.pttl(_tally.tally_key(driver.key, "g")) <= 1000

    eventually(lambda: driver.tally_read("g") == {}, "the tally to expire", interval_s=0.05)

    assert driver.tally_add("g", "a", b"again", 1) == (True, 1), "an expired tally counted on"


def test_an_add_that_adds_nothing_still_keeps_the_tally_longer(
    driver: RedisSetDriver, client: redis.Redis[Any]
) -> None:
    name = _tally.tally_key(driver.key, "g")
    driver.tally_add("g", "a", b"x", 5)

    assert driver.tally_add("g", "a", b"x", 60) == (False, 1)

    assert client.pttl(name) > 5000


def test_namespaces_do_not_see_each_others_tallies(
    client: redis.Redis[Any], namespace: str
) -> None:
    one = RedisSetDriver(client, prefix=f"{namespace}:one:")
    two = RedisSetDriver(client, prefix=f"{namespace}:two:")

    assert one.tally_add("g", "a", b"1", 60) == (True, 1)
    assert two.tally_add("g", "a", b"2", 60) == (True, 1)
    assert two.tally_add("g", "b", b"2", 60) == (True, 2)

    assert one.tally_read("g") == {"a": b"1"}
    assert two.tally_read("g") == {"a": b"2", "b": b"2"}


def test_a_ttl_of_zero_is_refused(driver: RedisSetDriver) -> None:
    for ttl_s in 0, -1, float("nan"):
        with pytest.raises(ValueError, match="ttl_s must be > 0"):
            driver.tally_add("g", "a", b"x", ttl_s)
    assert driver.tally_read("g") == {}


def test_teardown_deletes_the_tallies(
    driver: RedisSetDriver, client: redis.Redis[Any], namespace: str
) -> None:
    driver.tally_add("g", "a", b"x", 60)
    driver.tally_add("h", "a", b"x", 60)

    driver.teardown()

    assert list(client.scan_iter(match=f"{namespace}*")) == []


def test_an_unreachable_server_raises_as_unavailable() -> None:
    import hermes_test_services

    driver = connect(f"redis://127.0.0.1:{hermes_test_services.free_port()}/0")
    assert isinstance(driver, RedisSetDriver)
    for call in lambda: driver.tally_add("g", "a", b"x", 60), lambda: driver.tally_read("g"):
        with pytest.raises(BrokerUnavailableError) as info, translate_errors(driver, "counting"):
            call()
        assert isinstance(info.value.__cause__, redis.ConnectionError)
    driver.close()
