"""Job records (``SupportsRecords``): what ``--results-url``, ``hermes jobs`` and results rely on.

For a driver that has ``record_get``, ``record_put``, ``record_wait`` and
``record_scan``: a put is a compare-and-set on the exact bytes stored (None:
nothing stored), and a get returns exactly the bytes written, to any driver
object on the same URL; concurrent read-modify-write rounds through it lose
no update, among threads and among processes; a record is kept for its ttl
after each write and is gone after it (within a second of expiry
precision), after which it counts as absent; a wait is woken by a write,
well before its timeout, and otherwise returns the unchanged bytes at its
timeout; a scan lists the live records of the namespace and no expired one.
A driver without them is reported as not verified: it cannot be a results
store. A driver that also has ``record_wait_any`` (``SupportsRecordWatch``,
how a worker hears of a cancel for any of the jobs it runs) is woken by a
write to any of the keys it waits on and returns exactly those that changed.
A driver that also has ``record_page`` (``SupportsRecordPages``, how
``hermes jobs`` and the dashboard page through records) lists every record
exactly once, newest first and oldest first, while records are created and
rewritten between its pages, within its limit and its bytes.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Generic, TypeVar

import pytest

from hermes.conformance._harness import (
    CLOSE_S,
    EARLY_TOLERANCE_S,
    Kit,
    call_within,
    namespace_for,
    scaled,
    stays_false,
    wait_until,
)
from hermes.core import connect
from hermes.core.driver import (
    BrowsePage,
    Driver,
    SupportsRecordPages,
    SupportsRecords,
    SupportsRecordWatch,
    SupportsTeardown,
)
from hermes.core.drivertools import isolated_url

T = TypeVar("T")

#: The ttl of records meant to outlive their test (teardown removes them).
_KEPT_S = 60.0
#: The ttl of the expiry checks, and how much expiry may lag behind it (both scaled).
_TTL_S = 1.5
_PRECISION_S = 1.0
#: Threads racing read-modify-write rounds on one counter, and rounds each.
_THREADS = 16
_INCREMENTS = 10
#: Processes racing on new keys and on one counter.
_PROCESSES = 4
_KEYS = 5
#: A wait is woken within this (scaled) of a write; its own timeout is far longer.
_WAKE_S = 2.0
_WAIT_TIMEOUT_S = 30.0
#: The timeout of a wait that nothing wakes.
_IDLE_WAIT_S = 1.0


def _records(driver: Driver) -> SupportsRecords:
    if not isinstance(driver, SupportsRecords):
        pytest.skip(
            "not verified: the driver has no record_get()/record_put(); "
            "it cannot keep job records (--results-url)"
        )
    return driver


def _document(state: str, size: int = 0) -> bytes:
    """Bytes of a record as a store must keep them: key order, spacing, a newline, unicode."""
    text = json.dumps(
        {"state": state, "id": "42", "note": "ünïcode <b>& \u2603 \U0001f600", "pad": "x" * size},
        indent=1,
        ensure_ascii=False,
    )
    return f" {text}\n".encode()


def _get(store: SupportsRecords, key: str) -> bytes | None:
    value = store.record_get(key)
    assert value is None or type(value) is bytes, (
        f"record_get({key!r}) returned {type(value).__name__}, not bytes"
    )
    return value


@pytest.mark.hermes_check("records", "compare-and-set on the exact bytes", new=True)
def test_a_put_writes_only_over_the_bytes_it_expects_and_a_get_returns_them_exactly(
    hermes_kit: Kit,
) -> None:
    writer = _records(hermes_kit.driver())
    reader = _records(hermes_kit.driver())
    key = "job:kit-cas"
    first, second = _document("waiting", 16 * 1024), _document("running")
    assert _get(reader, key) is None, f"record_get({key!r}) of a key never written is not None"
    assert writer.record_put(key, first, _KEPT_S, None), "a put expecting no record was refused"
    got = _get(reader, key)
    assert got == first, (
        f"another driver object reads {got[:80] if got else got!r}..., not the bytes written"
    )
    assert not reader.record_put(key, second, _KEPT_S, None), (
        "a put expecting no record wrote over the one stored"
    )
    assert not reader.record_put(key, second, _KEPT_S, _document("stale")), (
        "a put expecting other bytes than those stored wrote over them"
    )
    assert not reader.record_put(key, second, _KEPT_S, first[:-1]), (
        "a put expecting a prefix of the stored bytes wrote over them"
    )
    got = _get(writer, key)
    assert got == first, f"refused puts changed the record to {got[:80] if got else got!r}"
    assert reader.record_put(key, second, _KEPT_S, first), (
        "a put expecting exactly the stored bytes was refused"
    )
    got = _get(writer, key)
    assert got == second, f"after a written put another driver object reads {got!r}"
    assert _get(writer, "job:kit-other") is None, "a put wrote a key it was not given"
    hermes_kit.claim("written over None and over exactly the stored bytes only; read back exactly")


def _add_one(store: SupportsRecords, key: str, limit: int) -> int:
    """One read-modify-write round, again on a conflict; how many puts were refused."""
    for refused in range(limit):
        seen = store.record_get(key)
        value = int(seen) + 1 if seen is not None else 1
        if store.record_put(key, str(value).encode(), _KEPT_S, seen):
            return refused
    raise AssertionError(
        f"a compare-and-set on {key!r} was refused {limit} times in a row, although "
        "each refusal means another write succeeded and fewer were made"
    )


@pytest.mark.hermes_check("records", "no lost update among threads", new=True)
def test_sixteen_threads_counting_by_compare_and_set_lose_no_update(hermes_kit: Kit) -> None:
    shared = _records(hermes_kit.driver())
    # Half share one driver object, half have one each.
    stores = [shared] * (_THREADS // 2) + [
        _records(hermes_kit.driver()) for _ in range(_THREADS - _THREADS // 2)
    ]
    key = "job:kit-counter"
    total = _THREADS * _INCREMENTS
    barrier = threading.Barrier(_THREADS)
    refusals: list[int] = []
    errors: list[BaseException] = []

    def count(store: SupportsRecords) -> None:
        try:
            barrier.wait()
            for _ in range(_INCREMENTS):
                refusals.append(_add_one(store, key, total + 1))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=count, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, f"a counting thread failed: {errors[0]}"
    stored = _get(shared, key)
    counted = int(stored) if stored is not None else 0
    assert counted == total, (
        f"{_THREADS} threads each added 1 {_INCREMENTS} times by compare-and-set: the count "
        f"is {counted}, not {total}: {total - counted} updates were lost, although every "
        "put that wrote them said it did"
    )
    hermes_kit.report(f"{total} increments, {sum(refusals)} puts refused and retried")
    hermes_kit.claim(f"{_THREADS} threads, {total} increments, none lost")


_RACER = """
import json, os, sys, time
from hermes.core import connect
url, start, keys, increments = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = connect(url)
me = f"process-{os.getpid()}".encode()
while time.time() < start:
    time.sleep(0.001)
