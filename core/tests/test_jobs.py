"""Job records on each store: each path a job can take, its states and attempts."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hermes_test_services as services
import pytest

from hermes.core import Dispatcher, Emitter, Message, Result, Worker, hookimpl
from hermes.core.app import _jobs as jobs_module
from hermes.core.driver import SupportsTeardown
from hermes.core.drivertools import MemoryDriver, isolated_url
from hermes.core.heartbeat import HeartbeatPublisher
from hermes.core.jobs import (
    JobRecord,
    JobResultError,
    Jobs,
    JobState,
    JobTimeoutError,
    UnknownJobError,
    current_job,
)
from hermes.core.spi._registry import plugin_manager

#: The longest a test waits for what it waits for.
DEADLINE_S = 10.0


@pytest.fixture
def broker() -> MemoryDriver:
    return MemoryDriver(f"jobs-{uuid.uuid4().hex}")


@pytest.fixture(params=["memory", "filesystem", "redis", "postgres"])
def jobs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Jobs]:
    """Job records on each store that keeps them, in a namespace of the test's own.

    The broker stays memory://: what differs between the paths is the record
    each store keeps (its compare-and-set, its waits, its scans).
    """
    tag = f"records-{uuid.uuid4().hex[:12]}"
    if request.param == "memory":
        url = f"memory://{tag}"
    elif request.param == "filesystem":
        url = f"file://{tmp_path / 'records'}"
    elif request.param == "redis":
        url = isolated_url(services.ensure_redis(), tag)
    else:
        url = isolated_url(f"{services.ensure_postgres()}?table=hermes_test_jobs", tag)
    jobs = Jobs(url)
    yield jobs
    if isinstance(jobs.driver, SupportsTeardown):
        jobs.driver.teardown()
    jobs.close()


def run(broker: MemoryDriver, dispatcher: Dispatcher, count: int) -> None:
    Worker(broker, dispatcher, max_items=count, handle_signals=False).run()


def emit(broker: MemoryDriver, jobs: Jobs, message: Message, **options: Any) -> Message:
    Emitter(broker, records=jobs).emit(message, **options)
    return message


def record(jobs: Jobs, message: Message) -> JobRecord:
    found = jobs.get(message.id)
    assert found is not None, f"no record of #{message.id}"
    return found


@pytest.mark.parametrize("value", [0, "", [], None, {"total": 6}, False])
def test_a_result_round_trips_whatever_its_value(
    broker: MemoryDriver, jobs: Jobs, value: Any
) -> None:
    message = emit(broker, jobs, Message("total"))
    assert record(jobs, message).state is JobState.WAITING
    dispatcher = Dispatcher(broker, records=jobs).register_handler("total", lambda m: Result(value))

    run(broker, dispatcher, 1)

    done = record(jobs, message)
    assert done.state is JobState.SUCCEEDED
    assert done.has_result and done.result == value
    assert jobs.job(message).result(timeout=1) == value
    (attempt,) = done.attempts
    assert attempt.outcome == "succeeded" and attempt.finished_at is not None
    assert done.started_at is not None and done.finished_at is not None


def test_a_handler_that_returns_none_succeeds_with_no_result_value(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("job"))
    run(broker, Dispatcher(broker, records=jobs).register_handler("job", lambda m: None), 1)

    assert jobs.job(message).result(timeout=1) is None
    assert record(jobs, message).state is JobState.SUCCEEDED


def test_returning_false_gives_up_at_once_with_the_reason(broker: MemoryDriver, jobs: Jobs) -> None:
    message = emit(broker, jobs, Message("job"))
    run(broker, Dispatcher(broker, records=jobs).register_handler("job", lambda m: False), 1)

    done = record(jobs, message)
    assert done.state is JobState.GIVEN_UP
    assert done.error is not None and "returned False" in done.error.message
    assert done.attempts[-1].outcome == "returned_false"
    with pytest.raises(JobResultError, match="given_up") as raised:
        jobs.job(message).result(timeout=1)
    assert raised.value.record == done


def test_a_failure_is_retried_recorded_as_failed_then_succeeds_on_the_retry(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("flaky"))
    dispatcher = Dispatcher(broker, records=jobs)
    seen: list[str] = []

    @dispatcher.handler("flaky", max_retry=3, backoff=0)
    def flaky(message: Message) -> Result:
        if message.retries == 0:
            seen.append(str(record(jobs, message).state))
            raise RuntimeError("card declined")
        return Result("paid")

    run(broker, dispatcher, 1)
    between = record(jobs, message)
    run(broker, dispatcher, 1)

    assert seen == ["running"]
    assert between.state is JobState.FAILED and between.retry_at is not None
    assert between.error is not None
    assert between.error.type == "builtins.RuntimeError"
    assert between.error.message == "card declined"
    assert "flaky" in (between.error.traceback or "")
    done = record(jobs, message)
    assert done.state is JobState.SUCCEEDED and done.result == "paid"
    assert [a.outcome for a in done.attempts] == ["retried", "succeeded"]
    assert done.attempts[0].error is not None and done.attempts[1].error is None


def test_a_failure_past_max_retry_is_given_up_with_the_exception(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("fails"))
    dispatcher = Dispatcher(broker, records=jobs)

    @dispatcher.handler("fails", max_retry=1, backoff=0)
    def fails(message: Message) -> None:
        raise ValueError(f"attempt {message.retries}")

    run(broker, dispatcher, 2)

    done = record(jobs, message)
    assert done.state is JobState.GIVEN_UP
    assert [a.outcome for a in done.attempts] == ["retried", "gave_up"]
    assert done.error is not None and done.error.message == "attempt 1"


def test_a_message_without_a_handler_is_given_up(broker: MemoryDriver, jobs: Jobs) -> None:
    message = emit(broker, jobs, Message("nobody"))
    run(broker, Dispatcher(broker, records=jobs).register_handler("other", lambda m: None), 1)

    done = record(jobs, message)
    assert done.state is JobState.GIVEN_UP
    assert done.error is not None and "no handler" in done.error.message


def test_a_handler_past_its_time_limit_is_recorded_as_such(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("slow"))
    release = threading.Event()

    async def slow(message: Message) -> None:
        import asyncio

        await asyncio.sleep(30)

    dispatcher = Dispatcher(broker, records=jobs, time_limit_s=0.2)
    dispatcher.register_handler("slow", slow)
    run(broker, dispatcher, 1)
    release.set()

    done = record(jobs, message)
    assert done.state is JobState.GIVEN_UP
    assert done.attempts[-1].outcome == "time_limit"
    assert done.error is not None and "TimeLimitExceeded" in done.error.type


def test_cancelling_a_waiting_job_means_no_handler_starts_it(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("job"))
    ran: list[str] = []

    cancelled = jobs.job(message).cancel()
    run(broker, Dispatcher(broker, records=jobs).register_handler("job", ran.append), 1)

    assert cancelled.state is JobState.CANCELLED
    assert ran == []
    done = record(jobs, message)
    assert done.state is JobState.CANCELLED and done.attempts == ()
    assert broker.queue_stats()[0].ready == 0  # acknowledged, not left behind
    with pytest.raises(JobResultError, match="cancelled"):
        jobs.job(message).result(timeout=1)


def test_cancelling_a_scheduled_job_means_no_handler_starts_it(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("job", execute_at=time.time() + 0.3))
    assert record(jobs, message).state is JobState.SCHEDULED
    ran: list[Message] = []

    jobs.cancel(message.id)
    run(broker, Dispatcher(broker, records=jobs).register_handler("job", ran.append), 1)

    assert ran == []
    assert record(jobs, message).state is JobState.CANCELLED


def test_a_sync_handler_that_ignores_a_cancel_finishes_and_is_recorded_succeeded(
    broker: MemoryDriver, jobs: Jobs, caplog: pytest.LogCaptureFixture
) -> None:
    message = emit(broker, jobs, Message("job"))
    started, release = threading.Event(), threading.Event()
    told: list[bool] = []

    def blocks(message: Message) -> Result:
        started.set()
        release.wait(DEADLINE_S)
        job = current_job()
        assert job is not None
        told.append(job.cancelled.wait(DEADLINE_S))  # told, and finishes anyway
        return Result("done")

    dispatcher = Dispatcher(broker, records=jobs).register_handler("job", blocks)
    worker = threading.Thread(target=run, args=(broker, dispatcher, 1))
    worker.start()
    assert started.wait(DEADLINE_S)
    noted = jobs.cancel(message.id)
    release.set()
    worker.join(DEADLINE_S)

    assert told == [True]
    assert noted.state is JobState.RUNNING and noted.cancel_requested
    done = record(jobs, message)
    assert done.state is JobState.SUCCEEDED and done.cancel_requested
    assert done.result == "done"
    assert [a.outcome for a in done.attempts] == ["succeeded"]
    (line,) = [r.getMessage() for r in caplog.records if "a cancel came" in r.getMessage()]
    assert f"#{message.id}" in line and "too late" in line


def running_in_a_worker(
    broker: MemoryDriver, dispatcher: Dispatcher, started: threading.Event
) -> threading.Thread:
    worker = threading.Thread(target=run, args=(broker, dispatcher, 1))
    worker.start()
    assert started.wait(DEADLINE_S), "the handler never started"
    return worker


def test_a_sync_handler_that_checks_the_flag_stops_and_the_job_is_cancelled_not_retried(
    broker: MemoryDriver, jobs: Jobs, caplog: pytest.LogCaptureFixture
) -> None:
    message = emit(broker, jobs, Message("export"))
    started = threading.Event()
    steps: list[int] = []
    after: list[Message] = []
    failed = MemoryDriver(f"failed-{uuid.uuid4().hex}")
    dispatcher = Dispatcher(broker, records=jobs, failed=failed)

    @dispatcher.handler("export", max_retry=5)
    def export(message: Message) -> None:
        job = current_job()
        assert job is not None and job.id == message.id
        started.set()
        for step in range(1000):
            job.raise_if_cancelled()
            steps.append(step)
            job.cancelled.wait(0.01)

    dispatcher.register_handler("export", after.append)  # never starts after the cancel
    worker = running_in_a_worker(broker, dispatcher, started)
    jobs.cancel(message.id)
    worker.join(DEADLINE_S)

    assert not worker.is_alive()
    assert 0 < len(steps) < 1000
    assert after == []
    done = record(jobs, message)
    assert done.state is JobState.CANCELLED and done.cancel_requested
    assert done.error is None and done.retry_at is None
    (attempt,) = done.attempts
    assert attempt.outcome == "cancelled" and attempt.error is None
    assert attempt.finished_at is not None
    assert broker.queue_stats()[0].ready == 0 and broker.queue_stats()[0].scheduled == 0, (
        "a retry copy was sent"
    )
    assert failed.queue_stats()[0].ready == 0, "kept in the failed-message store"
    assert dispatcher.stats.cancelled == 1 and dispatcher.stats.retried == 0
    (line,) = [r.getMessage() for r in caplog.records if "cancelled while it ran" in r.getMessage()]
    assert f"#{message.id}" in line and "export stopped" in line
    assert not [r for r in caplog.records if "throws exception" in r.getMessage()]


def test_an_async_handler_s_task_is_cancelled_and_the_job_recorded_cancelled(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("sleep"))
    started = threading.Event()
    cleaned: list[str] = []

    class Sleeper:
        max_retry = 3

        async def handle(self, message: Message) -> bool:
            started.set()
            try:
                await asyncio.sleep(DEADLINE_S * 10)
            finally:
                cleaned.append(message.id)
            return True

    dispatcher = Dispatcher(broker, records=jobs).register_handler("sleep", Sleeper())
    worker = running_in_a_worker(broker, dispatcher, started)
    jobs.cancel(message.id)
    worker.join(DEADLINE_S)

    assert not worker.is_alive(), "the async handler was not cancelled"
    assert cleaned == [message.id], "the task's cleanup did not run before the job ended"
    done = record(jobs, message)
    assert done.state is JobState.CANCELLED and done.retry_at is None
    assert [a.outcome for a in done.attempts] == ["cancelled"]
    assert broker.queue_stats()[0].scheduled == 0, "a retry copy was sent"
    with pytest.raises(JobResultError, match="cancelled"):
        jobs.job(message).result(timeout=1)


def test_a_cancel_before_the_watch_began_still_reaches_the_handler(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("job"))
    seen: list[bool] = []

    def cancels_itself(message: Message) -> None:
        jobs.cancel(message.id)  # as if it came between the start and the first handler
        job = current_job()
        assert job is not None
        seen.append(job.cancelled.wait(DEADLINE_S))
        job.raise_if_cancelled()

    run(broker, Dispatcher(broker, records=jobs).register_handler("job", cancels_itself), 1)

    assert seen == [True]
    assert record(jobs, message).state is JobState.CANCELLED


def test_a_message_back_after_a_cancel_reached_it_running_does_not_run_again(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("job"))
    jobs.start(message, 100)  # a worker took it, and died with it
    jobs.cancel(message.id)
    ran: list[Message] = []

    run(broker, Dispatcher(broker, records=jobs).register_handler("job", ran.append), 1)

    assert ran == []
    done = record(jobs, message)
    assert done.state is JobState.CANCELLED
    assert [a.outcome for a in done.attempts] == [None]


def test_current_job_is_none_outside_a_handler_and_never_cancelled_without_records(
    broker: MemoryDriver,
) -> None:
    seen: list[object] = []
    assert current_job() is None
    message = Message("job")
    broker.send(message)

    def handle(m: Message) -> None:
        job = current_job()
        assert job is current_job()  # one object for the whole run of the handler
        assert job is not None
        job.raise_if_cancelled()  # code that checks runs alike with records off
        seen.append((job.id, job.cancelled.is_set()))

    run(broker, Dispatcher(broker).register_handler("job", handle), 1)

    assert seen == [(message.id, False)]
    assert current_job() is None


def test_a_job_not_started_before_it_expires_is_skipped_and_recorded_expired(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("job"), expires_in=0.05)
    time.sleep(0.1)
    ran: list[Message] = []

    run(broker, Dispatcher(broker, records=jobs).register_handler("job", ran.append), 1)

    assert ran == []
    assert record(jobs, message).state is JobState.EXPIRED
    with pytest.raises(JobResultError, match="expired"):
        jobs.job(message).result(timeout=1)


def test_an_expiry_is_kept_without_records_too(broker: MemoryDriver) -> None:
    emitter = Emitter(broker)
    emitter.emit(Message("job"), expires_in=0.05)
    time.sleep(0.1)
    ran: list[Message] = []
    dispatcher = Dispatcher(broker).register_handler("job", ran.append)

    run(broker, dispatcher, 1)

    assert ran == []
    assert dispatcher.stats.skipped == 1


def test_a_job_handled_in_time_is_not_expired(broker: MemoryDriver, jobs: Jobs) -> None:
    message = emit(broker, jobs, Message("job"), expires_in=60)
    run(broker, Dispatcher(broker, records=jobs).register_handler("job", lambda m: None), 1)

    assert record(jobs, message).state is JobState.SUCCEEDED


def test_result_waits_for_the_job_and_wakes_when_it_ends(broker: MemoryDriver, jobs: Jobs) -> None:
    message = emit(broker, jobs, Message("job"))
    dispatcher = Dispatcher(broker, records=jobs).register_handler("job", lambda m: Result(7))
    later = threading.Timer(0.2, run, args=(broker, dispatcher, 1))
    later.start()
    try:
        assert jobs.job(message).result(timeout=10) == 7
    finally:
        later.join()


def test_result_async_waits_while_the_event_loop_keeps_serving(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("job"))
    dispatcher = Dispatcher(broker, records=jobs).register_handler("job", lambda m: Result(7))
    ticks: list[float] = []

    async def waits() -> Any:
        async def tick() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        ticking = asyncio.ensure_future(tick())
        try:
            return await jobs.job(message).result_async(timeout=10)
        finally:
            ticking.cancel()

    later = threading.Timer(0.3, run, args=(broker, dispatcher, 1))
    later.start()
    try:
        assert asyncio.run(waits()) == 7
    finally:
        later.join()
    assert len(ticks) > 5, "the event loop was blocked while result_async waited"


def test_result_of_an_unknown_id_and_a_timeout_are_errors_that_say_so(jobs: Jobs) -> None:
    with pytest.raises(UnknownJobError, match="no record of job #nope"):
        jobs.job("nope").result(timeout=0.1)
    message = Message("job")
    jobs.emitted(message, 100)
    with pytest.raises(JobTimeoutError, match=r"still waiting after 0\.1 s"):
        jobs.job(message).result(timeout=0.1)


def test_a_result_that_is_not_json_is_the_job_s_error(broker: MemoryDriver, jobs: Jobs) -> None:
    message = emit(broker, jobs, Message("job"))
    dispatcher = Dispatcher(broker, records=jobs).register_handler(
        "job", lambda m: Result(object())
    )

    run(broker, dispatcher, 1)

    done = record(jobs, message)
    assert done.state is JobState.GIVEN_UP and not done.has_result
    assert done.error is not None and "not JSON" in done.error.message


def test_a_result_over_the_limit_is_refused_with_its_size(broker: MemoryDriver, jobs: Jobs) -> None:
    message = emit(broker, jobs, Message("job"))
    dispatcher = Dispatcher(broker, records=jobs).register_handler(
        "job", lambda m: Result("x" * 600_000)
    )

    run(broker, dispatcher, 1)

    done = record(jobs, message)
    assert done.state is JobState.GIVEN_UP
    assert done.error is not None
    assert "600002 bytes as JSON, over the 524288 bytes" in done.error.message


def test_a_secret_in_an_exception_is_redacted_and_a_long_traceback_bounded(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("job"))

    def fails(message: Message) -> None:
        raise RuntimeError("cannot reach https://user:s3cret@pay.example.com/x " + "x" * 20_000)

    run(broker, Dispatcher(broker, records=jobs).register_handler("job", fails), 1)

    error = record(jobs, message).error
    assert error is not None
    assert error.message.startswith("cannot reach https://user:***@pay.example.com/x")
    assert len(error.message) < 2_100 and "characters cut" in error.message
    assert error.traceback is not None and "s3cret" not in error.traceback
    assert len(error.traceback) < 17_000 and "outermost frames cut" in error.traceback
    assert error.traceback.rstrip().endswith("xxx")


def test_a_worker_with_records_on_writes_a_record_for_a_job_emitted_without(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = Message("job")
    Emitter(broker).emit(message)

    run(broker, Dispatcher(broker, records=jobs).register_handler("job", lambda m: None), 1)

    done = record(jobs, message)
    assert done.state is JobState.SUCCEEDED and done.priority == 100


def test_a_store_that_cannot_keep_records_is_refused_naming_those_that_can() -> None:
    from collections.abc import Sequence

    from hermes.core import ConfigurationError
    from hermes.core.driver import Capabilities, Consumer, Delay, Delivery, Driver, Outgoing

    class NoRecords(Driver):
        capabilities = Capabilities(Delivery.AT_MOST_ONCE, Delay.IGNORED, False, False)

        def put(self, items: Sequence[Outgoing], priority: int = 100) -> None: ...

        def consumer(self, priorities: Sequence[int], *, concurrency: int = 1) -> Consumer:
            raise NotImplementedError

    with pytest.raises(ConfigurationError, match="cannot keep job records; name a store"):
        Jobs(NoRecords())


def test_listing_filters_by_state_type_and_priority(broker: MemoryDriver, jobs: Jobs) -> None:
    broker.setup_priority_queue("urgent", 300)
    first = emit(broker, jobs, Message("a"))
    second = emit(broker, jobs, Message("b"))
    third = emit(broker, jobs, Message("a"), priority=300)
    jobs.cancel(second.id)

    assert {r.id for r in jobs.scan()} == {first.id, second.id, third.id}
    assert [r.id for r in jobs.scan(state="cancelled")] == [second.id]
    assert {r.id for r in jobs.scan(type="a")} == {first.id, third.id}
    assert [r.id for r in jobs.scan(priority=300)] == [third.id]
    assert [r.id for r in jobs.scan(type="a", priority=100)] == [first.id]


def test_a_filter_that_matches_few_reads_a_bounded_share_a_page_and_pages_on_to_them(
    broker: MemoryDriver, jobs: Jobs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs_module, "MIN_SCANNED", 10)  # a page reads 10 x 2 records at most
    rare = [emit(broker, jobs, Message("rare")).id for _ in range(5)]
    for _ in range(25):
        emit(broker, jobs, Message("common"))
    reads: list[int] = []
    record_page = jobs.driver.record_page  # type: ignore[attr-defined]

    def counted(after: str | None, limit: int, max_bytes: int, **kw: Any) -> Any:
        page = record_page(after, limit, max_bytes, **kw)
        reads.append(len(page.entries))
        return page

    monkeypatch.setattr(jobs.driver, "record_page", counted)

    first, after = jobs.page(type="rare", limit=2)
    assert first == [] and after is not None and sum(reads) <= 20
    found = []
    while after is not None:
        page, after = jobs.page(after, type="rare", limit=2)
        assert len(page) <= 2
        found += [r.id for r in page]
    # Each once; in creation order but for Redis, which orders one millisecond's by key.
    assert sorted(found) == sorted(rare) and len(set(found)) == len(found)
    oldest, after = jobs.page(type="rare", limit=10, oldest_first=True)
    assert {r.id for r in oldest} == set(rare) and after is None  # 100 reads reach the end


def _race_cancel_against_start() -> tuple[bool, JobRecord]:
    store = Jobs(MemoryDriver(f"race-{uuid.uuid4().hex}"))
    message = Message("job")
    store.emitted(message, 100)
    ran: list[bool] = []
    go = threading.Barrier(2)

    def cancel() -> None:
        go.wait()
        store.cancel(message.id)

    def start() -> None:
        go.wait()
        ran.append(store.start(message, 100).run)

    threads = [threading.Thread(target=cancel), threading.Thread(target=start)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = store.get(message.id)
    assert final is not None
    return ran[0], final


def test_a_concurrent_cancel_and_start_never_both_win() -> None:
    for _ in range(30):
        ran, final = _race_cancel_against_start()
        if ran:  # the start won: the cancel found it running and noted it
            assert final.state is JobState.RUNNING and final.cancel_requested
        else:  # the cancel won: the start skipped it
            assert final.state is JobState.CANCELLED and final.attempts == ()


def test_a_message_past_max_deliveries_is_set_aside_and_given_up_in_its_record(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("kill"))
    dying = MemoryDriver(broker.name, redelivery_timeout_s=0)
    for _ in range(3):  # three workers died holding it: taken, never settled
        consumer = dying.consumer([])
        assert consumer.receive(5.0) is not None
        jobs.start(message, 100)
        consumer.close()
    with broker._broker.condition:  # its lease ran out: back on its queue now
        broker._broker.expire(time.monotonic())
    ran: list[Message] = []
    dispatcher = Dispatcher(broker, records=jobs, max_deliveries=3).register_handler(
        "kill", ran.append
    )

    # A message set aside is not one the run took for its handlers: stop once it is gone.
    Worker(
        broker,
        dispatcher,
        stop_when=lambda: broker.queue_stats()[0].ready == 0,
        handle_signals=False,
    ).run()

    done = record(jobs, message)
    assert ran == []
    assert done.state is JobState.GIVEN_UP
    assert done.error is not None and "max_deliveries=3" in done.error.message
    assert [a.outcome for a in done.attempts] == [None, None, "set_aside"]


def test_a_sweep_marks_lost_only_the_running_jobs_whose_heartbeat_expired(jobs: Jobs) -> None:
    registry = MemoryDriver(f"beats-{uuid.uuid4().hex}")
    here = repr(registry)
    dead, alive, unbeaten, elsewhere = (Message("job") for _ in range(4))
    jobs.start(dead, 100, heartbeat="web-1:10:aa", registry=here)
    jobs.start(alive, 100, heartbeat="web-1:11:bb", registry=here)
    jobs.start(unbeaten, 100)  # its worker publishes no heartbeat: nothing to judge by
    jobs.start(elsewhere, 100, heartbeat="web-2:12:cc", registry="<another registry>")

    marked = jobs.sweep_lost(here, ["web-1:11:bb"])

    assert [r.id for r in marked] == [dead.id]
    lost = record(jobs, dead)
    assert lost.state is JobState.LOST and lost.finished_at is not None
    (attempt,) = lost.attempts
    assert attempt.outcome == "lost" and attempt.heartbeat == "web-1:10:aa"
    for running in (alive, unbeaten, elsewhere):
        kept = record(jobs, running)
        assert kept.state is JobState.RUNNING and kept.attempts[-1].outcome is None
    with pytest.raises(JobResultError, match="lost"):
        jobs.job(dead).result(timeout=1)


class FinalStates:
    """A plugin that keeps what ``hermes_job_finished`` reports."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, JobState, str | None]] = []

    @hookimpl
    def hermes_job_finished(self, record: JobRecord, message: Message | None) -> None:
        self.seen.append((record.id, record.state, message.id if message is not None else None))


