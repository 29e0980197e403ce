"""Heartbeats (``SupportsHeartbeats``): what ``hermes workers`` and the dashboard list.

For a driver that has ``beat``, ``forget`` and ``heartbeats``: a record
beaten is listed as it was written, by any driver object on the same URL;
the next beat of the same id replaces it; ``forget`` removes one record at
once and no other; and a record not renewed is gone after its ttl (within
a second of expiry precision) but not before. A driver without them is
reported as not verified: its workers need ``--registry-url``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from hermes.conformance._harness import Kit, wait_until
from hermes.core.driver import Driver, SupportsHeartbeats

#: The ttl of the expiry check, and how much expiry may lag behind it.
_TTL_S = 1.5
_PRECISION_S = 1.0


def _heartbeats(driver: Driver) -> SupportsHeartbeats:
    if not isinstance(driver, SupportsHeartbeats):
        pytest.skip(
            "not verified: the driver has no beat()/heartbeats(); its workers need --registry-url"
        )
    return driver


def _record(name: str, **fields: Any) -> dict[str, Any]:
    """A record shaped like a worker's, with values of every JSON kind."""
    return {
        "id": f"kit-host:{name}:{uuid.uuid4().hex[:6]}",
        "kind": "worker",
        "host": "kit-host",
        "pid": 4242,
        "started": 1767225600.5,
        "priorities": [200, 100],
        "url": "redis://:***@kit:6379/0",
        "in_flight": [{"type": "kit.job", "id": "42", "since": 1767225601.25}],
        "note": "ünïcode <b>&",
        "stopped": None,
        "busy": True,
        **fields,
    }


def _by_id(registry: SupportsHeartbeats) -> dict[str, dict[str, Any]]:
    records = registry.heartbeats()
    assert isinstance(records, list), f"heartbeats() returned {type(records).__name__}, not list"
    return {record["id"]: record for record in records}


@pytest.mark.hermes_check("heartbeats", "listed as written, replaced, forgotten")
def test_a_beat_is_listed_as_written_replaced_by_the_next_and_forgotten_alone(
    hermes_kit: Kit,
) -> None:
    writer = _heartbeats(hermes_kit.driver())
    reader = _heartbeats(hermes_kit.driver())
    one, two = _record("one"), _record("two", handled=1)
    writer.beat(one, 60.0)
    writer.beat(two, 60.0)
    listed = _by_id(reader)
    assert listed.get(one["id"]) == one, f"another driver object lists {listed.get(one['id'])!r}"
    assert listed.get(two["id"]) == two, f"another driver object lists {listed.get(two['id'])!r}"
    renewed = {**two, "handled": 2, "in_flight": []}
    writer.beat(renewed, 60.0)
    listed = _by_id(reader)
    assert listed.get(two["id"]) == renewed, "a second beat of one id did not replace the first"
    assert len(listed) == 2, f"two workers beat, {len(listed)} records are listed: {listed}"
    reader.forget(two["id"])
    listed = _by_id(writer)
    assert two["id"] not in listed, "a forgotten record is still listed"
    assert one["id"] in listed, "forget() of one worker removed another's record"
    writer.forget("kit-host:never-beat:000000")  # nothing to forget: no error
    writer.forget(one["id"])
    assert _by_id(reader) == {}, "records are listed after every one was forgotten"
    hermes_kit.claim("listed as written by another driver object, replaced, forgotten alone")


@pytest.mark.hermes_check("heartbeats", "gone after its ttl, not before")
def test_a_record_not_renewed_is_listed_until_its_ttl_and_gone_after_it(hermes_kit: Kit) -> None:
    registry = _heartbeats(hermes_kit.driver())
    record = _record("expiring")
    kept = _record("renewed")
    beaten_at = time.monotonic()
    registry.beat(record, _TTL_S)
    registry.beat(kept, 60.0)
    while time.monotonic() - beaten_at < _TTL_S * 0.8:
        elapsed = time.monotonic() - beaten_at
        assert record["id"] in _by_id(registry), (
            f"a record beaten with ttl {_TTL_S} s was gone {elapsed:.2f} s later"
        )
        time.sleep(0.05)
    gone = wait_until(lambda: record["id"] not in _by_id(registry), _TTL_S + _PRECISION_S)
    elapsed = time.monotonic() - beaten_at
    assert gone, f"a record beaten with ttl {_TTL_S} s was still listed {elapsed:.1f} s later"
    assert kept["id"] in _by_id(registry), "the expiry of one record removed another"
    registry.forget(kept["id"])
    hermes_kit.claim(f"listed for its {_TTL_S:g} s ttl, then gone within {_PRECISION_S:g} s")
