"""The file-name scheme: names sort into dequeue order and are never reused."""

from __future__ import annotations

import time

from hermes.drivers.filesystem._names import next_name, parse


def test_a_name_carries_priority_due_time_and_sequence():
    before = time.time_ns()
    parsed = parse(next_name(250))
    assert parsed is not None
    assert parsed.priority == 250
    assert parsed.available_ns >= before
    assert parsed.name.endswith(".json")


def test_names_of_one_priority_sort_in_send_order():
    names = [parse(next_name(100)) for _ in range(1000)]
    assert sorted(names) == names


def test_a_future_execute_at_becomes_the_due_time():
    execute_at = time.time() + 60
    parsed = parse(next_name(100, execute_at))
    assert parsed is not None
    assert abs(parsed.available_ns - execute_at * 1e9) < 1e3


def test_a_past_execute_at_counts_as_sent_now_and_keeps_fifo():
    first = parse(next_name(100))
    overdue = parse(next_name(100, time.time() - 3600))
    assert first is not None and overdue is not None
    assert first < overdue


def test_negative_priorities_are_representable():
    parsed = parse(next_name(-5))
    assert parsed is not None and parsed.priority == -5


def test_names_are_unique():
    names = {next_name(100) for _ in range(10_000)}
    assert len(names) == 10_000


def test_names_outside_the_scheme_do_not_parse():
    for name in ["hello.txt", "100.1.1.abc.json.tmp", "x.1.1.abc.json", "100.1.1.ABC.json", ""]:
        assert parse(name) is None