@pytest.fixture
def final_states() -> Iterator[FinalStates]:
    plugin = FinalStates()
    plugin_manager().register(plugin)
    yield plugin
    plugin_manager().unregister(plugin)


def test_a_running_worker_sweeps_a_dead_worker_s_job_lost_and_says_so(
    broker: MemoryDriver, jobs: Jobs, final_states: FinalStates
) -> None:
    registry = MemoryDriver(f"beats-{uuid.uuid4().hex}")
    registry.beat({"id": "web-1:11:bb"}, 60)  # another worker, alive
    dead, alive = Message("job"), Message("job")
    jobs.start(dead, 100, heartbeat="web-1:10:aa", registry=repr(registry))
    jobs.start(alive, 100, heartbeat="web-1:11:bb", registry=repr(registry))
    heartbeat = HeartbeatPublisher(registry, interval_s=0.05)
    deadline = time.monotonic() + DEADLINE_S

    Worker(
        broker,
        Dispatcher(broker, records=jobs),
        heartbeat=heartbeat,
        handle_signals=False,
        stop_when=lambda: record(jobs, dead).state.final or time.monotonic() > deadline,
    ).run()

    assert record(jobs, dead).state is JobState.LOST
    assert record(jobs, alive).state is JobState.RUNNING
    assert final_states.seen == [(dead.id, JobState.LOST, None)]


