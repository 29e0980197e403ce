"""Periodic entries: when each one fires (a cron expression or an interval) and what it emits.

An entry is declared next to the handlers, on the ``HandlerRegistry`` the
worker loads (``handlers.every(...)``, ``handlers.cron(...)``), or on a
:class:`Schedule` of its own. Nothing here talks to a broker: the
:class:`~hermes.core.run._scheduler.Scheduler` claims and emits.

Time rules, the same in every scheduler process so that they agree on each
tick without talking to each other:

* An interval entry ticks at the multiples of its interval since the UNIX
  epoch (``every(minutes=5)``: 00:00, 00:05, ... UTC), whatever time a
  scheduler started. Use a cron entry for wall-clock times.
* A cron entry ticks in its timezone (default UTC), parsed and walked by
  cronsim. Daylight saving, as Debian's cron does it: an entry with a fixed
  minute and hour (``30 2 * * *``) runs once on the spring-forward day, at
  the first minute after the gap (03:00 when 02:00 jumps to 03:00), and once
  on the fall-back day, at the first of the two 02:30s. Wildcard entries
  (``*/5 * * * *``) tick by elapsed time, so the repeated hour has its ticks too.
* A tick's key is ``<name>@<UTC time>``, e.g. ``nightly@2025-03-30T01:00:00Z``.
* ``jitter_s`` delays each tick's emit by a fraction of it that is derived
  from the tick's key, so every scheduler fires a tick at the same moment and
  the entries of many applications do not all hit the broker on the minute.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from hermes.core.model._errors import ConfigurationError
from hermes.core.model._message import Message
from hermes.core.spi._driver import DEFAULT_PRIORITY

#: The smallest interval an entry may have: the tick key is to the second.
MIN_INTERVAL_S = 1.0
#: Namespace of the tick messages' ids: uuid5 of the tick key.
_TICK_NAMESPACE = "6c1f0b4e-57a2-4c4e-9a8e-2f4a1d3c9b70"

# uuid, hashlib and zoneinfo are imported where a schedule uses them: every
# process imports this module (the registry's every/cron), few run a schedule.


class CatchUp(enum.Enum):
    """What an entry does with the ticks a scheduler missed (every scheduler was down)."""

    #: One emit, of the newest missed tick, stands for all of them.
    ONCE = "once"
    #: Every missed tick is emitted, oldest first (each claimed on its own).
    ALL = "all"
    #: Missed ticks are skipped; only a tick that is on time is emitted.
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Tick:
    """One moment an entry fires, as its handler's payload function sees it."""

    #: The entry's name.
    entry: str
    #: The tick's time, a UNIX timestamp (before any jitter).
    at: float
    #: The entry's timezone, for :attr:`time`.
    timezone: dt.tzinfo = dt.UTC

    @property
    def time(self) -> dt.datetime:
        """The tick as an aware datetime in the entry's timezone."""
        return dt.datetime.fromtimestamp(self.at, self.timezone)

    @property
    def key(self) -> str:
        """``<name>@<UTC ISO time>``: what the schedulers claim before one of them emits it."""
        moment = dt.datetime.fromtimestamp(self.at, dt.UTC)
        spec = "seconds" if self.at == math.floor(self.at) else "milliseconds"
        return f"{self.entry}@{moment.isoformat(timespec=spec).replace('+00:00', 'Z')}"

    @property
    def message_id(self) -> str:
        """The id of the message this tick emits: the same in every scheduler (uuid5 of the key)."""
        import uuid

        return str(uuid.uuid5(uuid.UUID(_TICK_NAMESPACE), self.key))


#: A payload, or a function of the tick that returns one.
Payload = dict[str, Any] | list[Any] | None | Callable[[Tick], Any]


