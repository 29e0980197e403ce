"""The reconnect backoff: jittered doubling, capped, on its own random generator."""

from __future__ import annotations

import random

from hermes.core.run._worker import Backoff


def test_each_wait_is_half_to_all_of_the_doubled_delay_up_to_the_cap() -> None:
    backoff = Backoff(first_s=0.1, cap_s=1.0)
    for full in (0.1, 0.2, 0.4, 0.8, 1.0, 1.0):
        wait = backoff.next_delay_s()
        assert 0.5 * full <= wait <= full, (wait, full)


def test_reset_returns_the_failures_and_starts_again_from_the_first_delay() -> None:
    backoff = Backoff(first_s=0.1, cap_s=5.0)
    for _ in range(4):
        backoff.next_delay_s()
    assert backoff.reset() == 4
    assert backoff.next_delay_s() <= 0.1


def test_waits_leave_the_applications_global_random_sequence_alone() -> None:
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    backoff = Backoff()
    for _ in range(5):
        backoff.next_delay_s()
    assert [random.random() for _ in range(3)] == expected
