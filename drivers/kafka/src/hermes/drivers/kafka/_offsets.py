"""What a consumer may commit when records finish out of order, and what to read again.

Kafka commits one offset per partition: "everything before this is done". A
worker takes records in stream order but they finish in any order: a delayed
record (or a lower-priority one) waits while later records of its partition
are handled, and several handlers may run at once. The ledger keeps, per
partition, the records taken and not finished; the commit point is the oldest
of them, or the offset after the last record taken when none is open — the
contiguous prefix of finished offsets, never past one still running. A crash
therefore redelivers every record from the oldest unfinished one on:
at-least-once, with repeats of later records that had already been handled.

A record given back (released, or dropped from the consumer's buffer) stays
unfinished and is read again: the partition is rewound to the oldest such
offset. Reading from there brings back records that are still running or
already finished; the ledger tells the consumer to skip those.

Thread-safe: ``finish`` and ``give_back`` may come from handler threads while
the reading thread takes records.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

#: ``(topic, partition)``.
Partition = tuple[str, int]


@dataclass(eq=False)
class PartitionState:
    """One partition's records, from its assignment to this consumer until it is taken away."""

    partition: Partition
    #: The last offset committed, or where reading started (committing that adds nothing).
    committed: int
    #: Offsets taken from the stream and not finished yet (buffered, running or given back).
    open: set[int] = field(default_factory=set)
    #: Open offsets given back: to be handed out again when the stream brings them back.
    given_back: set[int] = field(default_factory=set)
    #: The offset after the last record taken.
    next: int = -1
    #: Where the reading thread must seek the partition back to; None when it need not.
    rewind_to: int | None = None


class OffsetLedger:
    """Per partition: which records are open, what to skip on a re-read, what may be committed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._states: dict[Partition, PartitionState] = {}
        #: Records finished since the last :meth:`mark_committed`.
        self.finished_since_commit = 0
        #: Some partition waits for a rewind (read without the lock, as a hint).
        self.rewinds_due = False

    def take(self, partition: Partition, offset: int) -> PartitionState | None:
        """A record at ``offset`` came out of the stream: its partition's state if it is
        to be handed out, None if it is running or finished already (read again after a rewind).
        """
        with self.lock:
            state = self._states.get(partition)
            if state is None:
                state = self._states[partition] = PartitionState(partition, committed=offset)
            if offset >= state.next:
                state.open.add(offset)
                state.next = offset + 1
                return state
            if offset in state.given_back:
                state.given_back.discard(offset)
                return state
            return None

    def current(self, state: PartitionState) -> bool:
        """Whether ``state`` is still its partition's (not revoked since)."""
        return self._states.get(state.partition) is state

    def finish(self, state: PartitionState, offset: int) -> bool:
        """The record at ``offset`` is done (handled, or set aside).

        False if its partition was taken away meanwhile: its next owner reads it again.
        """
        with self.lock:
            if not self.current(state) or offset not in state.open:
                return False
            state.open.discard(offset)
            state.given_back.discard(offset)
            self.finished_since_commit += 1
            return True

    def give_back(self, state: PartitionState, offset: int, *, rewind: bool = True) -> bool:
        """The record at ``offset`` must be handed out again; ``rewind``: seek back to it.

        False if its partition was taken away meanwhile (its next owner reads it again).
        """
        with self.lock:
            if not self.current(state) or offset not in state.open:
                return False
            state.given_back.add(offset)
            if rewind and (state.rewind_to is None or offset < state.rewind_to):
                state.rewind_to = offset
                self.rewinds_due = True
            return True

    def pop_rewinds(self) -> list[tuple[PartitionState, int]]:
        """The partitions to seek back, and where to; forgets them (the caller seeks)."""
        with self.lock:
            rewinds = []
            for state in self._states.values():
                if state.rewind_to is not None:
                    rewinds.append((state, state.rewind_to))
                    state.rewind_to = None
            self.rewinds_due = False
            return rewinds

    def commit_point(self, partition: Partition) -> int:
        """The offset to commit for ``partition``: its oldest open record, else the next one."""
        with self.lock:
            state = self._states[partition]
            return min(state.open) if state.open else state.next

    def to_commit(self, partitions: list[Partition] | None = None) -> dict[Partition, int]:
        """``partition -> offset`` for every partition whose commit point moved forward."""
        with self.lock:
            wanted = list(self._states) if partitions is None else partitions
            points: dict[Partition, int] = {}
            for partition in wanted:
                state = self._states.get(partition)
                if state is None or state.next < 0:
                    continue
                point = min(state.open) if state.open else state.next
                if point > state.committed:
                    points[partition] = point
            return points

    def mark_committed(self, points: dict[Partition, int], finished: int) -> None:
        """``points`` are committed; they cover the ``finished`` records counted before
        :meth:`to_commit` (records finished since then still count towards the next commit).
        """
        with self.lock:
            for partition, offset in points.items():
                state = self._states.get(partition)
                if state is not None:
                    state.committed = max(state.committed, offset)
            self.finished_since_commit = max(0, self.finished_since_commit - finished)

    def unsettled(self, partitions: list[Partition]) -> set[tuple[Partition, int]]:
        """``(partition, offset)`` of the records taken and neither finished nor given back."""
        with self.lock:
            return {
                (partition, offset)
                for partition in partitions
                if (state := self._states.get(partition)) is not None
                for offset in state.open - state.given_back
            }

    def partitions(self) -> list[Partition]:
        with self.lock:
            return list(self._states)

    def forget(self, partitions: list[Partition]) -> None:
        """Drop partitions this consumer no longer owns; their open records go to the next owner."""
        with self.lock:
            for partition in partitions:
                self._states.pop(partition, None)