@dataclass(frozen=True, slots=True)
class Entry:
    """A periodic job: emit a message of ``type`` on each tick of a cron expression or interval."""

    #: Unique within a schedule; part of every tick key, so renaming an entry
    #: makes it a new one (its past ticks are not its own any more).
    name: str
    #: The type of the message emitted on each tick.
    type: str
    #: The payload, or a function of the :class:`Tick` returning one.
    payload: Payload = None
    #: A cron expression (5 fields, or 6 with seconds first); or None with ``interval_s``.
    cron: str | None = None
    #: Seconds between ticks; or None with ``cron``.
    interval_s: float | None = None
    #: An IANA timezone name for ``cron`` (intervals are elapsed time).
    timezone: str = "UTC"
    #: The priority queue the message goes to.
    priority: int = DEFAULT_PRIORITY
    #: Up to this many seconds added to each tick's emit (derived from the tick key).
    jitter_s: float = 0.0
    #: What to do with missed ticks.
    catch_up: CatchUp = CatchUp.ONCE

    def __post_init__(self) -> None:
        where = f"periodic entry {self.name!r}"
        if not isinstance(self.name, str) or not self.name or "@" in self.name:
            raise ConfigurationError(
                f"periodic entry name must be a non-empty string without '@', got {self.name!r}"
            )
        if not isinstance(self.type, str) or not self.type:
            raise ConfigurationError(f"{where}: type must be a non-empty string: {self.type!r}")
        if (self.cron is None) == (self.interval_s is None):
            raise ConfigurationError(f"{where}: give a cron expression or an interval, one of them")
        if self.interval_s is not None and not (
            isinstance(self.interval_s, int | float) and self.interval_s >= MIN_INTERVAL_S
        ):
            raise ConfigurationError(
                f"{where}: the interval must be at least {MIN_INTERVAL_S:g} s, "
                f"got {self.interval_s!r}"
            )
        zone = _zone(self.timezone, where)
        if self.cron is not None:
            _check_cron(self.cron, zone, where)
        if not isinstance(self.jitter_s, int | float) or not self.jitter_s >= 0:
            raise ConfigurationError(f"{where}: jitter_s must be >= 0 seconds: {self.jitter_s!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ConfigurationError(f"{where}: priority must be an int: {self.priority!r}")
        object.__setattr__(self, "catch_up", _catch_up(self.catch_up, self.name))
        if not callable(self.payload):
            try:
                Message(self.type, self.payload)  # one PHP could not take fails here, not later
            except ValueError as exc:
                raise ConfigurationError(f"{where}: {exc}") from None

    @property
    def zone(self) -> dt.tzinfo:
        return _zone(self.timezone, self.name)

    def describe(self) -> str:
        """``every 5 s`` or ``cron '30 2 * * *' Europe/Bratislava``, for log lines and --list."""
        if self.interval_s is not None:
            when = f"every {self.interval_s:g} s"
        else:
            when = f"cron {self.cron!r}" + ("" if self.timezone == "UTC" else f" {self.timezone}")
        if self.jitter_s:
            when += f" (+ up to {self.jitter_s:g} s jitter)"
        return when

    def tick(self, at: float) -> Tick:
        return Tick(self.name, at, self.zone)

    def ticks_after(self, after: float) -> Iterator[float]:
        """The tick times strictly after ``after``, ascending, for ever."""
        if self.interval_s is not None:
            step = self.interval_s
            k = math.floor(after / step) + 1
            while True:
                at = k * step
                if at > after:  # float rounding at the boundary
                    yield at
                k += 1
        assert self.cron is not None
        zone = self.zone
        start = dt.datetime.fromtimestamp(math.floor(after), zone)
        from cronsim import CronSim  # imported on first use: most processes never parse cron

        for moment in CronSim(self.cron, start):
            at = moment.timestamp()
            # In the repeated hour of a fall-back, a fixed-time entry's first
            # 02:30 can lie before a start in the second one: not after it.
            if at > after:
                yield at

    def ticks_between(self, after: float, until: float, limit: int) -> tuple[list[float], int]:
        """The newest ``limit`` ticks in ``(after, until]``, ascending, and how many there are."""
        if self.interval_s is not None:
            step = self.interval_s
            first, last = math.floor(after / step) + 1, math.floor(until / step)
            count = max(0, last - first + 1)
            ticks = [k * step for k in range(max(first, last - limit + 1), last + 1)]
            return [t for t in ticks if after < t <= until], count
        newest: list[float] = []
        count = 0
        for at in self.ticks_after(after):
            if at > until:
                break
            count += 1
            newest.append(at)
            if len(newest) > limit:
                del newest[0]
        return newest, count

    def next_fire_times(self, after: float, count: int) -> list[float]:
        """When the next ``count`` ticks after ``after`` fire (jitter included), ascending."""
        fires: list[float] = []
        for at in self.ticks_after(after - self.jitter_s):
            # A tick fires at or after its own time: once ticks pass the
            # count-th fire found, no later tick can come before it.
            if len(fires) >= count and at > fires[count - 1]:
                break
            fire = self.fire_at(at)
            if fire > after:
                fires.append(fire)
                fires.sort()
        return fires[:count]

    def fire_at(self, at: float) -> float:
        """When the tick at ``at`` is emitted: ``at`` plus its share of the jitter."""
        if not self.jitter_s:
            return at
        import hashlib

        digest = hashlib.blake2b(self.tick(at).key.encode(), digest_size=8).digest()
        return at + self.jitter_s * int.from_bytes(digest, "big") / 2**64

    def message(self, at: float) -> Message:
        """The message the tick at ``at`` emits (its id is the same in every scheduler)."""
        tick = self.tick(at)
        payload = self.payload(tick) if callable(self.payload) else self.payload
        return Message(self.type, payload, id=tick.message_id)


class Schedule:
    """The periodic entries of an application, declared where its handlers are.

    A :class:`~hermes.core.HandlerRegistry` has one (``handlers.every``,
    ``handlers.cron``); a ``Schedule`` can also stand alone and be named by
    ``hermes scheduler --handlers module:schedule``. Entries are checked as
    they are declared: a bad cron expression or an unknown timezone raises a
    :class:`ConfigurationError` when the module is imported.
    """

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def every(
        self,
        *,
        type: str,
        seconds: float = 0,
        minutes: float = 0,
        hours: float = 0,
        days: float = 0,
        name: str | None = None,
        payload: Payload = None,
        priority: int = DEFAULT_PRIORITY,
        jitter_s: float = 0.0,
        catch_up: CatchUp | str = CatchUp.ONCE,
    ) -> Entry:
        """Emit ``type`` every interval (its multiples since the epoch); ``name`` defaults to it."""
        interval = seconds + 60 * minutes + 3600 * hours + 86400 * days
        return self.add(
            Entry(
                name=type if name is None else name,
                type=type,
                payload=payload,
                interval_s=float(interval),
                priority=priority,
                jitter_s=jitter_s,
                catch_up=_catch_up(catch_up, type if name is None else name),
            )
        )

    def cron(
        self,
        expression: str,
        *,
        type: str,
        name: str | None = None,
        payload: Payload = None,
        timezone: str = "UTC",
        priority: int = DEFAULT_PRIORITY,
        jitter_s: float = 0.0,
        catch_up: CatchUp | str = CatchUp.ONCE,
    ) -> Entry:
        """Emit ``type`` on each tick of the cron ``expression`` in ``timezone``."""
        return self.add(
            Entry(
                name=type if name is None else name,
                type=type,
                payload=payload,
                cron=expression,
                timezone=timezone,
                priority=priority,
                jitter_s=jitter_s,
                catch_up=_catch_up(catch_up, type if name is None else name),
            )
        )

    def add(self, entry: Entry) -> Entry:
        """Add ``entry``; a second entry of the same name is refused (names make the tick keys)."""
        if entry.name in self._entries:
            raise ConfigurationError(
                f"two periodic entries are named {entry.name!r}: give each its own name="
            )
        self._entries[entry.name] = entry
        return entry

    @property
    def entries(self) -> tuple[Entry, ...]:
        return tuple(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)

    def __repr__(self) -> str:
        return f"<Schedule {', '.join(self._entries) or 'empty'}>"


P = ParamSpec("P")
R = TypeVar("R")


def on_schedule(method: Callable[Concatenate[Schedule, P], R]) -> Callable[Concatenate[Any, P], R]:
    """``method`` of :class:`Schedule` as a method of an object with a ``schedule`` (a registry)."""

    @functools.wraps(method)
    def call(owner: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(owner.schedule, *args, **kwargs)

    return call


def _catch_up(value: CatchUp | str, name: str) -> CatchUp:
    try:
        return CatchUp(value)
    except ValueError:
        raise ConfigurationError(
            f"periodic entry {name!r}: catch_up must be 'once', 'all' or 'none', got {value!r}"
        ) from None


def _zone(name: str, where: str) -> dt.tzinfo:
    if name == "UTC":
        return dt.UTC
    import zoneinfo

    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"{where}: unknown timezone {name!r}; give an IANA name such as 'Europe/Bratislava' "
            "or 'UTC'"
        ) from None


def _check_cron(expression: str, zone: dt.tzinfo, where: str) -> None:
    if not isinstance(expression, str):
        raise ConfigurationError(f"{where}: the cron expression must be a string: {expression!r}")
    from cronsim import CronSim, CronSimError

    try:
        next(CronSim(expression, dt.datetime.now(zone)))
    except CronSimError as exc:
        raise ConfigurationError(f"{where}: bad cron expression {expression!r}: {exc}") from None
    except StopIteration:
        raise ConfigurationError(
            f"{where}: the cron expression {expression!r} never fires"
        ) from None
