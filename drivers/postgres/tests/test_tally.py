"""Tallies in PostgreSQL: members counted once each, concurrent adds, expiry, queues, teardown."""

from __future__ import annotations

from typing import TypeVar

import pytest
from hermes_test_support import concurrently, eventually

from hermes.core.driver import SupportsTally

T = TypeVar("T")


def test_the_driver_keeps_tallies(driver):
    assert isinstance(driver, SupportsTally)


def test_a_member_added_twice_is_counted_once_and_keeps_its_first_value(driver):
    assert driver.tally_add("group", "a", b"first", 60) == (True, 1)
    assert driver.tally_add("group", "a", b"second", 60) == (False, 1)
    assert driver.tally_add("group", "b", b"other", 60) == (True, 2)
    assert driver.tally_add("group", "a", b"third", 60) == (False, 2)
    assert driver.tally_read("group") == {"a": b"first", "b": b"other"}


def test_concurrent_adds_count_every_member_once_and_the_last_sees_them_all(make_driver):
    threads_count, per_thread = 8, 50
    drivers = [make_driver() for _ in range(threads_count)]  # a pool each, as processes
    total = threads_count * per_thread

    def add_all(index: int) -> list[tuple[bool, int]]:
        driver = drivers[index]
        return [
            driver.tally_add("many", f"m-{index}-{j}", f"{index}:{j}".encode(), 60)
            for j in range(per_thread)
        ]

    answers = [answer for answers in concurrently(threads_count, add_all)[0] for answer in answers]

    assert sum(added for added, _ in answers) == total
    assert any(count == total for _, count in answers)
    # The adds took turns on the head row: each saw one more than the one before.
    assert sorted(count for _, count in answers) == list(range(1, total + 1))
    members = drivers[0].tally_read("many")
    assert len(members) == total
    assert members["m-3-7"] == b"3:7"
    assert drivers[0].tally_add("many", "m-0-0", b"again", 60) == (False, total)


def test_one_member_added_by_eight_threads_at_once_is_added_by_one(make_driver):
    drivers = [make_driver() for _ in range(8)]
    for round_ in range(5):
        key = f"same-{round_}"
        answers = concurrently(
            8, lambda i, key=key: drivers[i].tally_add(key, "only", f"{i}".encode(), 60)
        )[0]
        assert sorted(answers) == [(False, 1)] * 7 + [(True, 1)], answers
        value = drivers[0].tally_read(key)["only"]
        assert value in {f"{i}".encode() for i in range(8)}


def test_a_read_returns_every_member_with_its_value(driver):
    assert driver.tally_read("unknown") == {}
    values = {f"member-{i}": bytes([i, 0, 255]) for i in range(20)}
    for member, value in values.items():
        driver.tally_add("read", member, value, 60)
    assert driver.tally_read("read") == values
    assert driver.tally_read("unknown") == {}


def test_a_set_is_gone_once_its_ttl_passed_and_the_next_add_starts_a_new_one(driver):
    assert driver.tally_add("brief", "a", b"old-a", 1) == (True, 1)
    assert driver.tally_add("brief", "b", b"old-b", 1) == (True, 2)

    eventually(lambda: driver.tally_read("brief") == {}, "the set expired", interval_s=0.05)

    assert driver.tally_add("brief", "a", b"new-a", 60) == (True, 1)
    assert driver.tally_read("brief") == {"a": b"new-a"}


def test_an_add_keeps_the_set_for_its_ttl_again(driver, sql, table):
    driver.tally_add("kept", "a", b"a", 1)
    driver.tally_add("kept", "a", b"a", 60)  # not added, yet the set is kept from now
    kept_s = sql.execute(
        f"SELECT extract(epoch FROM expires_at - now())::float8 FROM {table}_tally_heads"
    ).fetchone()[0]
    assert 60 - 5 <= kept_s <= 60 + 1


def test_an_expired_set_is_replaced_whole(driver, sql, table):
    for member in ("a", "b", "c"):
        driver.tally_add("stale", member, member.encode(), 60)
    sql.execute(f"UPDATE {table}_tally_heads SET expires_at = now() - interval '1 s'")
    assert driver.tally_read("stale") == {}

    assert driver.tally_add("stale", "b", b"new-b", 60) == (True, 1)
    assert driver.tally_read("stale") == {"b": b"new-b"}
    members = sql.execute(f"SELECT member FROM {table}_tally").fetchall()
    assert members == [("b",)]


def test_expired_sets_are_deleted_by_a_later_add(driver, sql, table):
    driver.tally_add("old", "a", b"a", 60)
    driver.tally_add("old", "b", b"b", 60)
    sql.execute(f"UPDATE {table}_tally_heads SET expires_at = now() - interval '1 s'")
    driver._tally._next_sweep = 0.0
    driver.tally_add("new", "a", b"a", 60)
    assert sql.execute(f"SELECT key FROM {table}_tally_heads").fetchall() == [("new",)]
    assert sql.execute(f"SELECT key, member FROM {table}_tally").fetchall() == [("new", "a")]


def test_a_ttl_must_be_positive(driver):
    with pytest.raises(ValueError, match="ttl_s"):
        driver.tally_add("group", "a", b"v", 0)
    with pytest.raises(ValueError, match="ttl_s"):
        driver.tally_add("group", "a", b"v", -1)


def test_tallies_of_another_queue_in_the_same_table_are_their_own(make_driver):
    a, b = make_driver(queue="a"), make_driver(queue="b")
    assert a.tally_add("shared", "x", b"from-a", 60) == (True, 1)
    assert b.tally_add("shared", "x", b"from-b", 60) == (True, 1)
    assert b.tally_add("shared", "y", b"from-b", 60) == (True, 2)
    assert a.tally_read("shared") == {"x": b"from-a"}
    assert b.tally_read("shared") == {"x": b"from-b", "y": b"from-b"}


def test_the_tables_are_made_on_first_use_beside_existing_tables(make_driver, sql, table):
    first = make_driver()
    first.ensure_tables()
    for name in (f"{table}_tally", f"{table}_tally_heads"):
        assert sql.execute("SELECT to_regclass(%s)", [name]).fetchone() == (None,)

    second = make_driver()  # a driver of an existing deployment, made anew
    assert second.tally_add("k", "a", b"a", 60) == (True, 1)
    for name in (f"{table}_tally", f"{table}_tally_heads"):
        assert sql.execute("SELECT to_regclass(%s)::text", [name]).fetchone() == (name,)


def test_teardown_drops_the_tally_tables(driver, sql, table):
    driver.tally_add("k", "a", b"a", 60)
    driver.teardown()
    for name in (f"{table}_tally", f"{table}_tally_heads"):
        assert sql.execute("SELECT to_regclass(%s)", [name]).fetchone() == (None,)
    assert driver.tally_read("k") == {}  # made again on the next use
    assert driver.tally_add("k", "a", b"a", 60) == (True, 1)


def test_a_failed_add_leaves_the_connection_usable(driver, sql, table):
    driver.tally_add("k", "a", b"a", 60)
    sql.execute(f"ALTER TABLE {table}_tally ADD CONSTRAINT small CHECK (length(value) < 4)")
    for _ in range(3):  # more than once: the pooled connection is used again
        with pytest.raises(Exception, match="small"):
            driver.tally_add("k", "b", b"too long", 60)
    assert driver.tally_add("k", "b", b"b", 60) == (True, 2)
    assert driver.tally_read("k") == {"a": b"a", "b": b"b"}
