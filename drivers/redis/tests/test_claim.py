"""Claims on Redis: SET NX PX beside the queue key; one winner among threads; Redis expires it."""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

import pytest
import redis

from hermes.drivers.redis import _claim


@pytest.fixture
def client(redis_url: str) -> redis.Redis[Any]:
    return redis.Redis.from_url(redis_url)


def test_the_claim_key_sits_beside_the_queue_key_under_the_prefix() -> None:
    assert _claim.claim_key("app:hermes", "tick:a@b") == "app:hermes_claim:tick:a@b"


def test_one_of_fifty_threads_wins_and_redis_expires_the_claim(client: redis.Redis[Any]) -> None:
    name = _claim.claim_key(f"hermes-test-{secrets.token_hex(4)}", "tick:ping")
    barrier = threading.Barrier(50)
    wins: list[bool] = []

    def claim() -> None:
        barrier.wait()
        # A TTL far longer than fifty threads take to ask, however busy the machine:
        # a second winner then means two SET NX both won, never that the first expired.
        wins.append(_claim.claim(redis.Redis(connection_pool=client.connection_pool), name, 30))

    threads = [threading.Thread(target=claim) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(wins) == 1
    assert 0 < client.pttl(name) <= 30_000
    client.delete(name)

    assert _claim.claim(client, name, 0.3)
    won_again = False
    deadline = time.monotonic() + 10
    while not won_again and time.monotonic() < deadline:
        time.sleep(0.05)
        won_again = _claim.claim(client, name, 0.3)
    client.delete(name)
    assert won_again, "the claim was not won again: Redis did not expire it"
