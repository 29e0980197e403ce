"""Claims (``SupportsClaim``): what every periodic tick and unique emit relies on.

For a driver that has ``claim(key, ttl_s)``: among many concurrent
claimers of one key -- threads sharing a driver, threads with a driver
each, worker processes -- exactly one wins; a won key is not won again
before its ttl; and it can be won again once the ttl is over (within a
second of expiry precision). A driver without it is reported as not
verified: the scheduler then needs ``--lock-url``.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections import Counter

import pytest

from hermes.conformance._harness import Kit, scaled, wait_until
from hermes.core.driver import Driver, SupportsClaim

#: Keys each concurrency check races on; one winner each.
_KEYS = 5
#: Claimers per key in the thread checks.
_THREADS = 16
#: Claimer processes per key.
_PROCESSES = 4
#: The ttl of the expiry check, and how much expiry may lag behind it.
_TTL_S = 1.5
_PRECISION_S = 1.0


def _claims(driver: Driver) -> SupportsClaim:
    if not isinstance(driver, SupportsClaim):
        pytest.skip("not verified: the driver has no claim(); hermes scheduler needs --lock-url")
    return driver


def _race(claimers: list[SupportsClaim], key: str) -> int:
    """How many of ``claimers``, started together on threads, won ``key``."""
    barrier = threading.Barrier(len(claimers))
    wins: list[bool] = []
    errors: list[BaseException] = []

    def claim(claimer: SupportsClaim) -> None:
        try:
            barrier.wait()
            wins.append(claimer.claim(key, 60.0))
        except BaseException as exc:  # reported below, with the key it happened on
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(c,)) for c in claimers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, f"claim({key!r}) raised {errors[0]!r}"
    return sum(wins)


@pytest.mark.hermes_check("claims", "one winner among threads")
def test_one_of_sixteen_threads_claiming_one_key_at_once_wins(hermes_kit: Kit) -> None:
    shared = _claims(hermes_kit.driver())
    own = [_claims(hermes_kit.driver()) for _ in range(_THREADS)]
    for n in range(_KEYS):
        wins = _race([shared] * _THREADS, f"kit:shared-{n}")
        assert wins == 1, f"{_THREADS} threads sharing one driver: {wins} won key {n}, not 1"
        wins = _race(own, f"kit:own-{n}")
        assert wins == 1, f"{_THREADS} threads with a driver each: {wins} won key {n}, not 1"
    hermes_kit.claim("one winner among 16 threads, on one driver and on a driver each")


_CLAIMER = textwrap.dedent(
    """
    import json, sys, time
    from hermes.core import connect
    url, start, keys = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    driver = connect(url)
    while time.time() < start:
        time.sleep(0.001)
    print(json.dumps([driver.claim(f"kit:process-{n}", 60.0) for n in range(keys)]))
    """
)


@pytest.mark.hermes_check("claims", "one winner among processes")
def test_one_of_four_processes_claiming_the_same_keys_at_once_wins_each(hermes_kit: Kit) -> None:
    _claims(hermes_kit.driver())
    hermes_kit.require_cross_process()
    start = time.time() + scaled(3.0)  # every process imported and connected by then
    processes = [
        hermes_kit.python(_CLAIMER, hermes_kit.url, repr(start), str(_KEYS))
        for _ in range(_PROCESSES)
    ]
    wins: Counter[int] = Counter()
    for process in processes:
        out, err = process.communicate(timeout=scaled(30.0))
        assert process.returncode == 0, f"a claimer process failed: {err.strip()[-500:]}"
        for n, won in enumerate(json.loads(out)):
            wins[n] += bool(won)
    assert all(wins[n] == 1 for n in range(_KEYS)), (
        f"{_PROCESSES} processes claiming {_KEYS} keys at once: winners per key "
        f"{[wins[n] for n in range(_KEYS)]}, not one each"
    )
    hermes_kit.claim(f"one winner among {_PROCESSES} processes")


@pytest.mark.hermes_check("claims", "held for its ttl, then free")
def test_a_claim_is_not_won_again_before_its_ttl_and_is_after_it(hermes_kit: Kit) -> None:
    driver = _claims(hermes_kit.driver())
    other = _claims(hermes_kit.driver())
    won_at = time.monotonic()
    assert driver.claim("kit:ttl", _TTL_S), "the first claim of a new key was not won"
    assert not other.claim("kit:ttl", _TTL_S), "a claim was won twice at once"
    # Not again before its ttl: ask until shortly before it ends.
    while time.monotonic() - won_at < _TTL_S * 0.8:
        assert not other.claim("kit:ttl", _TTL_S), (
            f"claim('kit:ttl', {_TTL_S}) was won again {time.monotonic() - won_at:.2f} s later"
        )
        time.sleep(0.05)
    free = wait_until(lambda: other.claim("kit:ttl", _TTL_S), _TTL_S + _PRECISION_S)
    elapsed = time.monotonic() - won_at
    assert free, f"claim('kit:ttl', {_TTL_S}) could not be won again {elapsed:.1f} s later"
    assert elapsed >= _TTL_S * 0.8, (
        f"claim('kit:ttl', {_TTL_S}) was won again after {elapsed:.2f} s, before its ttl ran out"
    )
    assert not driver.claim("kit:ttl", _TTL_S), "the claim won after expiry was won twice"
    assert driver.claim("kit:other", _TTL_S), "a second key was taken by the first one's claim"
    hermes_kit.claim(f"held for {_TTL_S:g} s, then free within {_PRECISION_S:g} s")
