"""Fleet-wide limits: what a store keeps per limit key, and the one way it is decided.

A limit key (``charge`` or ``charge:customer-7``) has one small state, kept by
a store that implements :class:`SupportsLimits`:

* ``tat``: the rate's theoretical arrival time (GCRA). Each start moves it one
  interval on; a start is allowed while it is no more than ``burst - 1``
  intervals ahead of now. A start refused for the rate is *reserved*: the
  interval is charged at once and the caller is told when its turn comes, so
  a job deferred for the rate is deferred once and runs at its turn.
* ``slots``: the concurrency slots held now, each with when its lease ends and
  when it was taken. A slot whose lease ran out (its worker died) is free.
* ``ctat``, ``cstep``, ``avg`` and ``n``: when a refused job should come back
  for a slot: the jobs already waiting spread ``cstep`` apart over the expected
  finishing of those running (``avg`` is a moving mean of how long a slot is
  held, over ``n`` releases; ``cstep`` the spacing it gave the last refused job).

Memory, the filesystem and PostgreSQL run :func:`take`, :func:`release` and
:func:`renew` below inside their own lock or transaction; Redis runs the same
steps in one script. The conformance kit holds every store to them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

#: A slot held this long without renewal is free again (its worker died).
DEFAULT_LEASE_S = 30.0
#: How long a slot is assumed to be held before any was released: short, so
#: that a guess too low costs a few early returns rather than idle slots.
FIRST_AVG_S = 0.1
#: Weight of the newest hold time in ``avg`` once ``1 / AVG_WEIGHT`` were seen;
#: before that ``avg`` is the plain mean of those seen.
AVG_WEIGHT = 0.2
#: The shortest wait a refused job is given: a deferral never comes back at once.
MIN_WAIT_S = 0.05


@dataclass(frozen=True, slots=True)
class LimitRule:
    """What one limit allows: a rate (one start per ``interval_s``, ``burst`` at once), slots."""

    #: Seconds between starts (a period over its count: ``100/m`` is 0.6); None: no rate.
    interval_s: float | None = None
    #: Starts allowed back to back before the interval applies (1: evenly spaced).
    burst: int = 1
    #: Jobs of the key running at once, fleet-wide; None: no such limit.
    concurrency: int | None = None
    #: Turns a take refused for the rate reserves: its own and ``reserve - 1``
    #: more (:attr:`Take.more`) that a worker holding several jobs of the key
    #: hands out without asking again.
    reserve: int = 1


class Take(NamedTuple):
    """What a store answered to :meth:`SupportsLimits.limit_take`."""

    #: 0: the job runs now (its slot, when the rule has slots, is held). More:
    #: seconds until it should be tried again.
    wait_s: float
    #: The rate was charged for this job: now (it runs) or for its turn (it
    #: waits). A job tried again with ``charged=True`` is not charged twice.
    charged: bool
    #: Seconds until each further turn reserved (``LimitRule.reserve``), in order.
    more: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """One limit key as ``hermes stats`` and the dashboard show it."""

    key: str
    #: Slots held now (jobs of the key running fleet-wide).
    running: int
    #: Turns of the rate still to come: jobs deferred to them, and turns
    #: workers reserved ahead for more jobs of the key.
    reserved: int
    #: Jobs told to come back for a slot that is not yet expected free (an estimate).
    queued: int
    #: Mean seconds a slot was held, as the store measured it.
    avg_s: float

    @property
    def waiting(self) -> int:
        """Jobs deferred by this limit and not yet started (turns held ahead included)."""
        return self.reserved + self.queued


@runtime_checkable
class SupportsLimits(Protocol):
    """Optional: keep the state of fleet-wide rate and concurrency limits.

    What ``--limits-url`` names. Core decides what runs; a store keeps each
    key's small state and changes it atomically. The contract, which the
    conformance kit checks on every driver that has these methods:

    * :meth:`limit_take` runs :func:`take` on the key's state atomically among
      any number of processes and hosts, with the store's own clock where it
      has one (one clock for the fleet), and returns its answer.
    * :meth:`limit_release` runs :func:`release`; :meth:`limit_renew` runs
      :func:`renew` and says whether the slot was still held.
    * A key's state is forgotten once it says nothing any more (no slot held,
      no turn promised), never sooner.
    * :meth:`limit_scan` returns up to ``limit`` keys with their state as
      :func:`encode` wrote it.
    * Keys live in the driver's namespace, like claims. Thread-safe and
      fork-safe like :meth:`Driver.put`; broker failures raise like it.
    """

    def limit_take(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Take:
        """Run one job of ``key`` under ``rule`` now, holding ``slot``, or say when to try again."""
        ...

    def limit_release(self, key: str, slot: str) -> None:
        """Free ``slot`` of ``key`` (nothing happens when it is not held)."""
        ...

    def limit_renew(self, key: str, slot: str, lease_s: float) -> bool:
        """Hold ``slot`` of ``key`` ``lease_s`` more seconds; False if it was no longer held."""
        ...

    def limit_scan(self, limit: int) -> list[tuple[str, bytes]]:
        """Up to ``limit`` keys and their states, in no particular order."""
        ...


State = dict[str, Any]


def fresh() -> State:
    """The state of a key nothing has used."""
    return {"tat": 0.0, "ctat": 0.0, "avg": FIRST_AVG_S, "n": 0, "slots": {}, "rule": [0, 1, 0]}


def decode(raw: bytes | str | None) -> State:
    """A stored state, or a fresh one for None."""
    if raw is None:
        return fresh()
    state: State = json.loads(raw)
    return state


def encode(state: State) -> bytes:
    """A state as stores keep it."""
    return json.dumps(state, separators=(",", ":")).encode()


def take(
    state: State, rule: LimitRule, slot: str, charged: bool, lease_s: float, now: float
) -> Take:
    """Decide one start of a job on ``state`` (changed in place) at ``now``.

    The slots come first: a job that would find every slot taken is told when
    one is expected free, without being charged for the rate, so a job that
    waits for a slot never uses up another's turn.
    """
    slots: dict[str, list[float]] = {
        name: held for name, held in state["slots"].items() if held[0] > now
    }
    state["slots"] = slots
    state["rule"] = [rule.interval_s or 0, rule.burst, rule.concurrency or 0]
    if rule.concurrency is not None and len(slots) >= rule.concurrency:
        step = state["avg"] / rule.concurrency
        due = max(state["ctat"], now) + step
        state["ctat"] = due
        state["cstep"] = step
        return Take(max(due - now, MIN_WAIT_S), charged)
    if rule.interval_s is not None and not charged:
        tat = max(state["tat"], now) + rule.interval_s
        turn = tat - rule.burst * rule.interval_s
        state["tat"] = tat
        if turn > now:
            more = []
            for _ in range(rule.reserve - 1):
                tat += rule.interval_s
                more.append(tat - rule.burst * rule.interval_s - now)
            state["tat"] = tat
            return Take(max(turn - now, MIN_WAIT_S), True, tuple(more))
        charged = True
    if rule.concurrency is not None:
        slots[slot] = [now + lease_s, now]
    return Take(0.0, charged)


def release(state: State, slot: str, now: float) -> None:
    """Free ``slot`` and fold how long it was held into ``avg``."""
    held = state["slots"].pop(slot, None)
    if held is not None:
        seen = min(state.get("n", 0) + 1, round(1 / AVG_WEIGHT))
        weight = 1 / seen if seen < 1 / AVG_WEIGHT else AVG_WEIGHT
        state["avg"] = (1 - weight) * state["avg"] + weight * max(now - held[1], 0.0)
        state["n"] = seen


def renew(state: State, slot: str, lease_s: float, now: float) -> bool:
    """Extend ``slot``'s lease to ``now + lease_s``; False if it is not held (or ran out)."""
    held = state["slots"].get(slot)
    if held is None or held[0] <= now:
        return False
    held[0] = now + lease_s
    return True


def keep_for(state: State, now: float) -> float:
    """Seconds a store must keep ``state``: until nothing in it says anything (0: drop it)."""
    until: float = max(state["tat"], state["ctat"], *(held[0] for held in state["slots"].values()))
    return max(math.ceil(until - now), 0.0)


def usage(key: str, state: State, now: float) -> LimitUsage:
    """What ``state`` says of ``key`` at ``now``."""
    interval_s, burst, concurrency = state["rule"]
    running = sum(1 for held in state["slots"].values() if held[0] > now)
    reserved = 0
    if interval_s:
        reserved = max(math.ceil((state["tat"] - now) / interval_s) - burst, 0)
    queued = 0
    step = state.get("cstep") or (state["avg"] / concurrency if concurrency else 0)
    if step and state["ctat"] > now:
        queued = math.ceil((state["ctat"] - now) / step)
    return LimitUsage(key, running, reserved, queued, state["avg"])
