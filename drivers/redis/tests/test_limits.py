"""Fleet-wide limits on Redis: the script's decisions are core's, on the server's clock."""

from __future__ import annotations

import itertools
import json
import math
import random
import time
from typing import Any

import pytest
import redis
from hermes_test_support import concurrently, eventually

from hermes.core import BrokerUnavailableError, connect
from hermes.core.driver import Delivery, LimitRule, SupportsLimits, Take
from hermes.core.drivertools import limit_state
from hermes.core.spi._door import translate_errors
from hermes.drivers.redis import RedisSetDriver, _limits


def stored(client: redis.Redis[Any], driver: RedisSetDriver, key: str) -> bytes | None:
    value: bytes | None = client.get(_limits.state_key(driver.key, key))
    return value


def test_the_state_sits_beside_the_queue_key_under_the_prefix(
    client: redis.Redis[Any], namespace: str
) -> None:
    assert _limits.state_key("app:hermes", "charge:c-7") == "app:hermes_limit:charge:c-7"
    assert _limits.index_key("app:hermes") == "app:hermes_limits"
    driver = RedisSetDriver(client, prefix=f"{namespace}:")
    assert isinstance(driver, SupportsLimits)

    assert driver.limit_take("charge:c-7", LimitRule(concurrency=2), "s1", False, 30) == Take(
        0.0, False
    )

    raw = client.get(f"{namespace}:hermes_limit:charge:c-7")
    assert raw is not None
    assert list(limit_state.decode(raw)["slots"]) == ["s1"]
    assert client.zrange(f"{namespace}:hermes_limits", 0, -1) == [b"charge:c-7"]
    assert driver.limit_scan(10) == [("charge:c-7", raw)]


def test_both_delivery_modes_keep_limits(client: redis.Redis[Any], namespace: str) -> None:
    for delivery in Delivery.AT_MOST_ONCE, Delivery.AT_LEAST_ONCE:
        driver = RedisSetDriver(
            client,
            key=f"{namespace}-{delivery.name}",
            schedule_key=f"{namespace}-s",
            delivery=delivery,
        )
        assert isinstance(driver, SupportsLimits)
        assert driver.limit_take("k", LimitRule(concurrency=1), "a", False, 30).wait_s == 0
        assert driver.limit_take("k", LimitRule(concurrency=1), "b", False, 30).wait_s > 0


def test_every_step_equals_the_python_steps_at_the_scripts_own_now(
    driver: RedisSetDriver, client: redis.Redis[Any]
) -> None:
    """A random run of takes, releases and renewals; each answer and state is core's exactly."""
    rules = [
        LimitRule(interval_s=0.02, burst=2, concurrency=3),
        LimitRule(concurrency=2),
        LimitRule(interval_s=0.01),
        LimitRule(interval_s=0.6, burst=3),
        LimitRule(interval_s=0.05, reserve=4),
        LimitRule(interval_s=0.02, burst=2, reserve=3),
        LimitRule(interval_s=0.02, burst=2, concurrency=2, reserve=3),
        LimitRule(interval_s=0.03, concurrency=1),
    ]
    slots = [f"slot-{n}" for n in range(6)]
    chooser = random.Random(20240611)
    key = "charge:customer-7"
    state_key = _limits.state_key(driver.key, key)
    counted = dict.fromkeys(["take", "release", "renew", "held", "waited", "kept"], 0)
    for _ in range(300):
        before = stored(client, driver, key)
        slot = chooser.choice(slots)
        lease_s = chooser.choice([0.03, 0.2, 5.0])
        op = chooser.choices(["take", "release", "renew"], [6, 2, 2])[0]
        counted[op] += 1
        if op == "take":
            rule = chooser.choice(rules)
            charged = chooser.random() < 0.2
            answer, now = _limits.take(
                driver._execute_once, driver.key, key, rule, slot, charged, lease_s
            )
            expected = limit_state.decode(before)
            assert answer == limit_state.take(expected, rule, slot, charged, lease_s, now)
            counted["held"] += answer.wait_s == 0 and rule.concurrency is not None
            counted["waited"] += answer.wait_s > 0
        elif op == "release":
            now = _limits.release(driver._execute, driver.key, key, slot)
            expected = limit_state.decode(before)
            if before is not None:
                limit_state.release(expected, slot, now)
        else:
            kept, now = _limits.renew(driver._execute, driver.key, key, slot, lease_s)
            expected = limit_state.decode(before)
            assert kept == (before is not None and limit_state.renew(expected, slot, lease_s, now))
            counted["kept"] += kept
        after = stored(client, driver, key)
        if before is None and op != "take":
            assert after is None
            continue
        assert after is not None
        assert limit_state.decode(after) == expected, (op, before, after)
        if op == "take" or before != after:  # written: kept and indexed from this now
            keep_ms = (limit_state.keep_for(expected, now) + _limits.GRACE_S) * 1000
            assert keep_ms - 5000 < client.pttl(state_key) <= keep_ms
            leases = [held[0] for held in expected["slots"].values()]
            last = max(expected["tat"], expected["ctat"], *leases)
            score = client.zscore(_limits.index_key(driver.key), key)
            assert score == (last if last > now else None)
        if chooser.random() < 0.3:
            time.sleep(chooser.random() * 0.05)
    # The run went through each branch, not only the easy ones.
    assert min(counted.values()) >= 3, counted


