"""Fleet-wide limits in PostgreSQL: rate turns, slots, leases, renewals, scans and the sweep."""

from __future__ import annotations

import itertools
import time
import uuid

from hermes_test_support import concurrently, eventually

from hermes.core.driver import LimitRule, SupportsLimits, Take
from hermes.core.drivertools import limit_state
from hermes.drivers.postgres import PostgresDriver


def _state(driver: PostgresDriver, key: str) -> limit_state.State | None:
    states = dict(driver.limit_scan(1000))
    return None if key not in states else limit_state.decode(states[key])


def _slot() -> str:
    return uuid.uuid4().hex


def test_the_driver_keeps_limits(driver):
    assert isinstance(driver, SupportsLimits)


def test_ten_concurrent_takes_get_one_start_and_turns_half_a_second_apart(make_driver):
    drivers = [make_driver(), make_driver()]  # two pools, as two processes
    rule = LimitRule(interval_s=0.5, burst=1)

    answers, took = concurrently(
        10, lambda i: drivers[i % 2].limit_take("rate", rule, _slot(), False, 30)
    )

    waits = sorted(answer.wait_s for answer in answers)
    assert all(answer.charged for answer in answers)
    assert waits[0] == 0
    assert all(wait > 0 for wait in waits[1:]), waits
    # The k-th turn is k intervals after the first start; each wait is that
    # turn seen from when its take was decided, at most ``took`` later.
    for k, wait in enumerate(waits):
        assert 0.5 * k - took - 0.01 <= wait <= 0.5 * k + 0.01, (k, waits, took)
    for earlier, later in itertools.pairwise(waits[1:]):
        assert 0.5 - took - 0.01 <= later - earlier <= 0.5 + took + 0.01, (waits, took)


def test_three_slots_among_sixteen_threads_go_to_exactly_three(make_driver):
    drivers = [make_driver(), make_driver()]
    rule = LimitRule(concurrency=3)

    answers, _ = concurrently(
        16, lambda i: drivers[i % 2].limit_take("slots", rule, f"slot-{i}", False, 30)
    )

    started = [answer for answer in answers if answer.wait_s == 0]
    assert len(started) == 3
    assert all(answer.wait_s >= limit_state.MIN_WAIT_S for answer in answers if answer.wait_s)
    state = _state(drivers[0], "slots")
    assert state is not None and len(state["slots"]) == 3


def test_a_release_frees_one_slot(driver):
    rule = LimitRule(concurrency=2)
    held = [_slot(), _slot()]
    for slot in held:
        assert driver.limit_take("release", rule, slot, False, 30).wait_s == 0
    assert driver.limit_take("release", rule, _slot(), False, 30).wait_s > 0

    driver.limit_release("release", held[0])
    driver.limit_release("release", held[0])  # again: nothing happens
    driver.limit_release("release", "never-held")
    driver.limit_release("no-such-key", "never-held")

    assert driver.limit_take("release", rule, _slot(), False, 30).wait_s == 0
    assert driver.limit_take("release", rule, _slot(), False, 30).wait_s > 0


def test_a_slot_whose_lease_is_not_renewed_is_free_after_it(driver):
    rule = LimitRule(concurrency=1)
    assert driver.limit_take("lease", rule, "dies", False, 1.0).wait_s == 0
    assert driver.limit_take("lease", rule, _slot(), False, 30).wait_s > 0

    eventually(
        lambda: driver.limit_take("lease", rule, _slot(), False, 30).wait_s == 0,
        "the slot whose lease ran out to be free",
        interval_s=0.05,
    )
    assert driver.limit_renew("lease", "dies", 30) is False


def test_a_renewal_keeps_the_slot_and_fails_for_an_unknown_one(driver):
    rule = LimitRule(concurrency=1)
    assert driver.limit_take("renew", rule, "kept", False, 1.0).wait_s == 0

    until = time.monotonic() + 2.5  # more than twice the lease
    while time.monotonic() < until:
        assert driver.limit_renew("renew", "kept", 1.0) is True
        assert driver.limit_take("renew", rule, _slot(), False, 30).wait_s > 0
        time.sleep(0.2)

    assert driver.limit_renew("renew", "unknown", 1.0) is False
    assert driver.limit_renew("no-such-key", "kept", 1.0) is False
    driver.limit_release("renew", "kept")
    assert driver.limit_renew("renew", "kept", 1.0) is False


def test_a_job_already_charged_is_not_charged_again(driver):
    rule = LimitRule(interval_s=30.0, burst=1, concurrency=5)
    assert driver.limit_take("charge", rule, _slot(), False, 30) == Take(0.0, True)
    deferred = driver.limit_take("charge", rule, _slot(), False, 30)
    assert deferred.charged is True and deferred.wait_s > 20
    before = _state(driver, "charge")
    assert before is not None

    # The deferred job, back at its turn: it runs and holds a slot, uncharged.
    slot = _slot()
    assert driver.limit_take("charge", rule, slot, True, 30) == Take(0.0, True)

    after = _state(driver, "charge")
    assert after is not None
    assert after["tat"] == before["tat"]
    assert slot in after["slots"]


