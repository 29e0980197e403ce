"""Rate and concurrency limits per message type, held across every worker of a fleet.

A :class:`Limit` is declared next to a type's handlers; a :class:`Limiter`
asks a store (:class:`~hermes.core.spi._limits.SupportsLimits`) before each
job of a limited type whether it runs now. A job over its limit is not run,
not busy-waited and not counted as a retry: the Dispatcher sends a copy due
when the store says its turn comes and acknowledges the one it holds, so the
worker's threads go on with other types at once.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hermes.core.model._errors import ConfigurationError
from hermes.core.model._message import Message
from hermes.core.spi._door import translate_errors
from hermes.core.spi._driver import Delay, Driver
from hermes.core.spi._limits import (
    DEFAULT_LEASE_S,
    LimitRule,
    LimitUsage,
    SupportsLimits,
    decode,
    usage,
)
from hermes.core.spi._registry import connect

logger = logging.getLogger("hermes")

#: The header of a copy sent for its rate turn: ``RETRIES@TURN``, the
#: ``retries`` of the attempt the turn was charged for and the turn's time
#: (seconds since the epoch). That attempt, delivered by its turn or up to
#: :attr:`Limit.late_s` after it, is not charged again; a retry copy
#: (``retries + 1``), or a copy delivered later than that (the workers were
#: stopped or far behind), is charged anew, so that jobs whose turns passed
#: long ago do not all start at once.
LIMIT_HEADER = "hermes-limit-turn"

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(
    r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*"
    r"(s|sec|second|m|min|minute|h|hour|d|day)s?\s*$"
)

KeyFunction = Callable[[Message], object]

#: The most turns one take reserves for a process deferring many jobs of a key:
#: a store call per that many deferrals, and at most that many turns lost when
#: the process stops or its jobs of the key run out.
MAX_RESERVE = 16
#: The most time of the rate one reserved block spans: a slow rate (a tenant's
#: ``5/s``) reserves one turn at a time, so a short backlog of its key leaves no
#: turns unused behind it; a fast one (``50/s``) reserves up to :data:`MAX_RESERVE`,
#: where a store call per job would cost more than the turns a block can lose.
MAX_BLOCK_S = 0.25
#: The least time after its turn a deferred copy still runs on that turn.
LATE_S = 60.0
#: How early before its turn a copy still counts as charged: clocks of two
#: hosts disagree; a copy earlier than that was not held back by its broker.
EARLY_S = 1.0


def parse_rate(rate: str) -> float:
    """Seconds between starts for a rate such as ``100/m``, ``10/s``, ``5/10s`` or ``1000/d``."""
    count, period = _rate_parts(rate)
    return period / count


def _rate_parts(rate: str) -> tuple[int, float]:
    """A rate's count and its period in seconds."""
    found = _RATE.match(rate) if isinstance(rate, str) else None
    if found is None:
        raise ConfigurationError(
            f"a rate is a count per period such as 100/m, 10/s, 5/10s or 1000/d, got {rate!r}"
        )
    count = int(found.group(1))
    period = float(found.group(2) or 1) * _UNITS[found.group(3)[0]]
    if count < 1 or period <= 0:
        raise ConfigurationError(
            f"a rate needs a count >= 1 and a period > 0, such as 100/m, got {rate!r}"
        )
    return count, period


