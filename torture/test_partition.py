"""The quick partition run (CI's): Redis, one 5 s silent broker, under 40 s.

The full run is ``python -m torture.partition`` (every driver, three 20 s
partitions in 3 minutes); this one holds the same rules on one driver.
"""

from __future__ import annotations

import os

import hermes_test_services as services
import pytest

from torture import partition

#: A slot of its own (10.200.0.240/30), clear of the full run's 0-4.
QUICK_SLOT = 60


def test_a_worker_and_an_emitter_ride_out_a_silent_redis() -> None:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    services.ensure_netns_tools()
    problem = partition.ip_netns_problem()
    if problem:
        pytest.skip(problem)
    outcome = partition.partition_run(
        "redis",
        QUICK_SLOT,
        partitions=1,
        partition_s=5.0,
        run_s=15.0,
        extra_options=partition.QUICK_OPTIONS,
        bounds=partition.QUICK_BOUNDS,
    )
    print(partition.table([outcome]))
    assert outcome.worker_kept, outcome.notes
    assert outcome.unexpected == 0, outcome.notes
    assert outcome.lost <= 1, outcome.notes
    assert outcome.handled > 0 and outcome.sent > 0, outcome.notes
    detected = outcome.detected_s[0]
    assert detected is not None and detected <= outcome.detect_bound_s, outcome.notes
    assert outcome.longest_emit_s <= outcome.emit_bound_s, outcome.notes
    assert outcome.ok, outcome.notes