def test_ten_takes_at_once_get_one_start_and_turns_half_a_second_apart(
    driver: RedisSetDriver,
) -> None:
    rule = LimitRule(interval_s=0.5, burst=1)

    def take(i: int) -> tuple[Take, float]:
        return _limits.take(driver._execute_once, driver.key, "mail", rule, f"s{i}", False, 30)

    answers = concurrently(10, take)[0]

    assert all(answer.charged for answer, _ in answers), "every take is charged"
    assert sum(answer.wait_s == 0 for answer, _ in answers) == 1
    turns = sorted(now + answer.wait_s for answer, now in answers)
    gaps = [later - earlier for earlier, later in itertools.pairwise(turns)]
    assert all(gap == pytest.approx(0.5, abs=1e-6) for gap in gaps), gaps


def test_three_of_sixteen_threads_hold_a_slot_of_three(
    driver: RedisSetDriver, client: redis.Redis[Any]
) -> None:
    rule = LimitRule(concurrency=3)

    answers, _ = concurrently(
        16, lambda i: driver.limit_take("import", rule, f"slot-{i}", False, 30)
    )

    started = [i for i, answer in enumerate(answers) if answer.wait_s == 0]
    assert len(started) == 3
    assert all(answer.wait_s >= limit_state.MIN_WAIT_S for answer in answers if answer.wait_s)
    assert not any(answer.charged for answer in answers), "no rate: nothing is charged"
    raw = stored(client, driver, "import")
    assert raw is not None
    assert sorted(limit_state.decode(raw)["slots"]) == sorted(f"slot-{i}" for i in started)


def test_a_release_frees_one_slot(driver: RedisSetDriver) -> None:
    rule = LimitRule(concurrency=2)
    assert driver.limit_take("k", rule, "a", False, 30).wait_s == 0
    assert driver.limit_take("k", rule, "b", False, 30).wait_s == 0
    assert driver.limit_take("k", rule, "c", False, 30).wait_s > 0

    driver.limit_release("k", "a")
    driver.limit_release("k", "a")  # a second release does nothing
    driver.limit_release("unknown", "a")

    assert driver.limit_take("k", rule, "c", False, 30).wait_s == 0
    assert driver.limit_take("k", rule, "d", False, 30).wait_s > 0


