"""Periodic entries: their ticks in UTC and in a timezone with daylight saving, keys, jitter."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from hermes.core import ConfigurationError, HandlerRegistry
from hermes.core.schedule import Entry, Schedule, Tick

BRATISLAVA = zoneinfo.ZoneInfo("Europe/Bratislava")


def local(*fields: int, fold: int = 0) -> float:
    return dt.datetime(*fields, tzinfo=BRATISLAVA, fold=fold).timestamp()


def fired_local_times(entry: Entry, after: float, until: float) -> list[str]:
    ticks, _ = entry.ticks_between(after, until, limit=1000)
    return [entry.tick(at).time.isoformat() for at in ticks]


NIGHTLY = Entry(name="nightly", type="report", cron="30 2 * * *", timezone="Europe/Bratislava")


def test_a_0230_entry_runs_once_on_the_spring_forward_day_right_after_the_gap() -> None:
    # 2025-03-30: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that night.
    day = fired_local_times(NIGHTLY, local(2025, 3, 30, 0, 0), local(2025, 3, 30, 23, 59))
    assert day == ["2025-03-30T03:00:00+02:00"]
    around = fired_local_times(NIGHTLY, local(2025, 3, 29, 0, 0), local(2025, 3, 31, 23, 0))
    assert around == [
        "2025-03-29T02:30:00+01:00",
        "2025-03-30T03:00:00+02:00",
        "2025-03-31T02:30:00+02:00",
    ]


def test_a_0230_entry_runs_once_on_the_fall_back_day_at_the_first_0230() -> None:
    # 2025-10-26: 03:00 CEST falls back to 02:00 CET, so 02:30 happens twice.
    day = fired_local_times(NIGHTLY, local(2025, 10, 26, 0, 0), local(2025, 10, 26, 23, 59))
    assert day == ["2025-10-26T02:30:00+02:00"]


def test_a_scheduler_starting_in_the_repeated_hour_does_not_fire_the_0230_again() -> None:
    second_0215 = local(2025, 10, 26, 2, 15, fold=1)  # after the first 02:30 had fired
    assert fired_local_times(NIGHTLY, second_0215, local(2025, 10, 26, 23, 59)) == []


def test_a_wildcard_entry_ticks_through_the_repeated_hour_by_elapsed_time() -> None:
    half_hourly = Entry(name="half", type="t", cron="*/30 * * * *", timezone="Europe/Bratislava")
    times = fired_local_times(half_hourly, local(2025, 10, 26, 1, 45), local(2025, 10, 26, 3, 15))
    assert times == [
        "2025-10-26T02:00:00+02:00",
        "2025-10-26T02:30:00+02:00",
        "2025-10-26T02:00:00+01:00",
        "2025-10-26T02:30:00+01:00",
        "2025-10-26T03:00:00+01:00",
    ]


def test_every_tick_key_is_distinct_across_both_transitions() -> None:
    half_hourly = Entry(name="h", type="t", cron="*/30 * * * *", timezone="Europe/Bratislava")
    for start in (local(2025, 3, 29, 12, 0), local(2025, 10, 25, 12, 0)):
        ticks, count = half_hourly.ticks_between(start, start + 86400, limit=1000)
        keys = {half_hourly.tick(at).key for at in ticks}
        assert len(keys) == count == len(ticks)


def test_an_interval_ticks_at_its_multiples_since_the_epoch_whenever_it_is_asked() -> None:
    entry = Entry(name="i", type="t", interval_s=5)
    assert entry.ticks_between(100.5, 121, limit=10) == ([105, 110, 115, 120], 4)
    assert entry.ticks_between(100.5, 121, limit=2) == ([115, 120], 4)
    assert entry.next_fire_times(100, 3) == [105, 110, 115]


def test_the_tick_key_is_the_name_and_the_utc_time() -> None:
    tick = Tick("nightly", local(2025, 3, 30, 3, 0), BRATISLAVA)
    assert tick.key == "nightly@2025-03-30T01:00:00Z"
    assert tick.time.isoformat() == "2025-03-30T03:00:00+02:00"
    assert Tick("i", 1.5).key == "i@1970-01-01T00:00:01.500Z"


def test_jitter_delays_a_tick_by_the_same_amount_in_every_scheduler() -> None:
    entry = Entry(name="j", type="t", interval_s=60, jitter_s=10)
    copy = Entry(name="j", type="t", interval_s=60, jitter_s=10)
    delays = [entry.fire_at(at) - at for at in range(0, 6000, 60)]
    assert delays == [copy.fire_at(at) - at for at in range(0, 6000, 60)]
    assert all(0 <= d < 10 for d in delays) and len(set(delays)) > 50


def test_a_tick_message_has_the_same_id_everywhere_and_a_payload_function_sees_the_tick() -> None:
    entry = Entry(
        name="p",
        type="t",
        interval_s=60,
        payload=lambda tick: {"day": tick.time.date().isoformat()},
    )
    first, again = entry.message(86400.0), entry.message(86400.0)
    assert first.id == again.id != entry.message(86460.0).id
    assert first.payload == {"day": "1970-01-02"}


def test_a_registry_declares_entries_beside_its_handlers() -> None:
    handlers = HandlerRegistry()

    @handlers.handler("report")
    def report(message: object) -> None: ...

    handlers.every(minutes=5, type="report", name="often")
    handlers.cron("0 3 * * *", type="report", name="nightly", timezone="Europe/Bratislava")
    assert [entry.name for entry in handlers.schedule] == ["often", "nightly"]
    assert handlers.schedule.entries[0].interval_s == 300


@pytest.mark.parametrize(
    ("declare", "says"),
    [
        (lambda s: s.cron("61 * * * *", type="t"), "bad cron expression '61 * * * *'"),
        (lambda s: s.cron("* * *", type="t"), "bad cron expression"),
        (lambda s: s.cron("0 0 30 2 *", type="t"), "'0 0 30 2 *'"),
        (lambda s: s.cron("0 3 * * *", type="t", timezone="Europe/Bratislav"), "unknown timezone"),
        (lambda s: s.every(seconds=0.5, type="t"), "at least 1 s"),
        (lambda s: s.every(seconds=5, type="t", catch_up="sometimes"), "catch_up must be"),
        (lambda s: s.every(seconds=5, type="t", payload="text"), "payload"),
        (lambda s: s.every(seconds=5, type="t", name="a@b"), "without '@'"),
    ],
)
def test_a_declaration_mistake_is_a_configuration_error_that_names_it(declare, says) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError) as caught:
        declare(Schedule())
    assert says in str(caught.value)


def test_two_entries_of_one_name_are_refused() -> None:
    schedule = Schedule()
    schedule.every(seconds=5, type="t")
    with pytest.raises(ConfigurationError, match="two periodic entries are named 't'"):
        schedule.every(seconds=10, type="t")
