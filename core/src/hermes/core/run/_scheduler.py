"""The Scheduler: claims each due tick of a schedule and emits it if it won the claim.

Any number of schedulers may run on one schedule: they never talk to each
other. Each computes the same ticks (see :mod:`hermes.core.app._schedule`), claims
``tick:<name>@<time>`` on a broker with :class:`SupportsClaim`, and only the
winner emits, so every tick is emitted once however many run and whichever of
them die. The claims are also the schedule's memory: a scheduler that starts
looks back over the catch-up window, and the ticks nobody claimed there are
the missed ones, handled by each entry's :class:`CatchUp` policy. No state is
kept anywhere else.

A tick is claimed before it is emitted, so a scheduler killed between the
two (one broker round trip) loses that tick; the emit is retried on a broker
outage, and a tick that still cannot be emitted is logged at ERROR. So is a
tick whose payload function raised: that tick is lost, and the other entries
and later ticks go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from hermes.core.app._emitter import Emitter
from hermes.core.app._schedule import CatchUp, Entry, Schedule
from hermes.core.model._errors import (
    BrokerUnavailableError,
    HermesError,
    NotSupportedError,
    error_text,
)
from hermes.core.spi._door import translate_errors
from hermes.core.spi._driver import Driver, SupportsClaim
from hermes.core.spi._registry import notify, plugin_manager

#: How far back a scheduler looks for missed ticks, by default.
CATCH_UP_WINDOW_S = 3600.0
#: Missed ticks of one entry handled at most (the newest); older ones are left, with a warning.
MAX_CATCH_UP_TICKS = 100
#: With ``catch_up="none"``, a tick this late is still on time (a scheduler restarting).
ON_TIME_S = 10.0
#: A claim outlives the catch-up window by this much: clocks of two hosts differ a little.
CLAIM_MARGIN_S = 60.0
#: The longest a scheduler sleeps between two looks at its schedule (a clock that jumps).
MAX_SLEEP_S = 1.0
#: Emit attempts of a won tick while the broker is unavailable, and the pause before each retry.
EMIT_RETRIES_S = (0.2, 0.5, 1.0)


def _quiet_child(logger: logging.Logger) -> logging.Logger:
    """A child of ``logger`` at WARNING, for a Scheduler's Emitter.

    The Emitter's own "Emitted message" INFO line would double the tick's. Made
    apart from logging's registry of named loggers, so neither importing this
    module nor making a Scheduler changes a logger the application configures.
    """
    quiet = logging.Logger(f"{logger.name}.emitter", logging.WARNING)
    quiet.parent = logger
    return quiet


class LocalClaims:
    """Claims in this process's memory: for a scheduler that is the only one (``--single``).

    A restarted process remembers nothing, so a scheduler using these does
    not catch up ticks from before it started.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, float] = {}

    def claim(self, key: str, ttl_s: float) -> bool:
        now = time.monotonic()
        with self._lock:
            if self._held.get(key, now) > now:
                return False
            self._held = {k: at for k, at in self._held.items() if at > now}
            self._held[key] = now + ttl_s
            return True

    def __repr__(self) -> str:
        return "<LocalClaims of this process>"


@dataclass
class _Progress:
    """What this scheduler settled of one entry: every tick up to ``cursor``, ``settled`` after."""

    cursor: float
    settled: set[float] = field(default_factory=set)
    warned_older: bool = False


#: What became of a due tick in one scheduler: it emitted it, skipped it by its
#: entry's policy, found it claimed by another scheduler, or won it and could not emit it.
TickOutcome = Literal["emitted", "skipped", "taken", "lost"]


@dataclass(frozen=True, slots=True)
class TickResult:
    """One due tick this scheduler settled, and how."""

    entry: Entry
    at: float
    outcome: TickOutcome
    #: Emitted: seconds between the tick's fire time and the emit.
    late_s: float = 0.0

    @property
    def key(self) -> str:
        return self.entry.tick(self.at).key


