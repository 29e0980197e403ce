"""Fleet-wide limits: the decision a store runs, the Dispatcher's deferral, the CLI."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes.core import (
    ConfigurationError,
    Dispatcher,
    Emitter,
    HandlerRegistry,
    Limit,
    Message,
    Worker,
    connect,
    hookimpl,
)
from hermes.core.app import _limits as limits_module
from hermes.core.app._limits import LIMIT_HEADER, Deferred, Limiter, parse_limit, parse_rate
from hermes.core.cli import main
from hermes.core.driver import Delay, LimitRule
from hermes.core.drivertools import MemoryDriver, limit_state
from hermes.core.spi._registry import plugin_manager

_modules = itertools.count()


# The decision ------------------------------------------------------------------


def test_a_rate_spaces_starts_and_reserves_each_refused_one_a_turn_of_its_own() -> None:
    state = limit_state.fresh()
    rule = LimitRule(interval_s=0.5)
    answers = [limit_state.take(state, rule, f"s{i}", False, 30, now=100.0) for i in range(4)]

    assert [a.wait_s for a in answers] == [0.0, 0.5, 1.0, 1.5]
    assert all(a.charged for a in answers)
    # The reserved jobs come back charged: each runs at its turn, whatever the rate says now.
    later = limit_state.take(state, rule, "s1", True, 30, now=100.5)
    assert later == (0.0, True, ())
    # and the rate was not moved on by it: the next new job waits behind the reserved three.
    assert limit_state.take(state, rule, "s9", False, 30, now=100.5).wait_s == pytest.approx(1.5)


def test_a_take_refused_for_the_rate_can_reserve_the_turns_after_its_own() -> None:
    state = limit_state.fresh()
    limit_state.take(state, LimitRule(interval_s=1.0), "a", False, 30, now=0.0)

    answer = limit_state.take(state, LimitRule(interval_s=1.0, reserve=3), "b", False, 30, 0.0)

    assert answer == (1.0, True, (2.0, 3.0))
    assert limit_state.take(state, LimitRule(interval_s=1.0), "c", False, 30, 0.0).wait_s == 4.0


def test_a_limiter_hands_out_the_turns_it_reserved_ahead_and_asks_less_often(
    driver: MemoryDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Blocks of an hourly rate's turns, here, to see them handed out one by one.
    monkeypatch.setattr(limits_module, "MAX_BLOCK_S", 16 * 3600.0)
    asked: list[int] = []
    real_take = driver.limit_take

    def counted(key: str, rule: LimitRule, *args: Any) -> Any:
        asked.append(rule.reserve)
        return real_take(key, rule, *args)

    driver.limit_take = counted  # type: ignore[method-assign]
    limiter = Limiter(driver)
    hourly = Limit(rate="1/h")
    answers = [limiter.take(hourly, Message("export", {"n": n})) for n in range(8)]

    assert answers[0] is None  # the hour's first turn: it runs
    waits = [a.wait_s for a in answers[1:] if isinstance(a, Deferred)]
    assert len(waits) == 7
    assert all(b - a == pytest.approx(3600, abs=1) for a, b in itertools.pairwise(waits))
    assert asked == [1, 1, 2, 4]  # 8 jobs, 4 questions: the turns reserved ahead went out
    # A turn held ahead that passed while its job was on its way: the job runs now.
    limiter._turns["export"] = collections.deque([time.time() - 1])
    assert limiter.take(hourly, Message("export", {})) is None
    # One that passed more than a period ago is dropped, and reserving starts over.
    limiter._turns["export"] = collections.deque([time.time() - 3601])
    assert isinstance(limiter.take(hourly, Message("export", {})), Deferred)
    assert asked[-1] == 1


@pytest.mark.parametrize(
    ("rate", "block"), [("1/h", 1), ("5/s", 1), ("10/s", 2), ("50/s", 12), ("1000/s", 16)]
)
def test_a_reserved_block_spans_a_quarter_second_of_the_rate_at_most(rate: str, block: int) -> None:
    # A slow rate's turn held ahead and never used would stand idle a long while:
    # its keys reserve one turn at a time, so a short backlog loses none.
    assert limits_module._max_block(Limit(rate=rate).rule) == block


def test_a_burst_lets_that_many_start_back_to_back_and_then_the_rate_applies() -> None:
    state = limit_state.fresh()
    rule = LimitRule(interval_s=1.0, burst=3)
    waits = [limit_state.take(state, rule, f"s{i}", False, 30, now=0.0).wait_s for i in range(5)]

    assert waits == [0.0, 0.0, 0.0, 1.0, 2.0]


def test_slots_are_held_until_released_or_their_lease_runs_out() -> None:
    state = limit_state.fresh()
    rule = LimitRule(concurrency=2)

    assert limit_state.take(state, rule, "a", False, 10, now=0.0).wait_s == 0
    assert limit_state.take(state, rule, "b", False, 10, now=0.0).wait_s == 0
    refused = limit_state.take(state, rule, "c", False, 10, now=1.0)
    assert refused.wait_s > 0 and not refused.charged

    limit_state.release(state, "a", now=3.0)
    assert limit_state.take(state, rule, "c", False, 10, now=3.0).wait_s == 0
    # "b" is never renewed: its worker died. Its lease ends at 10.
    assert limit_state.renew(state, "c", 10, now=9.0)
    assert limit_state.take(state, rule, "d", False, 10, now=9.5).wait_s > 0
    assert limit_state.take(state, rule, "d", False, 10, now=10.5).wait_s == 0
    assert not limit_state.renew(state, "b", 10, now=10.5)
    assert sorted(state["slots"]) == ["c", "d"]


def test_jobs_waiting_for_a_slot_are_spread_over_the_expected_finishes() -> None:
    state = limit_state.fresh()
    rule = LimitRule(concurrency=1)
    limit_state.take(state, rule, "a", False, 60, now=0.0)
    limit_state.release(state, "a", now=2.0)  # held 2 s: the mean moves towards 2
    mean = state["avg"]
    limit_state.take(state, rule, "b", False, 60, now=2.0)

    waits = [limit_state.take(state, rule, f"w{i}", False, 60, now=2.0).wait_s for i in range(3)]

    assert waits == pytest.approx([mean, 2 * mean, 3 * mean])
    usage = limit_state.usage("k", state, now=2.0)
    assert (usage.running, usage.queued, usage.reserved) == (1, 3, 0)


def test_a_job_refused_a_slot_uses_up_no_turn_of_the_rate() -> None:
    state = limit_state.fresh()
    rule = LimitRule(interval_s=1.0, concurrency=1)
    assert limit_state.take(state, rule, "a", False, 60, now=0.0).wait_s == 0
    tat = state["tat"]

    assert limit_state.take(state, rule, "b", False, 60, now=0.1).wait_s > 0
    assert state["tat"] == tat


def test_a_state_is_kept_while_it_says_something_and_not_longer() -> None:
    state = limit_state.fresh()
    limit_state.take(state, LimitRule(interval_s=2.0, concurrency=1), "a", False, 5, now=0.0)

    assert limit_state.keep_for(state, now=0.0) == 5  # the slot's lease
    limit_state.release(state, "a", now=1.0)
    assert limit_state.keep_for(state, now=1.0) == 1  # the rate's next turn
    assert limit_state.keep_for(state, now=3.0) == 0
    assert limit_state.decode(limit_state.encode(state)) == state


# Declaring -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "interval_s"),
    [
        ("100/m", 0.6),
        ("10/s", 0.1),
        ("5/10s", 2.0),
        ("1000/d", 86.4),
        (" 2 / h ", 1800.0),
        ("60/min", 1.0),
    ],
)
def test_a_rate_reads_as_a_count_per_period(rate: str, interval_s: float) -> None:
    assert parse_rate(rate) == pytest.approx(interval_s)


@pytest.mark.parametrize("rate", ["100", "100/fortnight", "0/s", "-1/s", "1/0s", "ten/s", ""])
def test_a_rate_that_is_not_a_count_per_period_names_the_accepted_forms(rate: str) -> None:
    with pytest.raises(ConfigurationError, match="100/m"):
        Limit(rate=rate)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({}, "needs a rate, a concurrency or both"),
        ({"concurrency": 0}, "concurrency must be an int >= 1"),
        ({"concurrency": True}, "concurrency must be an int >= 1"),
        ({"rate": "1/s", "burst": 0}, "burst must be an int >= 1"),
        ({"concurrency": 1, "lease_s": 0.5}, "lease_s must be >= 1 second"),
        ({"concurrency": 1, "key": 7}, "payload field name or a function"),
    ],
)
def test_a_limit_that_cannot_hold_says_why(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        Limit(**kwargs)


def test_a_key_is_a_payload_field_or_a_function_and_a_missing_field_counts_as_null() -> None:
    by_field = Limit(concurrency=5, key="customer")
    by_host = Limit(rate="10/s", key=lambda m: m.payload["url"].split("/")[2])

    assert by_field.key_of(Message("charge", {"customer": "c-7"})) == "charge:c-7"
    assert by_field.key_of(Message("charge", {"customer": 7})) == "charge:7"
    assert by_field.key_of(Message("charge", {})) == "charge:null"
    assert by_host.key_of(Message("fetch", {"url": "https://a.example/x"})) == "fetch:a.example"
    assert Limit(rate="1/s").key_of(Message("charge", {})) == "charge"


def test_the_command_line_spells_a_limit_as_type_and_fields() -> None:
    type_, limit = parse_limit("billing:charge:rate=100/m,concurrency=5,key=customer,burst=2")

    assert type_ == "billing:charge"
    assert (limit.rate, limit.concurrency, limit.key, limit.burst) == ("100/m", 5, "customer", 2)
    assert limit.describe() == "100/m (burst 2), 5 at once per customer"
    for bad, says in [
        ("charge", "TYPE:rate=100/m"),
        ("charge:speed=3", "'speed=3' is not one of"),
        ("charge:concurrency=many", "concurrency=many"),
    ]:
        with pytest.raises(ConfigurationError, match=says):
            parse_limit(bad)


# The Dispatcher ------------------------------------------------------------------


@pytest.fixture
def driver() -> MemoryDriver:
    return MemoryDriver(f"limits-{uuid.uuid4().hex}")


def _run(driver: MemoryDriver, dispatcher: Dispatcher, until: Any, timeout_s: float = 20) -> None:
    worker = Worker(driver, dispatcher)
    thread = threading.Thread(target=worker.run)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not until() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        worker.stop()
        thread.join(10)
    assert until(), "the worker did not get there in time"


def test_a_job_over_its_rate_is_sent_for_its_turn_acknowledged_and_not_retried(
    driver: MemoryDriver,
) -> None:
    sent: list[tuple[Message, int]] = []
    deferred: list[tuple[str, str, float]] = []

    class Observer:
        @hookimpl
        def hermes_message_deferred(self, message: Message, key: str, wait_s: float) -> None:
            deferred.append((message.id, key, wait_s))

    driver.setup_priority_queue("high", 200)
    dispatcher = Dispatcher(driver)
    dispatcher.limit("charge", Limit(rate="1/m"))
    ran: list[str] = []
    dispatcher.register_handler("charge", lambda m: ran.append(m.id))
    real_send = driver.send

    def send(message: Message, priority: int = 100) -> None:
        sent.append((message, priority))
        real_send(message, priority)

    driver.send = send  # type: ignore[method-assign]
    first, second = Message("charge", {"n": 1}), Message("charge", {"n": 2})
    observer = Observer()
    plugin_manager().register(observer)
    try:
        with dispatcher.running():
            assert dispatcher.handle_message(first, 100)
            before = time.time()
            assert dispatcher.handle_message(second, 200)
    finally:
        plugin_manager().unregister(observer)

    assert ran == [first.id]
    ((copy, priority),) = sent
    assert (copy.id, copy.retries, priority) == (second.id, 0, 200)
    assert copy.execute_at == pytest.approx(before + 60, abs=1)
    retries, _, turn = copy.headers[LIMIT_HEADER].partition("@")
    assert retries == "0" and float(turn) == pytest.approx(copy.execute_at, abs=0.01)
    assert [(d[0], d[1]) for d in deferred] == [(second.id, "charge")]
    assert dispatcher.stats.deferred == 1 and dispatcher.stats.retried == 0
    # Its copy, delivered at its turn, runs although the rate's next turn is far away
    # (the header says its turn is now, as it will be when the broker hands it out);
    # delivered a minute early, as a broker that holds nothing back would, it is not.
    early = copy.replace(headers={LIMIT_HEADER: f"0@{time.time() + 60}"})
    at_turn = copy.replace(headers={LIMIT_HEADER: f"0@{time.time()}"})
    with dispatcher.running():
        assert dispatcher.handle_message(early, 200)
        assert dispatcher.handle_message(at_turn, 200)
    assert ran == [first.id, second.id]
    assert dispatcher.stats.deferred == 2


def test_a_retry_copy_of_a_job_that_waited_for_its_turn_is_charged_again(
    driver: MemoryDriver,
) -> None:
    dispatcher = Dispatcher(driver)
    dispatcher.limit("charge", Limit(rate="1/m"))
    ran: list[int] = []
    dispatcher.register_handler("charge", lambda m: ran.append(m.retries))
    with dispatcher.running():
        dispatcher.handle_message(Message("charge", {}), 100)  # uses the minute's turn
        retry = Message("charge", {}, retries=1, headers={LIMIT_HEADER: f"0@{time.time()}"})
        dispatcher.handle_message(retry, 100)

    assert ran == [0]
    assert dispatcher.stats.deferred == 1


def test_a_copy_delivered_a_period_after_its_turn_is_charged_again(
    driver: MemoryDriver, caplog: pytest.LogCaptureFixture
) -> None:
    dispatcher = Dispatcher(driver)
    dispatcher.limit("charge", Limit(rate="1/m"))
    ran: list[str] = []
    dispatcher.register_handler("charge", lambda m: ran.append(m.payload["n"]))
    on_time = Message("charge", {"n": "on time"}, headers={LIMIT_HEADER: f"0@{time.time()}"})
    late = Message("charge", {"n": "late"}, headers={LIMIT_HEADER: f"0@{time.time() - 61}"})
    garbled = Message("charge", {"n": "garbled"}, headers={LIMIT_HEADER: "0@soon"})
    with dispatcher.running():
        dispatcher.handle_message(Message("charge", {"n": "first"}), 100)  # the minute's turn
        for message in (on_time, late, garbled):
            dispatcher.handle_message(message, 100)

    assert ran == ["first", "on time"]
    assert dispatcher.stats.deferred == 2
    assert "unreadable hermes-limit-turn header '0@soon'" in caplog.text


def test_a_slot_is_freed_when_its_handler_raises(driver: MemoryDriver) -> None:
    dispatcher = Dispatcher(driver)
    dispatcher.limit("charge", Limit(concurrency=1))
    running: list[int] = []

    def boom(message: Message) -> None:
        limiter = dispatcher.limiter()
        assert limiter is not None
        running.extend(usage.running for usage in limiter.usage())
        raise RuntimeError("card declined")

    dispatcher.register_handler("charge", boom)
    with dispatcher.running():
        dispatcher.handle_message(Message("charge", {}), 100)
        dispatcher.handle_message(Message("charge", {}), 100)
        limiter = dispatcher.limiter()
        assert limiter is not None
        assert limiter.usage() == []  # nothing held, nothing promised: forgotten

    assert running == [1, 1]
    assert dispatcher.stats.deferred == 0 and dispatcher.stats.failed == 2


def test_no_more_than_the_concurrency_run_at_once_and_every_job_runs_once(
    driver: MemoryDriver,
) -> None:
    running = 0
    most = 0
    done: list[int] = []
    lock = threading.Lock()

    def handle(message: Message) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
            done.append(message.payload["n"])

    dispatcher = Dispatcher(driver, concurrency=6)
    dispatcher.limit("charge", Limit(concurrency=2))
    dispatcher.register_handler("charge", handle)
    emitter = Emitter(driver)
    for n in range(30):
        emitter.emit(Message("charge", {"n": n}))

    _run(driver, dispatcher, lambda: len(done) == 30)

    assert sorted(done) == list(range(30))
    assert most <= 2
    assert dispatcher.stats.retried == 0


def test_limited_jobs_do_not_hold_up_other_types(driver: MemoryDriver) -> None:
    done: dict[str, int] = {"slow": 0, "free": 0}

    def count(message: Message) -> None:
        done[message.type] += 1

    dispatcher = Dispatcher(driver, concurrency=2)
    dispatcher.limit("slow", Limit(rate="1/h"))
    dispatcher.register_handler("slow", count).register_handler("free", count)
    emitter = Emitter(driver)
    for n in range(20):
        emitter.emit(Message("slow", {"n": n}))
    for n in range(50):
        emitter.emit(Message("free", {"n": n}))

    _run(driver, dispatcher, lambda: done["free"] == 50)

    assert done["slow"] == 1  # the hour's one turn; the 19 others wait for theirs
    assert dispatcher.stats.deferred == 19


def test_limits_declared_beside_the_handlers_reach_the_dispatcher(driver: MemoryDriver) -> None:
    handlers = HandlerRegistry()

    @handlers.handler("charge", limit=Limit(rate="100/m", key="customer"))
    def charge(message: Message) -> None: ...

    handlers.limit("refund", Limit(concurrency=2))
    dispatcher = handlers.register(Dispatcher(driver))

    assert dispatcher.limits == {
        "charge": Limit(rate="100/m", key="customer"),
        "refund": Limit(concurrency=2),
    }


def test_a_broker_that_cannot_hold_a_copy_back_or_a_store_that_cannot_keep_limits_is_refused(
    driver: MemoryDriver,
) -> None:
    immediate = MemoryDriver(driver.name)
    immediate.capabilities = dataclasses.replace(driver.capabilities, delay=Delay.IGNORED)
    dispatcher = Dispatcher(immediate).limit("charge", Limit(rate="1/s"))
    with pytest.raises(ConfigurationError, match="delivers every message at once"):
        dispatcher.limiter()

    class NoLimits(MemoryDriver):
        limit_take = None  # type: ignore[assignment]

    dispatcher = Dispatcher(driver, limit_store=NoLimits()).limit("charge", Limit(rate="1/s"))
    with pytest.raises(ConfigurationError, match="cannot keep limits"):
        dispatcher.limiter()
    assert Dispatcher(immediate).limiter() is None  # no limits, nothing to check


# The command line ----------------------------------------------------------------


@pytest.fixture
def handlers_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.chdir(tmp_path)
    name = f"cli_limits_{next(_modules)}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from hermes.core import HandlerRegistry, Limit

            handlers = HandlerRegistry()

            @handlers.handler("charge", limit=Limit(concurrency=3, key="customer"))
            def charge(message):
                pass
            """
        )
    )
    yield f"{name}:handlers"
    sys.modules.pop(name, None)


