"""Wrong credentials slow down the client that sent them, and only that client.

The throttle is given a clock and a sleep of its own here: what it waits is
read from the sleeps it asked for, not from a wall clock.
"""

from __future__ import annotations

import asyncio

from hermes.dashboard._guard import Throttle


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def throttle_with(fake: FakeTime) -> Throttle:
    return Throttle(first_delay_s=0.25, max_delay_s=4.0, clock=fake.clock, sleep=fake.sleep)


def test_each_wrong_try_makes_that_client_s_next_try_wait_longer_up_to_a_bound() -> None:
    fake = FakeTime()
    throttle = throttle_with(fake)

    async def tries() -> None:
        for _ in range(8):
            assert not await throttle.attempt("10.0.0.9", lambda: False)

    asyncio.run(tries())
    assert fake.slept == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert sum(fake.slept) / 8 > 1 / 4, "more than four wrong tries a second"


def test_a_wrong_try_does_not_slow_another_client() -> None:
    fake = FakeTime()
    throttle = throttle_with(fake)

    async def tries() -> None:
        for _ in range(3):
            await throttle.attempt("10.0.0.9", lambda: False)
        fake.slept.clear()
        assert await throttle.attempt("10.0.0.10", lambda: True)

    asyncio.run(tries())
    assert fake.slept == []


def test_the_right_credentials_end_the_slowdown() -> None:
    fake = FakeTime()
    throttle = throttle_with(fake)

    async def tries() -> None:
        await throttle.attempt("10.0.0.9", lambda: False)
        await throttle.attempt("10.0.0.9", lambda: False)
        assert await throttle.attempt("10.0.0.9", lambda: True)
        fake.slept.clear()
        assert await throttle.attempt("10.0.0.9", lambda: True)

    asyncio.run(tries())
    assert fake.slept == []


def test_tries_sent_at_once_wait_their_turn() -> None:
    fake = FakeTime()
    throttle = throttle_with(fake)

    async def tries() -> list[bool]:
        await throttle.attempt("10.0.0.9", lambda: False)
        at_once = [throttle.attempt("10.0.0.9", lambda: False) for _ in range(4)]
        return await asyncio.gather(*at_once)

    assert asyncio.run(tries()) == [False] * 4
    assert fake.slept == [0.25, 0.5, 1.0, 2.0], "parallel tries were not serialized"


def test_the_throttle_forgets_clients_beyond_its_bound() -> None:
    fake = FakeTime()
    throttle = Throttle(clock=fake.clock, sleep=fake.sleep, max_clients=10)

    async def tries() -> None:
        for n in range(100):
            await throttle.attempt(f"10.0.{n}.1", lambda: False)

    asyncio.run(tries())
    assert len(throttle) <= 10
