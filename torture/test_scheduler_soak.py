"""The scheduler soak's quick run (~25 s): every tick once, on time, while schedulers die."""

from __future__ import annotations

from pathlib import Path

from torture import scheduler_soak


def test_six_schedulers_with_one_killed_every_few_seconds_emit_each_tick_once_on_time(
    tmp_path: Path, redis_url: str
) -> None:
    verdicts = scheduler_soak.soak(20.0, 7.0, tmp_path, redis_url=redis_url)
    assert [v.target for v in verdicts] == ["redis", "filesystem"]
    for verdict in verdicts:
        assert verdict.ok, scheduler_soak.table(verdicts, 20.0)
        assert verdict.expected >= 12 and verdict.kills >= 1
