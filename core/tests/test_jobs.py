"""Job records on the memory store: each path a job can take, its states and attempts."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from hermes.core import Dispatcher, Emitter, Message, Result, Worker
from hermes.core.driver import MemoryDriver
from hermes.core.jobs import (
    JobRecord,
    JobResultError,
    Jobs,
    JobState,
    JobTimeoutError,
    UnknownJobError,
)


@pytest.fixture
def broker() -> MemoryDriver:
    return MemoryDriver(f"jobs-{uuid.uuid4().hex}")


@pytest.fixture
def jobs() -> Jobs:
    return Jobs(MemoryDriver(f"records-{uuid.uuid4().hex}"))


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


def test_cancelling_a_running_job_is_noted_and_its_attempt_ends_as_it_ends(
    broker: MemoryDriver, jobs: Jobs
) -> None:
    message = emit(broker, jobs, Message("job"))
    started, release = threading.Event(), threading.Event()

    def blocks(message: Message) -> Result:
        started.set()
        release.wait(10)
        return Result("done")

    dispatcher = Dispatcher(broker, records=jobs).register_handler("job", blocks)
    worker = threading.Thread(target=run, args=(broker, dispatcher, 1))
    worker.start()
    assert started.wait(10)
    noted = jobs.cancel(message.id)
    release.set()
    worker.join(10)

    assert noted.state is JobState.RUNNING and noted.cancel_requested
    done = record(jobs, message)
    assert done.state is JobState.SUCCEEDED and done.cancel_requested


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


def test_listing_filters_by_state_and_type(broker: MemoryDriver, jobs: Jobs) -> None:
    first = emit(broker, jobs, Message("a"))
    second = emit(broker, jobs, Message("b"))
    jobs.cancel(second.id)

    assert {r.id for r in jobs.scan()} == {first.id, second.id}
    assert [r.id for r in jobs.scan(state="cancelled")] == [second.id]
    assert [r.id for r in jobs.scan(type="a")] == [first.id]


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