def test_the_final_state_hook_sees_each_job_the_worker_ends(
    broker: MemoryDriver, jobs: Jobs, final_states: FinalStates
) -> None:
    ok, refused, cancelled = (emit(broker, jobs, Message(t)) for t in ("ok", "refused", "ok"))
    expired = emit(broker, jobs, Message("ok"), expires_in=0.01)
    jobs.cancel(cancelled.id)
    time.sleep(0.05)
    dispatcher = Dispatcher(broker, records=jobs)
    dispatcher.register_handler("ok", lambda m: True)
    dispatcher.register_handler("refused", lambda m: False)

    run(broker, dispatcher, 4)

    assert sorted(final_states.seen, key=lambda seen: str(seen[1])) == sorted(
        [
            (ok.id, JobState.SUCCEEDED, ok.id),
            (refused.id, JobState.GIVEN_UP, refused.id),
            (cancelled.id, JobState.CANCELLED, cancelled.id),
            (expired.id, JobState.EXPIRED, expired.id),
        ],
        key=lambda seen: str(seen[1]),
    )


def test_a_record_changed_elsewhere_after_this_object_wrote_it_is_kept_by_its_next_write(
    jobs: Jobs,
) -> None:
    # The worker's Jobs remembers what it wrote at the start and expects it at the
    # end; a cancel from another process changed the record in between.
    message, elsewhere = Message("job"), Jobs(jobs.driver)
    elsewhere.emitted(message, 100)
    assert jobs.start(message, 100).run
    elsewhere.cancel(message.id)
    done = jobs.finish(message, "succeeded", state=JobState.SUCCEEDED)

    stored = record(jobs, message)
    assert done == stored
    assert stored.state is JobState.SUCCEEDED and stored.cancel_requested
    assert [a.outcome for a in stored.attempts] == ["succeeded"]