def test_a_lease_not_renewed_frees_its_slot_after_it(driver: RedisSetDriver) -> None:
    rule = LimitRule(concurrency=1)
    started = time.monotonic()
    assert driver.limit_take("k", rule, "dead-worker", False, 1.0).wait_s == 0
    assert driver.limit_take("k", rule, "other", False, 30).wait_s > 0

    eventually(
        lambda: driver.limit_take("k", rule, "other", False, 30).wait_s == 0,
        "the unrenewed slot to be free",
    )
    assert time.monotonic() - started >= 0.9, "the slot was free before its lease ended"
    assert not driver.limit_renew("k", "dead-worker", 1.0), "a run-out slot was renewed"


def test_a_renewed_lease_keeps_its_slot(driver: RedisSetDriver) -> None:
    rule = LimitRule(concurrency=1)
    assert driver.limit_take("k", rule, "alive", False, 1.0).wait_s == 0
    until = time.monotonic() + 2.5
    while time.monotonic() < until:
        assert driver.limit_renew("k", "alive", 1.0)
        assert driver.limit_take("k", rule, "other", False, 30).wait_s > 0
        time.sleep(0.2)

    assert not driver.limit_renew("k", "never-taken", 1.0)
    assert not driver.limit_renew("unknown-key", "alive", 1.0)
    driver.limit_release("k", "alive")
    assert not driver.limit_renew("k", "alive", 1.0)
    assert driver.limit_take("k", rule, "other", False, 30).wait_s == 0


def test_a_job_charged_already_is_not_charged_again(
    driver: RedisSetDriver, client: redis.Redis[Any]
) -> None:
    rule = LimitRule(interval_s=0.5)
    assert driver.limit_take("k", rule, "a", False, 30) == Take(0.0, True)
    reserved = driver.limit_take("k", rule, "b", False, 30)
    assert reserved.charged and 0.3 < reserved.wait_s <= 0.5
    raw = stored(client, driver, "k")
    assert raw is not None
    tat = limit_state.decode(raw)["tat"]

    assert driver.limit_take("k", rule, "b", True, 30) == Take(0.0, True)

    raw = stored(client, driver, "k")
    assert raw is not None
    assert limit_state.decode(raw)["tat"] == tat, "the rate was charged twice"


def test_an_empty_slot_map_round_trips_as_an_object(
    driver: RedisSetDriver, client: redis.Redis[Any]
) -> None:
    assert driver.limit_take("rate-only", LimitRule(interval_s=1.0), "a", False, 30).wait_s == 0
    rule = LimitRule(interval_s=0.01, concurrency=1)
    assert driver.limit_take("k", rule, "a", False, 30).wait_s == 0
    driver.limit_release("k", "a")

    for key in "rate-only", "k":
        raw = stored(client, driver, key)
        assert raw is not None
        assert b'"slots":{}' in raw
        assert json.loads(raw)["slots"] == {}
    # Read back by the script (cjson turns {} into an empty table) and written again.
    assert driver.limit_take("k", rule, "b", False, 30).wait_s >= 0
    driver.limit_release("k", "b")
    raw = stored(client, driver, "k")
    assert raw is not None
    state = limit_state.decode(raw)
    assert state["slots"] == {} and isinstance(state["slots"], dict)
    limit_state.take(state, rule, "c", True, 30, time.time())  # core reads it as it wrote it