class Scheduler:
    """Emits each tick of ``schedule`` on ``driver`` once, with any number of schedulers running.

    ``claims`` is where ticks are claimed: ``driver`` itself when it has
    :class:`~hermes.core.driver.SupportsClaim`, else another broker's driver
    (``hermes scheduler --lock-url``) or :class:`LocalClaims` for a scheduler
    that is the only one. ``catch_up=False`` looks at no tick from before the
    scheduler started (what :class:`LocalClaims` needs). ``clock`` is for tests.
    """

    def __init__(
        self,
        schedule: Schedule | Iterable[Entry],
        driver: Driver,
        *,
        claims: SupportsClaim | None = None,
        catch_up: bool = True,
        catch_up_window_s: float = CATCH_UP_WINDOW_S,
        clock: Callable[[], float] = time.time,
        logger: logging.Logger | None = None,
    ) -> None:
        self.entries = tuple(schedule)
        self.driver = driver
        if claims is None:
            if not isinstance(driver, SupportsClaim):
                raise NotSupportedError(
                    f"{driver!r} cannot claim ticks: run the scheduler with --lock-url naming a "
                    "broker that can (redis://, file://, postgresql://), or --single if it is the "
                    "only one"
                )
            claims = driver
        #: Where ticks are claimed.
        self.claims = claims
        self.catch_up = catch_up
        if not catch_up_window_s > 0:
            raise ValueError(f"catch_up_window_s must be > 0, got {catch_up_window_s!r}")
        self.catch_up_window_s = float(catch_up_window_s)
        self.clock = clock
        self.logger = logger or logging.getLogger("hermes.scheduler")
        self.emitter = Emitter(driver, logger=_quiet_child(self.logger))
        self._hooks = plugin_manager().hook
        self._progress: dict[str, _Progress] = {}
        #: Due ticks settled by this scheduler so far, by outcome.
        self.counts: Counter[str] = Counter()
        #: Entry name -> the time of the last tick this scheduler emitted (its heartbeat shows it).
        self.last_fired: dict[str, float] = {}
        self._stop = threading.Event()
        self._started_at = clock()

    # The loop ----------------------------------------------------------------

    def run(self, stop_when: Callable[[], bool] | None = None) -> None:
        """Fire due ticks until :meth:`stop` (or ``stop_when()`` says so); sleeps between them."""
        self._stop.clear()
        while not self._stop.is_set() and not (stop_when and stop_when()):
            now = self.clock()
            self.run_pending(now)
            wake = self.next_fire_time(now)
            self._stop.wait(max(0.0, min(wake - self.clock(), MAX_SLEEP_S)))

    def stop(self) -> None:
        """Make :meth:`run` return after the tick in progress. Thread-safe."""
        self._stop.set()

    def run_pending(self, now: float | None = None) -> list[TickResult]:
        """Claim and emit every tick due by ``now``; what became of each."""
        now = self.clock() if now is None else now
        results: list[TickResult] = []
        for entry in self.entries:
            try:
                settled = self._run_entry(entry, now)
            except HermesError as exc:
                # The claims broker away: nothing is settled, the next pass tries again.
                self.logger.warning("Periodic entry %s: %s; trying again", entry.name, exc)
                continue
            except Exception as exc:
                # Not the broker's: logged with its traceback; the other entries go on.
                self.logger.error(
                    "Periodic entry %s failed - %s; trying again",
                    entry.name,
                    error_text(exc),
                    exc_info=True,
                )
                continue
            self.counts.update(result.outcome for result in settled)
            results += settled
        return results

    def next_fire_time(self, now: float) -> float:
        """When the first tick after ``now`` of any entry fires (``now`` + 1 s at most)."""
        wake = now + MAX_SLEEP_S
        for entry in self.entries:
            upcoming = entry.next_fire_times(now, 1)
            if upcoming:
                wake = min(wake, upcoming[0])
        return wake

    # One entry -----------------------------------------------------------------

    def _run_entry(self, entry: Entry, now: float) -> list[TickResult]:
        progress = self._progress.get(entry.name)
        if progress is None:
            start = now - self.catch_up_window_s if self.catch_up else self._started_at
            progress = self._progress[entry.name] = _Progress(start)
        # Ticks leave the window as they age: their claims expire then.
        progress.cursor = max(progress.cursor, now - self.catch_up_window_s)
        candidates, count = entry.ticks_between(progress.cursor, now, MAX_CATCH_UP_TICKS)
        if count > len(candidates) and not progress.warned_older:
            progress.warned_older = True
            self.logger.info(
                "Periodic entry %s: looking back over its newest %d ticks, not all %d of the "
                "last %g s",
                entry.name,
                len(candidates),
                count,
                self.catch_up_window_s,
            )
        due = [t for t in candidates if t not in progress.settled and entry.fire_at(t) <= now]
        done = self._settle(entry, due, now) if due else []
        for result in done:
            progress.settled.add(result.at)
        # Move the cursor over every settled tick at its head (jitter can fire them out of order).
        for at in candidates:
            if at not in progress.settled:
                break
            progress.cursor = at
        progress.settled = {t for t in progress.settled if t > progress.cursor}
        return done

    def _settle(self, entry: Entry, due: list[float], now: float) -> list[TickResult]:
        """Claim ``due`` (ascending) as the entry's policy says, and emit what it won."""
        if entry.catch_up is CatchUp.ALL:
            emit, skip = due, []
        else:
            newest = due[-1]
            on_time = now - entry.fire_at(newest) <= ON_TIME_S
            if entry.catch_up is CatchUp.NONE and not on_time:
                emit, skip = [], due
            else:
                emit, skip = [newest], due[:-1]
        results: list[TickResult] = []
        for at in emit:
            if self._claim(entry, at, now):
                results.append(self._emit(entry, at))
            else:
                results.append(TickResult(entry, at, "taken"))
        # Skips are claimed too, newest first: the winner reports each one once.
        skipped: list[float] = []
        for at in reversed(skip):
            if not self._claim(entry, at, now):
                results.append(TickResult(entry, at, "taken"))
                continue
            notify(self._hooks.hermes_tick, entry=entry, tick=entry.tick(at), fired=False)
            results.append(TickResult(entry, at, "skipped"))
            skipped.append(at)
        if skipped:
            why = (
                "one emit stands for them"
                if entry.catch_up is CatchUp.ONCE
                else "catch_up is 'none'"
            )
            first, last = entry.tick(min(skipped)).key, entry.tick(max(skipped)).key
            if len(skipped) == 1:
                self.logger.info("Tick %s skipped: missed, and %s", first, why)
            else:
                self.logger.info(
                    "Ticks %s to %s skipped (%d): missed, and %s", first, last, len(skipped), why
                )
        return results

    def _claim(self, entry: Entry, at: float, now: float) -> bool:
        key = entry.tick(at).key
        # Held until the tick has left every scheduler's catch-up window.
        ttl_s = at + self.catch_up_window_s - now + CLAIM_MARGIN_S
        if isinstance(self.claims, Driver):
            with translate_errors(self.claims, f"claiming tick {key}"):
                won = self.claims.claim(f"tick:{key}", ttl_s)
        else:
            won = self.claims.claim(f"tick:{key}", ttl_s)
        if not won:
            self.logger.debug("Tick %s was claimed by another scheduler", key)
        return won

    def _emit(self, entry: Entry, at: float) -> TickResult:
        tick = entry.tick(at)
        try:
            message = entry.message(at)
        except Exception as exc:
            # The application's payload function: its failure costs this tick, not
            # the scheduler (and with it every other entry and every later tick).
            self.logger.error(
                "Tick %s was claimed and not emitted: the payload function of periodic "
                "entry %s raised %s",
                tick.key,
                entry.name,
                error_text(exc),
                exc_info=True,
            )
            return TickResult(entry, at, "lost")
        for pause_s in (*EMIT_RETRIES_S, None):
            try:
                self.emitter.emit(message, entry.priority)
                break
            except BrokerUnavailableError as exc:
                if pause_s is None:
                    self.logger.error("Tick %s was claimed and not emitted: %s", tick.key, exc)
                    return TickResult(entry, at, "lost")
                self.logger.warning("Tick %s: %s; retrying in %g s", tick.key, exc, pause_s)
                time.sleep(pause_s)
            except HermesError as exc:
                self.logger.error("Tick %s was claimed and not emitted: %s", tick.key, exc)
                return TickResult(entry, at, "lost")
        late_s = max(0.0, self.clock() - entry.fire_at(at))
        self.last_fired[entry.name] = max(at, self.last_fired.get(entry.name, at))
        self.logger.info(
            "Tick %s: emitted message #%s (%s) priority:%s%s",
            tick.key,
            message.id,
            message.type,
            entry.priority,
            f", {late_s:.1f} s late" if late_s >= 1 else "",
        )
        notify(self._hooks.hermes_tick, entry=entry, tick=tick, fired=True)
        return TickResult(entry, at, "emitted", late_s)

    def __repr__(self) -> str:
        return f"<Scheduler {len(self.entries)} entries on {self.driver!r}>"