def test_an_emit_after_the_worker_started_the_job_leaves_running_as_it_is(jobs: Jobs) -> None:
    message, worker_side = Message("job"), Jobs(jobs.driver)
    assert worker_side.start(message, 100).run
    # The emitter expects no record: it finds one, reads it, and writes nothing.
    assert Jobs(jobs.driver).emitted(message, 100) == record(jobs, message)
    assert record(jobs, message).state is JobState.RUNNING


def test_a_worker_reads_no_record_and_never_watches_a_job_that_ends_at_once(
    broker: MemoryDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryDriver(f"records-{uuid.uuid4().hex}")
    reads: list[str] = []
    read = store.record_get

    def counted(key: str) -> bytes | None:
        reads.append(key)
        return read(key)

    monkeypatch.setattr(store, "record_get", counted)
    messages = [Message("job", {"i": i}) for i in range(5)]
    for message in messages:
        emit(broker, Jobs(store), message)  # another process's emitter: nothing remembered
    assert reads == []  # a new record expects none: written without a read
    run(broker, Dispatcher(broker, records=Jobs(store)).register_handler("job", lambda m: None), 5)

    # The start expects what the emitter wrote, which the message says; the finish
    # expects what the start wrote.
    assert reads == []
    assert {record(Jobs(store), m).state for m in messages} == {JobState.SUCCEEDED}


def test_a_start_whose_guess_of_the_emitted_record_is_wrong_reads_it_and_keeps_it(
    broker: MemoryDriver,
) -> None:
    store = MemoryDriver(f"records-{uuid.uuid4().hex}")
    message = Message("job", {"i": 1})
    emit(broker, Jobs(store), message)
    Jobs(store).cancel(message.id)  # the worker's guess is the record as emitted
    ran: list[Message] = []
    run(broker, Dispatcher(broker, records=Jobs(store)).register_handler("job", ran.append), 1)
    assert ran == []  # the cancel, which the guess did not know of, was read and kept
    assert record(Jobs(store), message).state is JobState.CANCELLED


def test_a_jobs_object_remembers_no_ended_record_however_many_results_it_wrote(
    jobs: Jobs,
) -> None:
    for n in range(20):
        message = Message("job", {"n": n})
        jobs.emitted(message, 100)
        assert jobs.start(message, 100).run
        jobs.finish(
            message, "succeeded", state=JobState.SUCCEEDED, result="x" * 10_000, has_result=True
        )
    assert jobs._written == {}  # results can be large: ended records are not kept