def test_scan_lists_a_key_while_its_state_holds_or_promises_something(
    driver: RedisSetDriver, client: redis.Redis[Any]
) -> None:
    assert driver.limit_scan(10) == []
    rule = LimitRule(concurrency=2)
    assert driver.limit_take("charge:customer-7", rule, "a", False, 30).wait_s == 0

    raw = stored(client, driver, "charge:customer-7")
    assert driver.limit_scan(10) == [("charge:customer-7", raw)]
    assert raw is not None
    usage = limit_state.usage("charge:customer-7", limit_state.decode(raw), time.time())
    assert usage.running == 1

    driver.limit_release("charge:customer-7", "a")
    assert driver.limit_scan(10) == [], "listed with nothing held or promised"
    assert stored(client, driver, "charge:customer-7") is not None, "forgotten at once"

    # A slot whose lease runs out, and a turn the rate promised, stop being listed after.
    assert driver.limit_take("lease", rule, "a", False, 1.0).wait_s == 0
    assert driver.limit_take("rate", LimitRule(interval_s=0.5), "a", False, 30).wait_s == 0
    assert driver.limit_take("rate", LimitRule(interval_s=0.5), "b", False, 30).wait_s > 0
    assert sorted(key for key, _ in driver.limit_scan(10)) == ["lease", "rate"]
    eventually(lambda: driver.limit_scan(10) == [], "the run-out states to leave the scan")
    pttl = client.pttl(_limits.state_key(driver.key, "lease"))
    assert 0 < pttl <= (_limits.GRACE_S + 1) * 1000, "the state is kept a while after"


def test_scan_returns_at_most_the_limit(driver: RedisSetDriver) -> None:
    for n in range(5):
        driver.limit_take(f"k{n}", LimitRule(concurrency=1), "a", False, 30)

    assert len(driver.limit_scan(2)) == 2
    assert driver.limit_scan(0) == []
    assert sorted(key for key, _ in driver.limit_scan(100)) == [f"k{n}" for n in range(5)]


def test_writes_drop_index_members_whose_time_ran_out(
    driver: RedisSetDriver, client: redis.Redis[Any]
) -> None:
    index = _limits.index_key(driver.key)
    for n in range(3):
        driver.limit_take(f"brief{n}", LimitRule(concurrency=1), "a", False, 1.0)
    assert client.zcard(index) == 3

    def trimmed() -> bool:
        driver.limit_take("other", LimitRule(concurrency=1), "a", False, 30)
        return client.zrange(index, 0, -1) == [b"other"]

    eventually(trimmed, "a write to drop the run-out members", interval_s=0.1)


def test_teardown_deletes_the_limit_keys(driver: RedisSetDriver, client: redis.Redis[Any]) -> None:
    driver.limit_take("k", LimitRule(concurrency=1), "a", False, 30)
    driver.limit_take("gone", LimitRule(concurrency=1), "a", False, 30)
    driver.limit_release("gone", "a")  # no longer indexed, still kept

    driver.teardown()

    assert stored(client, driver, "k") is None
    assert stored(client, driver, "gone") is None
    assert not client.exists(_limits.index_key(driver.key))


def test_a_rule_the_state_cannot_hold_is_refused(driver: RedisSetDriver) -> None:
    for rule, lease_s in (
        (LimitRule(concurrency=0), 30.0),
        (LimitRule(interval_s=math.nan), 30.0),
        (LimitRule(interval_s=-1.0), 30.0),
        (LimitRule(concurrency=1), math.inf),
    ):
        with pytest.raises(ValueError):
            driver.limit_take("k", rule, "a", False, lease_s)
    with pytest.raises(ValueError):
        driver.limit_renew("k", "a", 0)
    assert driver.limit_scan(10) == []


def test_an_unreachable_server_raises_as_unavailable() -> None:
    import hermes_test_services

    driver = connect(f"redis://127.0.0.1:{hermes_test_services.free_port()}/0")
    assert isinstance(driver, RedisSetDriver)
    calls = (
        lambda: driver.limit_take("k", LimitRule(concurrency=1), "a", False, 30),
        lambda: driver.limit_release("k", "a"),
        lambda: driver.limit_renew("k", "a", 30),
        lambda: driver.limit_scan(10),
    )
    for call in calls:
        with (
            pytest.raises(BrokerUnavailableError) as info,
            translate_errors(driver, "using a limit"),
        ):
            call()
        assert isinstance(info.value.__cause__, redis.ConnectionError)
    driver.close()
