"""HermesBackend without a worker: what it sends, what it refuses, how it reads records."""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from typing import Any

import hermes_test_services as services
import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import AsyncClient, override_settings
from hermes_django_tests.harness import Queue, on_commit_backend
from hermes_django_tests.settings import tasks_setting
from hermes_django_tests.shop.tasks import add, label

from hermes.core import Emitter, Message, connect
from hermes.core.jobs import Jobs
from hermes.django import HermesBackend, periodic
from hermes.django._compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
    task_backends,
    task_enqueued,
)


def queued_bodies(queue: Queue, key: str = "hermes") -> list[dict[str, Any]]:
    """The messages waiting in the set ``key`` (the default priority's unless told)."""
    bodies = queue.client.smembers(f"{queue.prefix}{key}")
    return [json.loads(body)["message"] for body in bodies]


def test_enqueue_sends_the_task_path_and_its_arguments_under_the_results_id(queue: Queue) -> None:
    result = add.enqueue(2, b=3)

    assert result.status == TaskResultStatus.READY
    assert result.args == [2] and result.kwargs == {"b": 3}
    [body] = queued_bodies(queue)
    assert body["type"] == "hermes_django_tests.shop.tasks.add"
    assert body["payload"] == {"args": [2], "kwargs": {"b": 3}}
    assert body["id"] == result.id


def test_a_fetched_result_of_a_job_not_yet_started_is_ready() -> None:
    result = add.enqueue(1, 1)

    fetched = add.get_result(result.id)

    assert fetched.status == TaskResultStatus.READY
    assert fetched.id == result.id
    assert fetched.enqueued_at is not None and fetched.started_at is None
    assert fetched.worker_ids == [] and fetched.errors == []


def test_arguments_that_are_not_json_are_refused_before_anything_is_sent(queue: Queue) -> None:
    with pytest.raises(TypeError, match=r"args\[1\] is a builtins.object, not JSON"):
        add.enqueue(1, object())
    with pytest.raises(TypeError, match=r"kwargs\['b'\]\[0\] is a builtins.set"):
        add.enqueue(1, b=[{1, 2}])
    with pytest.raises(TypeError, match=r"args\[0\] is nan"):
        add.enqueue(math.nan, 1)
    with pytest.raises(TypeError, match=r"key 1 is a int"):
        add.enqueue({1: "a"}, 1)

    assert queue.keys() == []


def test_a_priority_without_a_queue_is_refused_naming_the_option() -> None:
    with pytest.raises(
        InvalidTask, match=r'add it to OPTIONS\["priorities"\] \(now \[10, 0, -10\]\)'
    ):
        add.using(priority=5)


def test_django_priorities_go_to_hermes_priority_100_plus_p(queue: Queue) -> None:
    label.using(priority=10).enqueue("high")
    label.using(priority=-10).enqueue("low")
    label.enqueue("default")

    assert [b["payload"]["args"] for b in queued_bodies(queue, "hermes_priority_110")] == [["high"]]
    assert [b["payload"]["args"] for b in queued_bodies(queue, "hermes_priority_90")] == [["low"]]
    assert [b["payload"]["args"] for b in queued_bodies(queue)] == [["default"]]


def test_a_queue_not_in_queues_is_refused() -> None:
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid"):
        add.using(queue_name="nowhere")


def test_an_unknown_id_does_not_exist() -> None:
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("no-such-job")


def test_a_record_of_a_plain_hermes_job_is_no_task_result(queue: Queue) -> None:
    message = Message("shop.ping", {"n": 1})
    driver, jobs = connect(queue.url), Jobs(queue.url)
    try:
        Emitter(driver, records=jobs).emit(message)
    finally:
        jobs.close()
        driver.close()

    with pytest.raises(TaskResultDoesNotExist, match=r"'shop\.ping', which is not a Django task"):
        default_task_backend.get_result(message.id)


def test_supports_flags_say_what_the_backend_does(queue: Queue) -> None:
    backend = task_backends["default"]
    without_results = HermesBackend("other", {"OPTIONS": {"url": queue.url}})

    assert isinstance(backend, HermesBackend)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_priority) == (
        True,
        True,
        True,
    )
    assert backend.supports_get_result is True
    assert without_results.supports_get_result is False
    with pytest.raises(NotImplementedError, match=r'give OPTIONS\["results_url"\]'):
        without_results.get_result("any")


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({}, r'OPTIONS\["url"\] must be a Hermes broker URL'),
        ({"url": "memory://x", "result_url": "memory://y"}, r"unknown OPTIONS \['result_url'\]"),
        ({"url": "memory://x", "priorities": [300]}, r"holds 300: each must be a whole number"),
        ({"url": "memory://x", "queue_urls": {"elsewhere": "memory://y"}}, "not in QUEUES"),
        ({"url": "memory://x", "enqueue_on_commit": "yes"}, "must be True or False"),
    ],
)
def test_bad_options_are_improperly_configured_naming_the_alias(
    options: dict[str, Any], error: str
) -> None:
    backend = HermesBackend("mine", {"QUEUES": ["default"], "OPTIONS": options})
    # Django builds every backend for its system checks: the check says what is wrong...
    [problem] = backend.check()
    assert problem.id == "hermes_django.E001"
    assert re.search(r'TASKS\["mine"\].*' + error, problem.msg), problem.msg
    # ...and a backend used anyway refuses, naming the same.
    with pytest.raises(ImproperlyConfigured, match=r'TASKS\["mine"\].*' + error):
        backend.enqueue(add, [1, 2], {})