def test_a_worker_says_its_limits_and_the_summary_counts_what_they_deferred(
    capsys: pytest.CaptureFixture[str], handlers_module: str
) -> None:
    url = f"memory://cli-limits-{uuid.uuid4().hex}"
    with connect(url) as driver:
        for _ in range(3):
            Emitter(driver).emit(Message("charge", {"customer": "c-1"}))
        argv = ["worker", "--url", url, "--handlers", handlers_module, "--max-items", "3"]
        assert main([*argv, "--limit", "charge:rate=1/h"]) == 0
        printed = capsys.readouterr()
        assert "Limit charge: 1/h, fleet-wide in" in printed.err
        summary = printed.out.splitlines()[-1]
        assert "handled 1," in summary and summary.endswith("deferred 2 by their limit"), summary

        assert main(["stats", "--url", url]) == 0
        table = capsys.readouterr().out.splitlines()
        header = table.index("limit   running  waiting  mean run s")
        # Each deferral reserved its own turn only: an hourly rate reserves no block.
        assert table[header + 1].split() == ["charge", "0", "2", "0.1"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--limit", "charge"], "--limit takes TYPE:rate=100/m"),
        (["--limit", "charge:rate=fast"], "a rate is a count per period"),
        (
            ["--limits-url", "amqp://guest:secret@127.0.0.1:5672/?queue=jobs"],
            "cannot keep limits",
        ),
    ],
)
def test_limit_mistakes_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], handlers_module: str, argv: list[str], says: str
) -> None:
    url = f"memory://cli-limits-{uuid.uuid4().hex}"
    code = main(["worker", "--url", url, "--handlers", handlers_module, "--max-items", "1", *argv])

    err = capsys.readouterr().err
    assert code == 2
    assert says in err and "secret" not in err
    assert err.count("\n") == 1, err


