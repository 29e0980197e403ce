"""OffsetLedger: commit points when records finish out of order, and re-reads."""

from __future__ import annotations

import threading

from hermes.drivers.kafka._offsets import OffsetLedger, PartitionState

P0 = ("jobs", 0)
P1 = ("jobs", 1)


def take(ledger: OffsetLedger, partition: tuple[str, int], *offsets: int) -> PartitionState:
    states = [ledger.take(partition, offset) for offset in offsets]
    assert all(state is not None for state in states)
    assert states[0] is not None
    return states[0]


def test_records_finished_in_order_commit_the_offset_after_the_last() -> None:
    ledger = OffsetLedger()
    state = take(ledger, P0, 5, 6, 7)
    for offset in (5, 6, 7):
        assert ledger.finish(state, offset)

    assert ledger.to_commit() == {P0: 8}
    assert ledger.finished_since_commit == 3


def test_records_finishing_out_of_order_commit_only_the_finished_prefix() -> None:
    ledger = OffsetLedger()
    state = take(ledger, P0, 0, 1, 2, 3)

    ledger.finish(state, 2)
    ledger.finish(state, 3)
    assert ledger.to_commit() == {}  # 0 still running: nothing past it
    ledger.finish(state, 0)
    assert ledger.to_commit() == {P0: 1}  # 1 still running
    ledger.finish(state, 1)
    assert ledger.to_commit() == {P0: 4}


def test_an_open_record_holds_the_commit_point_of_its_partition_only() -> None:
    ledger = OffsetLedger()
    p0 = take(ledger, P0, 10, 11, 12)  # 10 held, say a delayed message
    ledger.finish(p0, 11)
    ledger.finish(p0, 12)
    p1 = take(ledger, P1, 3)
    ledger.finish(p1, 3)

    # P0 started at 10, which is still open: nothing new to commit there.
    assert ledger.to_commit() == {P1: 4}

    ledger.finish(p0, 10)
    assert ledger.to_commit() == {P0: 13, P1: 4}


def test_a_committed_point_is_not_committed_again() -> None:
    ledger = OffsetLedger()
    state = take(ledger, P0, 0)
    ledger.finish(state, 0)
    ledger.mark_committed(ledger.to_commit(), ledger.finished_since_commit)

    assert ledger.to_commit() == {}
    assert ledger.finished_since_commit == 0


def test_a_record_finished_while_committing_still_counts_for_the_next_commit() -> None:
    ledger = OffsetLedger()
    state = take(ledger, P0, 0, 1)
    ledger.finish(state, 0)
    counted = ledger.finished_since_commit
    points = ledger.to_commit()
    ledger.finish(state, 1)  # another thread, while the commit is on its way
    ledger.mark_committed(points, counted)

    assert ledger.finished_since_commit == 1
    assert ledger.to_commit() == {P0: 2}


def test_a_record_given_back_is_handed_out_again_and_holds_the_commit_point() -> None:
    ledger = OffsetLedger()
    state = take(ledger, P0, 4, 5, 6)
    ledger.finish(state, 4)

    assert ledger.give_back(state, 5)
    assert ledger.pop_rewinds() == [(state, 5)]
    assert ledger.pop_rewinds() == []
    assert ledger.to_commit() == {P0: 5}
    # Read again from 5: 5 is handed out again, 6 (still running) is skipped.
    assert ledger.take(P0, 5) is state
    assert ledger.take(P0, 6) is None
    assert ledger.take(P0, 7) is state  # new
    for offset in (5, 6, 7):
        ledger.finish(state, offset)
    assert ledger.to_commit() == {P0: 8}


def test_a_finished_record_read_again_after_a_rewind_is_skipped() -> None:
    ledger = OffsetLedger()
    state = take(ledger, P0, 0, 1, 2)
    ledger.finish(state, 1)
    ledger.give_back(state, 0)

    assert ledger.take(P0, 0) is state
    assert ledger.take(P0, 1) is None
    assert ledger.take(P0, 2) is None  # running


def test_the_rewind_goes_to_the_oldest_record_given_back() -> None:
    ledger = OffsetLedger()
    state = take(ledger, P0, 0, 1, 2, 3)

    ledger.give_back(state, 2)
    ledger.give_back(state, 3)
    ledger.give_back(state, 1)
    # Dropped from a buffer after a rewind: read again, but no seek of its own.
    ledger.give_back(state, 0, rewind=False)

    assert ledger.pop_rewinds() == [(state, 1)]
    assert ledger.take(P0, 0) is state
    assert [ledger.take(P0, offset) is state for offset in (1, 2, 3)] == [True] * 3


def test_settles_of_a_partition_taken_away_are_refused() -> None:
    ledger = OffsetLedger()
    old = take(ledger, P0, 0)
    ledger.forget([P0])
    new = take(ledger, P0, 0)  # assigned again: read from the committed offset

    assert not ledger.finish(old, 0)
    assert not ledger.give_back(old, 0)
    assert ledger.pop_rewinds() == []
    assert ledger.to_commit() == {}
    assert ledger.finish(new, 0)
    assert ledger.to_commit() == {P0: 1}


def test_forgotten_partitions_have_nothing_to_commit() -> None:
    ledger = OffsetLedger()
    p0 = take(ledger, P0, 0)
    ledger.finish(p0, 0)
    take(ledger, P1, 0)

    ledger.forget([P0])

    assert ledger.to_commit() == {}
    assert ledger.commit_point(P1) == 0  # still held by its open record
    assert ledger.to_commit([P0]) == {}


def test_records_finished_from_many_threads_are_all_committed() -> None:
    ledger = OffsetLedger()
    state = take(ledger, P0, *range(1000))

    def finish(start: int) -> None:
        for offset in range(start, 1000, 4):
            ledger.finish(state, offset)

    threads = [threading.Thread(target=finish, args=(start,)) for start in (3, 1, 2, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert ledger.finished_since_commit == 1000
    assert ledger.to_commit() == {P0: 1000}
