"""What a consumer may commit when records finish out of order.

Kafka commits one offset per partition: "everything before this is done". A
worker finishes records in stream order, except that a delayed record (or a
lower-priority one) may wait while later records of its partition are handled.
The ledger keeps, per partition, the records taken but not finished; the
commit point is the oldest of them, or the offset after the last record taken
when none is open. A crash therefore redelivers every record from the oldest
unfinished one on: at-least-once, with repeats of later records that had
already been handled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: ``(topic, partition)``.
Partition = tuple[str, int]


@dataclass
class _State:
    #: Offsets taken from the stream and not finished yet.
    open: set[int] = field(default_factory=set)
    #: The offset after the last record taken; -1 before the first one.
    next: int = -1
    #: The last offset committed, or where reading started (committing that adds nothing).
    committed: int = -1


class OffsetLedger:
    """Per partition: which records are open, and what may be committed."""

    def __init__(self) -> None:
        self._states: dict[Partition, _State] = {}
        #: Records finished since the last :meth:`mark_committed`.
        self.finished_since_commit = 0

    def take(self, partition: Partition, offset: int) -> None:
        """A record at ``offset`` came out of the stream and is not finished."""
        state = self._states.get(partition)
        if state is None:
            state = self._states[partition] = _State(committed=offset)
        state.open.add(offset)
        state.next = max(state.next, offset + 1)

    def finish(self, partition: Partition, offset: int) -> None:
        """The record at ``offset`` is done (handled, or set aside)."""
        state = self._states.get(partition)
        if state is not None and offset in state.open:
            state.open.discard(offset)
            self.finished_since_commit += 1

    def commit_point(self, partition: Partition) -> int:
        """The offset to commit for ``partition``: its oldest open record, else the next one."""
        state = self._states[partition]
        return min(state.open) if state.open else state.next

    def to_commit(self, partitions: list[Partition] | None = None) -> dict[Partition, int]:
        """``partition -> offset`` for every partition whose commit point moved forward."""
        wanted = self._states if partitions is None else partitions
        points: dict[Partition, int] = {}
        for partition in wanted:
            state = self._states.get(partition)
            if state is None or state.next < 0:
                continue
            point = self.commit_point(partition)
            if point > state.committed:
                points[partition] = point
        return points

    def mark_committed(self, points: dict[Partition, int]) -> None:
        for partition, offset in points.items():
            state = self._states.get(partition)
            if state is not None:
                state.committed = max(state.committed, offset)
        self.finished_since_commit = 0

    def forget(self, partitions: list[Partition]) -> None:
        """Drop partitions this consumer no longer owns; their open records go to the next owner."""
        for partition in partitions:
            self._states.pop(partition, None)