@dataclass(frozen=True)
class Limit:
    """How many jobs of one type start: a ``rate`` and/or a ``concurrency``, optionally per key.

    ``rate`` -- ``"100/m"``, ``"10/s"``, ``"5/10s"``: starts are spaced
    evenly, one turn per period over count (``100/m``: one every 0.6 s), so
    no window of the period holds more turns than the count; ``burst`` lets
    that many start back to back first (then a window may hold ``count +
    burst - 1``). A job deferred to its turn starts when it is delivered: at
    its turn while the workers keep up (see :data:`LIMIT_HEADER` for one
    delivered late).
    ``concurrency`` -- jobs running at once, fleet-wide; a slot is leased, so
    a worker that dies frees its slots within ``lease_s``. ``key`` -- a
    payload field name, or a function of the message: each value has limits
    of its own (``key="customer"``: at most 5 at once *per customer*). A
    message without the field, or whose payload is not an object, counts
    under the value ``null``.
    """

    rate: str | None = None
    concurrency: int | None = None
    key: str | KeyFunction | None = None
    burst: int = 1
    lease_s: float = DEFAULT_LEASE_S
    _rule: LimitRule = field(init=False, repr=False, compare=False)
    _late_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rate is None and self.concurrency is None:
            raise ConfigurationError("a limit needs a rate, a concurrency or both")
        count, period = _rate_parts(self.rate) if self.rate is not None else (0, 0.0)
        for name, value in (("concurrency", self.concurrency), ("burst", self.burst)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(f"a limit's {name} must be an int >= 1, got {value!r}")
            if value is not None and value < 1:
                raise ConfigurationError(f"a limit's {name} must be an int >= 1, got {value!r}")
        if not (isinstance(self.lease_s, int | float) and self.lease_s >= 1):
            raise ConfigurationError(f"a limit's lease_s must be >= 1 second, got {self.lease_s!r}")
        if self.key is not None and not (isinstance(self.key, str) or callable(self.key)):
            raise ConfigurationError(
                f"a limit's key is a payload field name or a function of the message, "
                f"got {self.key!r}"
            )
        interval_s = period / count if self.rate is not None else None
        rule = LimitRule(interval_s, self.burst, self.concurrency)
        object.__setattr__(self, "_rule", rule)
        object.__setattr__(self, "_late_s", max(period, LATE_S) if self.rate is not None else 0.0)

    @property
    def late_s(self) -> float:
        """How late after its turn a charged copy still runs on that charge.

        One period of the rate, and at least :data:`LATE_S`: workers that fall
        behind for a while (a burst of other jobs) run the turns they missed
        as they catch up, instead of losing them; after a longer stall the
        copies are charged anew rather than all starting at once.
        """
        return self._late_s

    @property
    def rule(self) -> LimitRule:
        """What the store is asked to hold this limit to (parsed once, not per job)."""
        return self._rule

    def key_of(self, message: Message) -> str:
        """The store key ``message`` counts under: its type, and its key's value if any."""
        if self.key is None:
            return message.type
        if callable(self.key):
            value = self.key(message)
        else:
            payload = message.payload
            value = payload.get(self.key) if isinstance(payload, Mapping) else None
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        return f"{message.type}:{text}"

    def describe(self) -> str:
        parts = []
        if self.rate is not None:
            parts.append(self.rate + (f" (burst {self.burst})" if self.burst > 1 else ""))
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        text = ", ".join(parts)
        if self.key is not None:
            name = self.key if isinstance(self.key, str) else getattr(self.key, "__name__", "key")
            text += f" per {name}"
        return text


def parse_limit(text: str) -> tuple[str, Limit]:
    """``TYPE:rate=100/m,concurrency=5,key=customer,burst=10`` as the CLI's ``--limit`` takes it."""
    type_, sep, spec = text.rpartition(":") if "=" in text else ("", "", "")
    if not sep or not type_ or not spec:
        raise ConfigurationError(
            f"--limit takes TYPE:rate=100/m,concurrency=5,key=FIELD, got {text!r}"
        )
    fields: dict[str, str] = {}
    for part in spec.split(","):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in {"rate", "concurrency", "key", "burst", "lease"}:
            raise ConfigurationError(
                f"--limit {text!r}: {part.strip()!r} is not one of rate=, concurrency=, key=, "
                "burst=, lease="
            )
        fields[name] = value.strip()
    try:
        limit = Limit(
            rate=fields.get("rate"),
            concurrency=int(fields["concurrency"]) if "concurrency" in fields else None,
            key=fields.get("key"),
            burst=int(fields.get("burst", "1")),
            lease_s=float(fields.get("lease", DEFAULT_LEASE_S)),
        )
    except ValueError as exc:
        raise ConfigurationError(f"--limit {text!r}: {exc}") from exc
    return type_, limit


@dataclass(frozen=True, slots=True)
class Held:
    """A job that runs under its limit: the slot it holds until :meth:`Limiter.release`."""

    key: str
    slot: str
    lease_s: float


@dataclass(frozen=True, slots=True)
class Deferred:
    """A job over its limit: try it again in ``wait_s`` seconds."""

    key: str
    wait_s: float
    charged: bool
    #: When the turn charged by this decision comes (seconds since the epoch);
    #: None when this decision charged nothing new.
    turn: float | None = None

    def header(self, message: Message) -> str | None:
        """The value of :data:`LIMIT_HEADER` the copy of ``message`` carries; None: none."""
        if self.turn is not None:
            return f"{message.retries}@{self.turn:.3f}"
        if self.charged and message.headers:
            return message.headers.get(LIMIT_HEADER)
        return None


def _charged(limit: Limit, message: Message) -> bool:
    """Whether ``message`` carries a turn charged for this attempt that has not long passed."""
    value = message.headers.get(LIMIT_HEADER) if message.headers else None
    if value is None or limit.rate is None:
        return False
    retries, _, turn = value.partition("@")
    try:
        at = float(turn)
        # Early by more than the clocks may disagree: its broker did not hold it back.
        return retries == str(message.retries) and at - EARLY_S <= time.time() <= at + limit.late_s
    except ValueError:
        logger.warning(
            "Message #%s (%s) has an unreadable %s header %r: its rate is charged again",
            message.id,
            message.type,
            LIMIT_HEADER,
            value,
        )
        return False


def _max_block(rule: LimitRule) -> int:
    """The most turns a take of ``rule`` reserves: :data:`MAX_BLOCK_S` of its rate, 1 to 16."""
    if not rule.interval_s:
        return 1
    return max(1, min(MAX_RESERVE, int(MAX_BLOCK_S / rule.interval_s)))


class Limiter:
    """Asks the store whether a job of a limited type starts now, and holds its slot.

    Slots held are renewed from one thread every third of their lease, so a
    job longer than its lease keeps its slot while its worker lives.
    """

    def __init__(self, store: Driver | str) -> None:
        driver = connect(store) if isinstance(store, str) else store
        if not isinstance(driver, SupportsLimits):
            raise ConfigurationError(
                f"{driver!r} cannot keep limits: name a store whose driver can "
                "(memory://, file://, redis://, postgresql://)"
            )
        self.driver = driver
        self.store: SupportsLimits = driver
        self._owned = isinstance(store, str)
        self._held: dict[str, Held] = {}
        #: Key -> turns this process reserved ahead (``time.time()``), in order.
        self._turns: dict[str, collections.deque[float]] = {}
        #: Key -> turns the next take refused for the rate reserves: doubles while
        #: this process keeps deferring jobs of the key and uses every turn.
        self._reserve: dict[str, int] = {}
        self._lock = threading.Lock()
        self._renewing = threading.Event()
        self._closed = threading.Event()
        self._renewer: threading.Thread | None = None

    def check_driver(self, driver: Driver) -> None:
        """Refuse a broker that cannot hold a deferred copy back (it would come back at once)."""
        if driver.capabilities.delay is Delay.IGNORED:
            raise ConfigurationError(
                f"limits defer a job by sending it again for later, and {driver!r} "
                "delivers every message at once: use a broker that delays messages "
                "(redis://, postgresql://, file://, sqs:// with delay)"
            )

    def take(self, limit: Limit, message: Message) -> Held | Deferred | None:
        """Whether ``message`` runs now: Held (it does), Deferred (not yet), None (no slot kept)."""
        key = limit.key_of(message)
        charged = _charged(limit, message)
        rule = limit.rule
        if charged and rule.concurrency is None:
            return None  # its turn was charged when it was deferred: nothing to ask
        if not charged and rule.interval_s is not None:
            turn = self._held_turn(key, limit.late_s)
            if turn is not None:
                wait_s = turn - time.time()
                if wait_s > 0:
                    return Deferred(key, wait_s, True, turn)
                if rule.concurrency is None:
                    return None  # its turn came while it was on its way: it runs now
                charged = True  # runs now on that turn if a slot is free
            else:
                rule = dataclasses.replace(rule, reserve=self._reserve.get(key, 1))
        slot = os.urandom(12).hex()
        answer = self._ask(key, rule, slot, charged, limit.lease_s)
        if isinstance(answer, Deferred):
            return answer
        if limit.concurrency is None:
            return None
        held = Held(key, slot, limit.lease_s)
        with self._lock:
            self._held[slot] = held
            if self._renewer is None:
                self._renewer = threading.Thread(
                    target=self._renew, name="hermes-limits", daemon=True
                )
                self._renewer.start()
        return held

    def reserve(self, limit: Limit, message: Message) -> Deferred | None:
        """Charge ``message``'s turn of its rate as it is emitted; None: no rate, or charged.

        What an :class:`~hermes.core.Emitter` given the limits asks. The answer
        is the turn (``wait_s`` 0 when it is now): the job is sent due then,
        with the turn in its :data:`LIMIT_HEADER`, so no worker takes it before
        and none asks the rate again (a job that waits in its queue more than
        :attr:`Limit.late_s` past its turn is charged anew by its worker).
        """
        if limit.rate is None or _charged(limit, message):
            return None
        key = limit.key_of(message)
        turn = self._held_turn(key, limit.late_s)
        if turn is not None:
            return Deferred(key, max(turn - time.time(), 0.0), True, turn)
        rule = dataclasses.replace(limit.rule, concurrency=None, reserve=self._reserve.get(key, 1))
        deferred = self._ask(key, rule, "", False, limit.lease_s)
        return deferred or Deferred(key, 0.0, True, time.time())

    def _ask(
        self, key: str, rule: LimitRule, slot: str, charged: bool, lease_s: float
    ) -> Deferred | None:
        """The store's answer: Deferred, or None when the job may start now. Turns reserved
        ahead are kept for the next jobs of ``key``."""
        with translate_errors(self.driver, f"take a limit slot of {key!r}"):
            answer = self.store.limit_take(key, rule, slot, charged, lease_s)
        if answer.wait_s <= 0:
            return None
        now = time.time()
        turn = now + answer.wait_s if answer.charged and not charged else None
        if answer.more:
            with self._lock:
                # Another thread may have reserved a block meanwhile: keep both.
                ahead = self._turns.get(key, ())
                self._turns[key] = collections.deque(
                    sorted([*ahead, *(now + wait for wait in answer.more)])
                )
        if turn is not None:
            with self._lock:
                self._reserve[key] = min(2 * rule.reserve, _max_block(rule))
        return Deferred(key, answer.wait_s, answer.charged, turn)

    def _held_turn(self, key: str, late_s: float) -> float | None:
        """The next turn of ``key`` this process reserved and has not handed out; None: none.

        A turn that passed less than ``late_s`` ago is still handed out (its
        job runs at once); one that passed longer ago is dropped (the rate
        loses it, never gains), and the next take reserves one turn at a time
        again.
        """
        with self._lock:
            turns = self._turns.get(key)
            oldest = time.time() - late_s
            while turns:
                turn = turns.popleft()
                if turn >= oldest:
                    if not turns:
                        del self._turns[key]
                    return turn
                self._reserve.pop(key, None)
            self._turns.pop(key, None)
        return None

    def release(self, held: Held) -> None:
        """Free ``held``'s slot; a store that cannot be reached lets the lease free it."""
        with self._lock:
            self._held.pop(held.slot, None)
        try:
            with translate_errors(self.driver, f"free a limit slot of {held.key!r}"):
                self.store.limit_release(held.key, held.slot)
        except Exception as exc:
            logger.warning(
                "Could not free a slot of limit %s (its lease frees it within %g s) - %s",
                held.key,
                held.lease_s,
                exc,
            )

    def usage(self, limit: int = 1000) -> list[LimitUsage]:
        """Every key the store keeps, as ``hermes stats`` shows them."""
        now = time.time()
        with translate_errors(self.driver, "read the limits"):
            states = self.store.limit_scan(limit)
        return sorted((usage(key, decode(raw), now) for key, raw in states), key=lambda u: u.key)

    def _renew(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                held = list(self._held.values())
            wait_s = min((h.lease_s for h in held), default=DEFAULT_LEASE_S) / 3
            if self._closed.wait(wait_s):
                return
            for one in held:
                with self._lock:
                    if one.slot not in self._held:
                        continue
                try:
                    with translate_errors(self.driver, f"renew a limit slot of {one.key!r}"):
                        kept = self.store.limit_renew(one.key, one.slot, one.lease_s)
                except Exception as exc:
                    logger.warning("Could not renew a slot of limit %s - %s", one.key, exc)
                    continue
                if not kept:
                    logger.warning(
                        "A slot of limit %s ran out before its job ended: another job of "
                        "the key may start beside it",
                        one.key,
                    )

    def close(self) -> None:
        """Stop renewing; close the store's driver when this object connected it from a URL."""
        self._closed.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        if self._owned:
            self.driver.close()