def test_a_slot_of_a_worker_killed_mid_job_is_free_again_once_its_lease_ends(
    tmp_path: Path,
) -> None:
    """Two ``hermes worker`` processes on one file:// queue, one slot with a 2 s lease."""
    hermes = shutil.which("hermes", path=str(Path(sys.executable).parent)) or "hermes"
    (tmp_path / "slow_jobs.py").write_text(
        textwrap.dedent(
            """
            import os, pathlib, time
            from hermes.core import HandlerRegistry, Limit

            handlers = HandlerRegistry()
            marks = pathlib.Path(os.environ["MARKS"])

            @handlers.handler("slow", limit=Limit(concurrency=1, lease_s=2))
            def slow(message):
                mark = marks / message.payload["name"]
                if mark.exists():
                    return  # delivered again after its worker died: done already
                mark.write_text(str(os.getpid()))
                if message.payload["name"] == "first":
                    time.sleep(120)  # its worker is killed meanwhile
            """
        )
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    url = f"file://{tmp_path / 'queue'}"
    with connect(url) as driver:
        Emitter(driver).emit(Message("slow", {"name": "first"}))
    env = {**os.environ, "MARKS": str(marks), "PYTHONPATH": str(tmp_path)}
    argv = [hermes, "worker", "--url", url, "--handlers", "slow_jobs:handlers"]

    def wait_for(done: Any, what: str) -> None:
        deadline = time.monotonic() + 60
        while not done():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    log = tmp_path / "first.log"
    with open(log, "wb") as out:
        first = subprocess.Popen([*argv, "--concurrency", "2", "-v"], env=env, stderr=out)
    second = None
    try:
        wait_for((marks / "first").exists, "the first job never started")
        with connect(url) as driver:
            Emitter(driver).emit(Message("slow", {"name": "second"}))
        wait_for(lambda: "(slow) deferred" in log.read_text(), "the second job was not deferred")
        first.kill()  # SIGKILL: the first job's slot is never released
        first.wait(30)
        assert not (marks / "second").exists()  # the slot was held while its job ran
        second = subprocess.Popen([*argv, "-q"], env=env)
        wait_for((marks / "second").exists, "the dead worker's slot was never freed")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)