won = [store.record_put(f"job:kit-process-{n}", me, 60.0, None) for n in range(keys)]
for _ in range(increments):
    for _ in range(1000):
        seen = store.record_get("job:kit-process-counter")
        value = str(int(seen) + 1 if seen is not None else 1).encode()
        if store.record_put("job:kit-process-counter", value, 60.0, seen):
            break
    else:
        sys.exit("a compare-and-set was refused 1000 times in a row")
print(json.dumps({"me": me.decode(), "won": won}))
"""


@pytest.mark.hermes_check("records", "one winner among processes", new=True)
def test_of_four_processes_writing_new_keys_at_once_one_wins_each_and_none_loses_an_update(
    hermes_kit: Kit,
) -> None:
    store = _records(hermes_kit.driver())
    hermes_kit.require_cross_process()
    start = time.time() + scaled(3.0)  # every process imported and connected by then
    processes = [
        hermes_kit.python(_RACER, hermes_kit.url, repr(start), str(_KEYS), str(_INCREMENTS))
        for _ in range(_PROCESSES)
    ]
    winners: dict[int, list[str]] = {n: [] for n in range(_KEYS)}
    for process in processes:
        out, err = process.communicate(timeout=scaled(30.0))
        assert process.returncode == 0, f"a writer process failed: {err.strip()[-500:]}"
        said = json.loads(out)
        for n, won in enumerate(said["won"]):
            if won:
                winners[n].append(said["me"])
    counts = [len(winners[n]) for n in range(_KEYS)]
    assert counts == [1] * _KEYS, (
        f"{_PROCESSES} processes putting {_KEYS} new keys at once, each expecting none: "
        f"winners per key {counts}, not one each"
    )
    for n, (winner,) in winners.items():
        got = _get(store, f"job:kit-process-{n}")
        assert got == winner.encode(), f"key {n} was won by {winner} but holds {got!r}"
    stored = _get(store, "job:kit-process-counter")
    total = _PROCESSES * _INCREMENTS
    assert stored == str(total).encode(), (
        f"{_PROCESSES} processes each added 1 {_INCREMENTS} times by compare-and-set: "
        f"the count is {stored!r}, not {total}"
    )
    hermes_kit.claim(f"one winner among {_PROCESSES} processes; {total} increments, none lost")


def _until(deadline: float, predicate: Callable[[], object]) -> bool:
    """``wait_until`` to an absolute ``time.monotonic()`` deadline."""
    return wait_until(predicate, max(0.0, deadline - time.monotonic()), scale=False)


@pytest.mark.hermes_check("records", "kept for its ttl after each write, then gone", new=True)
def test_a_record_is_kept_for_its_ttl_after_each_write_and_is_absent_after_it(
    hermes_kit: Kit,
) -> None:
    store = _records(hermes_kit.driver())
    ttl, precision = scaled(_TTL_S), scaled(_PRECISION_S)
    old, kept, renewed = _document("waiting"), _document("scheduled"), _document("running")
    written_at = time.monotonic()
    assert store.record_put("job:kit-expiring", old, ttl, None), "a put of a new key was refused"
    assert store.record_put("job:kit-renewed", kept, ttl, None), "a put of a new key was refused"
    # Both there until halfway through the ttl, when one is written again ...
    while time.monotonic() < written_at + ttl * 0.5:
        for key, value in (("job:kit-expiring", old), ("job:kit-renewed", kept)):
            elapsed = time.monotonic() - written_at
            assert _get(store, key) == value, (
                f"a record written with ttl {ttl:.2f} s was gone {elapsed:.2f} s later"
            )
        time.sleep(0.05)
    assert store.record_put("job:kit-renewed", renewed, ttl, kept), (
        "a put expecting the stored bytes was refused"
    )
    renewed_at = time.monotonic()
    # ... which is kept until shortly before its new ttl ends, the other until its own.
    while (now := time.monotonic()) < renewed_at + ttl * 0.8:
        if now < written_at + ttl * 0.8:
            assert _get(store, "job:kit-expiring") == old, (
                f"a record written with ttl {ttl:.2f} s was gone {now - written_at:.2f} s later"
            )
        assert _get(store, "job:kit-renewed") == renewed, (
            f"a record written again {renewed_at - written_at:.2f} s after its first write, "
            f"both with ttl {ttl:.2f} s, was gone {now - written_at:.2f} s after the first: "
            "the second write did not restart its ttl"
        )
        time.sleep(0.05)
    gone = _until(written_at + ttl + precision, lambda: _get(store, "job:kit-expiring") is None)
    elapsed = time.monotonic() - written_at
    assert gone, f"a record written with ttl {ttl:.2f} s was still stored {elapsed:.1f} s later"
    gone = _until(renewed_at + ttl + precision, lambda: _get(store, "job:kit-renewed") is None)
    elapsed = time.monotonic() - renewed_at
    assert gone, (
        f"a record written again with ttl {ttl:.2f} s was still stored {elapsed:.1f} s later"
    )
    # An expired record counts as absent: a put expecting it is refused, one expecting none writes.
    assert not store.record_put("job:kit-expiring", renewed, _KEPT_S, old), (
        "a put expecting the bytes of an expired record wrote"
    )
    assert store.record_put("job:kit-expiring", renewed, _KEPT_S, None), (
        "a put expecting no record was refused where the record had expired"
    )
    hermes_kit.claim(
        f"kept for its {_TTL_S:g} s ttl after each write, then gone within {_PRECISION_S:g} s"
    )


class _InThread(Generic[T]):
    """A blocking call on a daemon thread of its own: what it returned or raised, and when."""

    def __init__(self, call: Callable[[], T], name: str) -> None:
        self.name = name
        self.returned: list[T] = []
        self.errors: list[BaseException] = []
        self.started = time.monotonic()
        self.ended = 0.0
        # Daemon: a wait that never returns is left behind.
        threading.Thread(target=self._run, args=(call,), name=f"kit: {name}", daemon=True).start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            value = call()
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
        else:
            self.returned.append(value)
        self.ended = time.monotonic()

    def done(self) -> bool:
        return bool(self.returned or self.errors)

    def value(self) -> T:
        assert not self.errors, f"{self.name} raised {self.errors[0]!r}"
        return self.returned[0]


def _waiting(
    store: SupportsRecords, key: str, seen: bytes | None, timeout_s: float
) -> _InThread[bytes | None]:
    """``record_wait`` on a thread of its own."""
    return _InThread(lambda: store.record_wait(key, seen, timeout_s), "record_wait")


@pytest.mark.hermes_check("records", "a wait is woken by a write", new=True)
def test_a_wait_returns_the_new_bytes_soon_after_another_driver_object_writes_them(
    hermes_kit: Kit,
) -> None:
    store = _records(hermes_kit.driver())
    writer = _records(hermes_kit.driver())
    key, first, second = "job:kit-wait", _document("running"), _document("succeeded")
    assert writer.record_put(key, first, _KEPT_S, None), "a put of a new key was refused"
    timeout_s = scaled(_WAIT_TIMEOUT_S)
    waiter = _waiting(store, key, first, timeout_s)
    assert stays_false(waiter.done, 0.5), (
        f"record_wait(seen=the stored bytes) returned {waiter.returned or waiter.errors} after "
        f"{waiter.ended - waiter.started:.2f} s, with nothing written and a {timeout_s:g} s timeout"
    )
    assert writer.record_put(key, second, _KEPT_S, first), "a put expecting the stored bytes failed"
    written_at = time.monotonic()
    woken = wait_until(waiter.done, _WAKE_S)
    assert woken, (
        f"record_wait did not return within {scaled(_WAKE_S):g} s of another driver object's "
        f"write (its timeout: {timeout_s:g} s): it is not woken by writes"
    )
    assert waiter.value() == second, f"a woken record_wait returned {waiter.value()!r}"
    hermes_kit.report(f"woken {waiter.ended - written_at:.3f} s after the write")
    # Bytes that differ already are returned at once.
    stale = _waiting(store, key, first, timeout_s)
    assert wait_until(stale.done, _WAKE_S), (
        f"record_wait with stale seen bytes did not return within {scaled(_WAKE_S):g} s "
        f"(its timeout: {timeout_s:g} s)"
    )
    assert stale.value() == second, f"record_wait with stale seen bytes returned {stale.value()!r}"
    hermes_kit.claim(f"woken by another driver object's write within {_WAKE_S:g} s")


def _write_other_keys(store: SupportsRecords, stop: threading.Event) -> None:
    """Write other keys every 0.1 s until ``stop``: they must wake no wait on this one."""
    for n in range(1000):
        if stop.wait(0.1):
            return
        store.record_put(f"job:kit-other-{n}", b"{}", _KEPT_S, None)


@pytest.mark.hermes_check("records", "a wait unwoken returns at its timeout", new=True)
def test_a_wait_that_nothing_changes_returns_the_unchanged_bytes_at_its_timeout(
    hermes_kit: Kit,
) -> None:
    store = _records(hermes_kit.driver())
    writer = _records(hermes_kit.driver())
    key, stored = "job:kit-idle", _document("running")
    assert writer.record_put(key, stored, _KEPT_S, None), "a put of a new key was refused"
    timeout_s = scaled(_IDLE_WAIT_S)
    for seen, what in ((stored, "the stored bytes"), (None, "None, on a key never written")):
        waited = key if seen is not None else "job:kit-never"
        stop = threading.Event()
        writing = threading.Thread(
            target=_write_other_keys, args=(writer, stop), name="kit: other writes", daemon=True
        )
        writing.start()
        try:
            waiter = _waiting(store, waited, seen, timeout_s)
            returned = wait_until(waiter.done, _IDLE_WAIT_S + _WAKE_S)
        finally:
            stop.set()
        assert returned, (
            f"record_wait(seen={what}, timeout_s={timeout_s:g}) did not return within "
            f"{scaled(_IDLE_WAIT_S + _WAKE_S):g} s"
        )
        value, took = waiter.value(), waiter.ended - waiter.started
        assert value == seen, f"record_wait(seen={what}) returned {value!r}, unchanged"
        assert took >= timeout_s - EARLY_TOLERANCE_S, (
            f"record_wait(seen={what}, timeout_s={timeout_s:g}) returned after {took:.2f} s, "
            "before its timeout, with the record unchanged: a caller would spin"
        )
    hermes_kit.claim(f"the unchanged bytes at its {_IDLE_WAIT_S:g} s timeout, not before")


def _waiting_any(
    store: SupportsRecordWatch, seen: dict[str, bytes | None], timeout_s: float
) -> _InThread[dict[str, bytes | None]]:
    """``record_wait_any`` on a thread of its own (``seen`` copied: the test changes it)."""
    waited = dict(seen)
    return _InThread(lambda: store.record_wait_any(waited, timeout_s), "record_wait_any")


@pytest.mark.hermes_check("records", "a wait on several records is woken by any of them", new=True)
def test_a_wait_on_several_records_returns_exactly_those_another_driver_object_changed(
    hermes_kit: Kit,
) -> None:
    store = _records(hermes_kit.driver())
    if not isinstance(store, SupportsRecordWatch):
        pytest.skip(
            "n/a: the driver has no record_wait_any(); a worker waits on one of its jobs' "
            "records and reads the others when that wait ends"
        )
    writer = _records(hermes_kit.driver())
    first, second, third = "job:kit-any-1", "job:kit-any-2", "job:kit-any-3"
    running, done = _document("running"), _document("succeeded")
    for key in (first, second):
        assert writer.record_put(key, running, _KEPT_S, None), "a put of a new key was refused"
    seen: dict[str, bytes | None] = {first: running, second: running, third: None}
    timeout_s = scaled(_WAIT_TIMEOUT_S)

    # A write to the second key (not the first one waited on) wakes the wait.
    waiter = _waiting_any(store, seen, timeout_s)
    assert stays_false(waiter.done, 0.5), (
        f"record_wait_any(every key at its stored bytes) returned "
        f"{waiter.returned or waiter.errors} with nothing written and a {timeout_s:g} s timeout"
    )
    assert writer.record_put(second, done, _KEPT_S, running), "a put expecting the bytes failed"
    assert wait_until(waiter.done, _WAKE_S), (
        f"record_wait_any did not return within {scaled(_WAKE_S):g} s of another driver "
        f"object's write to the second of its three keys (its timeout: {timeout_s:g} s): "
        "it is not woken by a write to any of them"
    )
    assert waiter.value() == {second: done}, (
        f"record_wait_any returned {waiter.value()!r}: not exactly the key that changed"
    )

    # A key never written, then written, wakes it too.
    seen[second] = done
    waiter = _waiting_any(store, seen, timeout_s)
    assert stays_false(waiter.done, 0.3), "record_wait_any returned with nothing changed"
    assert writer.record_put(third, running, _KEPT_S, None), "a put of a new key was refused"
    assert wait_until(waiter.done, _WAKE_S), (
        f"record_wait_any did not return within {scaled(_WAKE_S):g} s of the first write of a "
        "key it waited on as absent (None)"
    )
    assert waiter.value() == {third: running}, f"record_wait_any returned {waiter.value()!r}"

    # Stale bytes are returned at once; nothing changing: an empty dict at its timeout.
    stale = _waiting_any(store, {first: done, second: done}, timeout_s)
    assert wait_until(stale.done, _WAKE_S), "record_wait_any with stale seen bytes did not return"
    assert stale.value() == {first: running}, f"stale: record_wait_any returned {stale.value()!r}"
    idle_s = scaled(_IDLE_WAIT_S)
    seen[third] = running
    idle = _waiting_any(store, seen, idle_s)
    assert wait_until(idle.done, _IDLE_WAIT_S + _WAKE_S), (
        f"record_wait_any(timeout_s={idle_s:g}) with nothing changing did not return"
    )
    took = idle.ended - idle.started
    assert idle.value() == {}, f"unchanged: record_wait_any returned {idle.value()!r}, not {{}}"
    assert took >= idle_s - EARLY_TOLERANCE_S, (
        f"record_wait_any(timeout_s={idle_s:g}) returned after {took:.2f} s with nothing "
        "changed: a caller would spin"
    )
    hermes_kit.claim(
        f"a wait on three records woken by another driver object's write to any within "
        f"{_WAKE_S:g} s, exactly the changed keys returned, {{}} at its timeout"
    )


@pytest.mark.hermes_check("records", "a scan lists the live records", new=True)
def test_a_scan_lists_the_live_records_of_its_namespace_and_no_expired_one(
    hermes_kit: Kit,
) -> None:
    writer = _records(hermes_kit.driver())
    reader = _records(hermes_kit.driver())
    live = {f"job:kit-scan-{n}": _document(f"state-{n}") for n in range(3)}
    for key, value in live.items():
        assert writer.record_put(key, value, _KEPT_S, None), "a put of a new key was refused"
    # The same key in another namespace on the same broker, which this one must not see.
    elsewhere = connect(isolated_url(hermes_kit.target.url, namespace_for("records-elsewhere")))
    try:
        other = _records(elsewhere)
        assert other.record_put("job:kit-scan-0", b'{"elsewhere":1}', _KEPT_S, None), (
            "a put of a key written only in another namespace was refused"
        )
        ttl = scaled(_TTL_S)
        short = _document("expiring")
        written_at = time.monotonic()
        assert writer.record_put("job:kit-scan-short", short, ttl, None), "a put was refused"
        scanned = reader.record_scan(100)
        assert isinstance(scanned, list), f"record_scan returned {type(scanned).__name__}"
        assert Counter(scanned) == Counter([*live.values(), short]), (
            f"record_scan(100) of 4 live records lists {len(scanned)}: "
            f"{[value[:40] for value in scanned]}"
        )
        assert len(reader.record_scan(2)) == 2, "record_scan(2) of 4 records did not list 2"
        gone = wait_until(lambda: short not in reader.record_scan(100), _TTL_S + _PRECISION_S)
        elapsed = time.monotonic() - written_at
        assert gone, (
            f"record_scan still lists a record written with ttl {ttl:.2f} s, {elapsed:.1f} s later"
        )
        scanned = reader.record_scan(100)
        assert Counter(scanned) == Counter(live.values()), (
            f"after one record expired record_scan(100) lists {len(scanned)} of 3 live records: "
            f"{[value[:40] for value in scanned]}"
        )
        assert _get(reader, "job:kit-scan-0") == live["job:kit-scan-0"], (
            "a record written in another namespace replaced this one's"
        )
    finally:
        if isinstance(elsewhere, SupportsTeardown):
            call_within("teardown()", elsewhere.teardown, CLOSE_S, repr(elsewhere))
        call_within("close()", elsewhere.close, CLOSE_S, repr(elsewhere))
    hermes_kit.claim("live records listed exactly, an expired one not, another namespace's not")


#: Records a paging walk starts with, in two batches written apart, and its page size.
_PAGED = 12
_PAGE = 5


def _walk(
    store: SupportsRecordPages,
    oldest_first: bool,
    between: Callable[[int], None],
) -> list[bytes]:
    """Every value a walk from the start lists, ``between(n)`` run after page ``n``."""
    listed: list[bytes] = []
    after: str | None = None
    for n in range(4 * _PAGED):  # more pages than records: a cursor that never ends fails
        page = store.record_page(after, _PAGE, 1 << 30, oldest_first=oldest_first)
        assert isinstance(page, BrowsePage), (
            f"record_page returned {type(page).__name__}, not a BrowsePage"
        )
        assert len(page.entries) <= _PAGE, (
            f"record_page(limit={_PAGE}) listed {len(page.entries)} records"
        )
        for _, value in page.entries:
            assert type(value) is bytes, f"record_page listed a {type(value).__name__}, not bytes"
            listed.append(value)
        if page.next is None:
            return listed
        assert isinstance(page.next, str), f"a page's next is {type(page.next).__name__}"
        after = page.next
        between(n)
    raise AssertionError(f"record_page still gave a next after {4 * _PAGED} pages")


@pytest.mark.hermes_check("record pages", "every record once while records are written", new=True)
def test_paging_lists_every_record_once_newest_and_oldest_first_while_records_are_written(
    hermes_kit: Kit,
) -> None:
    writer = _records(hermes_kit.driver())
    reader = _records(hermes_kit.driver())
    if not isinstance(reader, SupportsRecordPages):
        pytest.skip("not applicable: the driver has no record_page(); lists show one page")
    first = [(f"job:kit-page-{n:02d}", _document(f"page-{n}")) for n in range(_PAGED // 2)]
    second = [(f"job:kit-page-{n:02d}", _document(f"page-{n}")) for n in range(_PAGED // 2, _PAGED)]
    for key, value in first:
        assert writer.record_put(key, value, _KEPT_S, None), "a put of a new key was refused"
    time.sleep(0.05)  # the second batch is newer than the first on any store's clock
    for key, value in second:
        assert writer.record_put(key, value, _KEPT_S, None), "a put of a new key was refused"
    stored = dict(first + second)
    created: list[bytes] = []

    def write_between(n: int) -> None:
        # A new record, and a rewrite of one record on each side of the cursor:
        # a write keeps a record's place, whatever the store orders by.
        key = f"job:kit-page-new-{len(created):02d}"
        created.append(_document(f"new-{len(created)}"))
        assert writer.record_put(key, created[-1], _KEPT_S, None), "a put was refused"
        for rewritten in (f"job:kit-page-{n:02d}", f"job:kit-page-{_PAGED - 1 - n:02d}"):
            value = stored[rewritten] + b" "
            assert writer.record_put(rewritten, value, _KEPT_S, stored[rewritten]), (
                f"a put over the bytes stored under {rewritten!r} was refused"
            )
            stored[rewritten] = value

    for oldest_first in (False, True):
        order = "oldest first" if oldest_first else "newest first"
        # Each record by its state: a record rewritten after it was listed shows older bytes.
        walked = [
            json.loads(value)["state"] for value in _walk(reader, oldest_first, write_between)
        ]
        twice = sorted(state for state, count in Counter(walked).items() if count > 1)
        assert twice == [], f"paging {order} listed these records twice: {twice}"
        missing = [f"page-{n}" for n in range(_PAGED) if f"page-{n}" not in walked]
        assert missing == [], (
            f"paging {order} with records written between pages never listed {missing}"
        )
        at = {state: place for place, state in enumerate(walked)}
        older = [at[f"page-{n}"] for n in range(_PAGED // 2)]
        newer = [at[f"page-{n}"] for n in range(_PAGED // 2, _PAGED)]
        if oldest_first:
            assert max(older) < min(newer), "paging oldest first listed a newer record first"
            late = [f"new-{n}" for n in range(len(created)) if f"new-{n}" not in walked]
            assert late == [], f"paging oldest first never reached {late}, created meanwhile"
        else:
            assert max(newer) < min(older), "paging newest first listed an older record first"
    bounded = reader.record_page(None, _PAGE, 1)
    assert len(bounded.entries) == 1, (
        f"record_page(max_bytes=1) listed {len(bounded.entries)} records, not one"
    )
    hermes_kit.claim(
        f"{_PAGED} records paged {_PAGE} at a time each way, each once, while records "
        "were created and rewritten between pages; a page held to its bytes"
    )
