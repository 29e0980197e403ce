"""The delay-queue buckets: rounded down, few, capped."""

from __future__ import annotations

import pytest

from hermes.drivers.rabbitmq._delay import (
    EVERY_BUCKET_MS,
    EXPIRY_MARGIN_MS,
    MAX_BUCKET_MS,
    bucket_ms,
    delay_queue_arguments,
)


@pytest.mark.parametrize(
    ("delay_s", "expected_ms"),
    [
        (-5.0, 0),
        (0.0, 0),
        (0.0009, 0),
        (0.001, 1),
        (0.099, 99),
        (0.1234, 120),
        (1.99, 1900),
        (16.7, 16000),
        (45.999, 45000),
        (3600.5, 3600000),
        (10**9, MAX_BUCKET_MS),
    ],
)
def test_a_delay_goes_to_the_bucket_below_it_with_two_significant_digits(
    delay_s: float, expected_ms: int
) -> None:
    assert bucket_ms(delay_s) == expected_ms


def test_a_bucket_is_never_above_the_delay_and_leaves_at_most_a_tenth() -> None:
    for ms in range(1, 200_000, 7):
        bucket = bucket_ms(ms / 1000)
        assert bucket <= ms
        assert ms - bucket <= ms / 10


def test_the_retry_backoff_range_needs_at_most_thirty_delay_queues() -> None:
    buckets = {bucket_ms(s / 10) for s in range(160, 460)}
    assert len(buckets) <= 30


def test_a_delay_queue_dead_letters_to_its_work_queue_and_outlives_its_ttl() -> None:
    arguments = delay_queue_arguments("jobs", 1900)
    assert arguments["x-dead-letter-exchange"] == ""
    assert arguments["x-dead-letter-routing-key"] == "jobs"
    assert arguments["x-message-ttl"] == 1900
    assert arguments["x-expires"] == 1900 + EXPIRY_MARGIN_MS
    assert delay_queue_arguments("jobs", MAX_BUCKET_MS)["x-expires"] < 2**31


def test_every_bucket_lists_each_ttl_a_delay_can_get_once_in_order() -> None:
    assert list(EVERY_BUCKET_MS) == sorted(set(EVERY_BUCKET_MS))
    assert (EVERY_BUCKET_MS[0], EVERY_BUCKET_MS[-1]) == (1, MAX_BUCKET_MS)
    every = set(EVERY_BUCKET_MS)
    for exponent in range(-3, 7):
        for mantissa in range(100, 1000, 7):
            assert bucket_ms(mantissa * 10.0**exponent / 100) in every | {0}
    assert {bucket_ms(ms / 1000) for ms in range(1, 1000)} <= every