def test_an_emitter_given_the_limits_sends_each_job_charged_and_due_at_its_turn(
    driver: MemoryDriver,
) -> None:
    handlers = HandlerRegistry()
    handlers.limit("export", Limit(rate="1/h"))
    sent: list[Message] = []
    real_send = driver.send

    def send(message: Message, priority: int = 100) -> None:
        sent.append(message)
        real_send(message, priority)

    driver.send = send  # type: ignore[method-assign]
    emitter = Emitter(driver, limits=handlers)
    before = time.time()
    for n in range(3):
        emitter.emit(Message("export", {"n": n}))
    emitter.emit(Message("other", {}))
    emitter.emit(Message("export", {"n": "later"}, execute_at=before + 86400))

    first, second, third, other, later = sent
    assert first.execute_at is None and first.headers[LIMIT_HEADER].startswith("0@")  # now
    assert second.execute_at == pytest.approx(before + 3600, abs=5)
    assert third.execute_at == pytest.approx(before + 7200, abs=5)
    assert second.headers[LIMIT_HEADER].startswith("0@")
    assert other.execute_at is None and later.execute_at == before + 86400
    assert LIMIT_HEADER not in later.headers  # due tomorrow: its worker decides then

    # A worker with the same limit runs the first, and the others at their turns, once each.
    dispatcher = handlers.register(Dispatcher(driver))
    ran: list[Any] = []
    dispatcher.register_handler("export", lambda m: ran.append(m.payload["n"]))
    at_turn = second.replace(headers={LIMIT_HEADER: f"0@{time.time()}"})
    with dispatcher.running():
        dispatcher.handle_message(first, 100)
        dispatcher.handle_message(at_turn, 100)
    assert ran == [0, 1] and dispatcher.stats.deferred == 0


def test_an_emitter_refuses_limits_its_broker_cannot_hold_back(driver: MemoryDriver) -> None:
    immediate = MemoryDriver(driver.name)
    immediate.capabilities = dataclasses.replace(driver.capabilities, delay=Delay.IGNORED)

    with pytest.raises(ConfigurationError, match="delivers every message at once"):
        Emitter(immediate, limits={"export": Limit(rate="1/s")})
    Emitter(immediate, limits={"export": Limit(concurrency=2)})  # slots are the workers' alone
