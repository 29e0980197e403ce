"""OffsetLedger: the commit point when records finish out of order (pure bookkeeping)."""

from __future__ import annotations

from hermes.drivers.kafka._offsets import OffsetLedger

P0 = ("jobs", 0)
P1 = ("jobs", 1)


def test_records_finished_in_order_commit_the_offset_after_the_last() -> None:
    ledger = OffsetLedger()
    for offset in (5, 6, 7):
        ledger.take(P0, offset)
        ledger.finish(P0, offset)

    assert ledger.to_commit() == {P0: 8}
    assert ledger.finished_since_commit == 3


def test_an_open_record_holds_the_commit_point_of_its_partition_only() -> None:
    ledger = OffsetLedger()
    ledger.take(P0, 10)  # held, say a delayed message
    for offset in (11, 12):
        ledger.take(P0, offset)
        ledger.finish(P0, offset)
    ledger.take(P1, 3)
    ledger.finish(P1, 3)

    # P0 started at 10, which is still open: nothing new to commit there.
    assert ledger.to_commit() == {P1: 4}

    ledger.finish(P0, 10)
    assert ledger.to_commit() == {P0: 13, P1: 4}


def test_a_committed_point_is_not_committed_again() -> None:
    ledger = OffsetLedger()
    ledger.take(P0, 0)
    ledger.finish(P0, 0)
    ledger.mark_committed(ledger.to_commit())

    assert ledger.to_commit() == {}
    assert ledger.finished_since_commit == 0


def test_forgotten_partitions_have_nothing_to_commit() -> None:
    ledger = OffsetLedger()
    ledger.take(P0, 0)
    ledger.finish(P0, 0)
    ledger.take(P1, 0)

    ledger.forget([P0])

    assert ledger.to_commit() == {}
    assert ledger.commit_point(P1) == 0  # still held by its open record
    assert ledger.to_commit([P0]) == {}