def test_aget_result_leaves_the_event_loop_free_while_the_store_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = task_backends["default"]
    result = add.enqueue(1, 2)
    read = backend.get_result

    def slow_get_result(result_id: str) -> Any:
        time.sleep(0.3)
        return read(result_id)

    monkeypatch.setattr(backend, "get_result", slow_get_result)

    async def main() -> tuple[Any, int]:
        ticks = 0
        done = False

        async def tick() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        fetched = await backend.aget_result(result.id)
        done = True
        await ticker
        return fetched, ticks

    fetched, ticks = asyncio.run(main())

    assert fetched.id == result.id and fetched.status == TaskResultStatus.READY
    assert ticks >= 10, f"the loop ran {ticks} times in 0.3 s: aget_result blocked it"


def test_aenqueue_sends_like_enqueue(queue: Queue) -> None:
    result = asyncio.run(add.aenqueue(4, 5))

    [body] = queued_bodies(queue)
    assert body["id"] == result.id and body["payload"] == {"args": [4, 5], "kwargs": {}}


def test_a_periodic_entry_in_settings_that_names_no_task_is_a_system_check_error() -> None:
    backend = HermesBackend(
        "mine",
        {
            "QUEUES": ["default"],
            "OPTIONS": {
                "url": "memory://periodic",
                "periodic": {
                    "nightly": {"task": "hermes_django_tests.shop.tasks.nope", "every": 60}
                },
            },
        },
    )
    [problem] = backend.check()
    assert problem.id == "hermes_django.E002"
    assert "['nightly']" in problem.msg and "hermes_django_tests.shop.tasks.nope" in problem.msg


@pytest.mark.parametrize(
    ("when", "error"),
    [
        ({}, "give every= .seconds. or cron="),
        ({"every": 60, "cron": "0 3 * * *"}, "one of them"),
        ({"every": 0}, "above 0"),
    ],
)
def test_periodic_needs_every_or_cron_and_nothing_else(when: dict[str, Any], error: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=error):
        periodic(**when)


@pytest.mark.parametrize("enqueue_on_commit", [False, True], ids=["at-once", "on-commit"])
def test_task_enqueued_is_sent_once_the_message_is_and_never_for_a_rolled_back_enqueue(
    queue: Queue, enqueue_on_commit: bool
) -> None:
    got: list[tuple[type, str, str, int]] = []

    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        waiting = queue.client.scard(f"{queue.prefix}hermes")
        got.append((sender, task_result.id, task_result.status.value, waiting))

    class Rollback(Exception):
        pass

    task_enqueued.connect(receiver)
    try:
        with on_commit_backend(queue, enqueue_on_commit):
            with pytest.raises(Rollback), transaction.atomic():
                rolled_back = label.enqueue("rolled back")
                raise Rollback
            with transaction.atomic():
                committed = label.enqueue("committed")
                before_commit = list(got)
    finally:
        task_enqueued.disconnect(receiver)

    if enqueue_on_commit:
        assert before_commit == []
        assert got == [(HermesBackend, committed.id, "READY", 1)]
    else:
        assert got == [
            (HermesBackend, rolled_back.id, "READY", 1),
            (HermesBackend, committed.id, "READY", 2),
        ]
        assert before_commit == got


def test_an_async_view_enqueuing_through_a_stalled_broker_leaves_other_requests_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``CLIENT PAUSE`` holds the enqueue's write on the broker while another request is served.

    The broker is a redis-server of the test's own: a pause of the machine's
    would stall every other test using it.
    """
    with services.redis_server() as url, override_settings(TASKS=tasks_setting(url, None)):
        broker: redis.Redis[bytes] = redis.Redis.from_url(url)
        add.enqueue(0, 0)  # the backend's connection is open before the stall
        emitting = threading.Event()
        emit = Emitter.emit

        def spied_emit(self: Emitter, *args: Any, **kwargs: Any) -> Any:
            emitting.set()
            return emit(self, *args, **kwargs)

        monkeypatch.setattr(Emitter, "emit", spied_emit)

        async def main() -> tuple[int, bool, int]:
            client = AsyncClient()
            broker.execute_command("CLIENT", "PAUSE", "60000", "WRITE")
            try:
                stalled = asyncio.create_task(client.post("/enqueue"))
                deadline = time.monotonic() + 30
                while not emitting.is_set():
                    assert time.monotonic() < deadline, "the view never reached the broker"
                    await asyncio.sleep(0.01)
                pong = await client.get("/ping")
                still_stalled = not stalled.done()
            finally:
                broker.execute_command("CLIENT", "UNPAUSE")
            enqueued = await stalled
            return pong.status_code, still_stalled, enqueued.status_code

        assert asyncio.run(main()) == (200, True, 202)
        assert broker.scard("hermes") == 2, "both enqueues reached the broker"
        broker.close()