def test_a_scan_lists_a_key_while_its_state_says_something(driver):
    assert driver.limit_scan(10) == []
    slots = LimitRule(concurrency=2)
    driver.limit_take("held", slots, "a", False, 30)
    driver.limit_take("rate", LimitRule(interval_s=0.5), _slot(), False, 30)

    listed = dict(driver.limit_scan(10))
    assert set(listed) == {"held", "rate"}
    assert list(limit_state.decode(listed["held"])["slots"]) == ["a"]
    assert listed["held"] == limit_state.encode(limit_state.decode(listed["held"]))
    assert len(driver.limit_scan(1)) == 1
    assert driver.limit_scan(0) == []

    driver.limit_release("held", "a")
    assert "held" not in dict(driver.limit_scan(10))
    eventually(
        lambda: driver.limit_scan(10) == [],
        "the rate key to stop being listed once its turn passed",
        interval_s=0.05,
    )


def test_each_row_is_kept_a_minute_past_what_its_state_says(driver, sql, table):
    driver.limit_take("kept", LimitRule(concurrency=1), "a", False, 30)
    kept_s, state = sql.execute(
        f"SELECT extract(epoch FROM expires_at - now())::float8, state FROM {table}_limits"
    ).fetchone()
    assert 30 + 60 - 5 <= kept_s <= 30 + 60 + 1
    assert list(limit_state.decode(state)["slots"]) == ["a"]


def test_expired_rows_are_deleted_by_a_later_scan(driver, sql, table):
    driver.limit_take("old", LimitRule(concurrency=1), "a", False, 30)
    driver.limit_take("new", LimitRule(concurrency=1), "a", False, 30)
    sql.execute(f"UPDATE {table}_limits SET expires_at = now() - interval '1 s' WHERE key = 'old'")
    assert [key for key, _ in driver.limit_scan(10)] == ["new"]  # an expired row is not listed

    driver._limits._next_sweep = 0.0
    driver.limit_scan(10)
    keys = sql.execute(f"SELECT key FROM {table}_limits").fetchall()
    assert keys == [("new",)]


def test_a_take_on_an_expired_row_starts_from_its_state(driver, sql, table):
    rule = LimitRule(concurrency=1)
    driver.limit_take("stale", rule, "a", False, 30)
    sql.execute(f"UPDATE {table}_limits SET expires_at = now() - interval '1 s'")
    assert driver.limit_take("stale", rule, "b", False, 30).wait_s > 0  # "a" still holds it


def test_limits_of_another_queue_in_the_same_table_are_its_own(make_driver):
    a, b = make_driver(queue="a"), make_driver(queue="b")
    rule = LimitRule(concurrency=1)
    assert a.limit_take("shared", rule, "x", False, 30).wait_s == 0
    assert b.limit_take("shared", rule, "y", False, 30).wait_s == 0
    assert a.limit_take("shared", rule, "z", False, 30).wait_s > 0
    assert [key for key, _ in b.limit_scan(10)] == ["shared"]
    assert list(limit_state.decode(dict(b.limit_scan(10))["shared"])["slots"]) == ["y"]


def test_the_table_is_made_on_first_use_beside_existing_tables(make_driver, sql, table):
    first = make_driver()
    first.ensure_tables()
    assert sql.execute("SELECT to_regclass(%s)", [f"{table}_limits"]).fetchone() == (None,)

    second = make_driver()  # a driver of an existing deployment, made anew
    assert second.limit_take("k", LimitRule(concurrency=1), "a", False, 30).wait_s == 0
    found = sql.execute("SELECT to_regclass(%s)::text", [f"{table}_limits"]).fetchone()
    assert found == (f"{table}_limits",)


def test_teardown_drops_the_limits_table(driver, sql, table):
    driver.limit_take("k", LimitRule(concurrency=1), "a", False, 30)
    driver.teardown()
    found = sql.execute("SELECT to_regclass(%s)", [f"{table}_limits"]).fetchone()
    assert found == (None,)
    assert driver.limit_take("k", LimitRule(concurrency=1), "b", False, 30).wait_s == 0


def test_a_failed_decision_leaves_the_connection_usable(driver, sql, table):
    rule = LimitRule(concurrency=1)
    driver.limit_take("k", rule, "a", False, 30)
    sql.execute(f"UPDATE {table}_limits SET state = 'not json'")
    for _ in range(3):  # more than once: the pooled connection is used again
        try:
            driver.limit_take("k", rule, "b", False, 30)
        except ValueError:
            pass
        else:
            raise AssertionError("a state that is not JSON was taken for one")
    sql.execute(f"DELETE FROM {table}_limits")
    assert driver.limit_take("k", rule, "c", False, 30).wait_s == 0
