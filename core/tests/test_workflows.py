"""Workflows on each records store: chains, groups, callbacks, failures, nesting, cancel,
and the bookkeeping that counts a step once however many times it is delivered."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hermes_test_services as services
import pytest

from hermes.core import Dispatcher, Message, Result, Worker, connect
from hermes.core.driver import Driver, SupportsTeardown
from hermes.core.drivertools import MemoryDriver, isolated_url
from hermes.core.jobs import Jobs, JobState
from hermes.core.workflows import (
    FANOUT,
    WORKFLOW_HEADER,
    WorkflowHandle,
    Workflows,
    chain,
    group,
    job,
)

DEADLINE_S = 60.0


@pytest.fixture(params=["memory", "filesystem", "redis", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    """The queue and the records on one driver of each kind, in a namespace of the test's own."""
    tag = f"wf-{uuid.uuid4().hex[:12]}"
    if request.param == "memory":
        driver: Driver = MemoryDriver(tag)
    elif request.param == "filesystem":
        driver = connect(f"file://{tmp_path / 'queue'}?fsync=false")
    elif request.param == "redis":
        driver = connect(isolated_url(services.ensure_redis(), tag))
    else:
        driver = connect(isolated_url(f"{services.ensure_postgres()}?table=hermes_test_wf", tag))
    yield driver
    if isinstance(driver, SupportsTeardown):
        driver.teardown()
    driver.close()


class Fleet:
    """A worker on its own thread running the test's handlers; what each ran, in order."""

    def __init__(self, driver: Driver, concurrency: int = 4) -> None:
        self.driver = driver
        self.jobs = Jobs(driver)
        self.flows = Workflows(driver, self.jobs)
        self.ran: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        self.dispatcher = Dispatcher(driver, records=self.jobs, concurrency=concurrency)
        self.worker = Worker(driver, self.dispatcher, handle_signals=False)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def handler(
        self, type_: str, returns: Any = None, fails: bool = False, wait: Any = None
    ) -> None:
        def handle(message: Message) -> Any:
            with self.lock:
                self.ran.append((type_, message.payload))
            if wait is not None:
                wait.wait(DEADLINE_S)
            if fails:
                raise RuntimeError(f"{type_} broke")
            value = returns(message) if callable(returns) else returns
            return Result(value)

        self.dispatcher.register_handler(type_, handle)

    def types(self) -> list[str]:
        with self.lock:
            return [t for t, _ in self.ran]

    def __enter__(self) -> Fleet:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive()


def ended(handle: WorkflowHandle) -> str:
    return handle.wait(timeout=DEADLINE_S)


def test_a_chain_runs_its_steps_in_order_each_receiving_the_previous_result(
    store: Driver,
) -> None:
    with Fleet(store) as fleet:
        fleet.handler("fetch", returns=[1, 2, 3])
        fleet.handler("total", returns=lambda m: sum(m.payload["numbers"]["result"]))
        fleet.handler("report", returns=lambda m: f"total {m.payload['total']['result']}")
        handle = fleet.flows.start(
            chain(
                job("fetch", {"url": "x"}),
                job("total", {}, receive="numbers"),
                job("report", {"to": "ops"}, receive="total"),
            )
        )
        assert ended(handle) == "succeeded"
    assert fleet.types() == ["fetch", "total", "report"]
    assert handle.results() == "total 6"
    tree = handle.tree()
    assert [c["state"] for c in tree["children"]] == ["succeeded"] * 3
    assert tree["children"][2]["type"] == "report"


def test_a_callback_runs_once_after_every_member_with_their_outcomes_in_order(
    store: Driver,
) -> None:
    with Fleet(store) as fleet:
        fleet.handler("square", returns=lambda m: m.payload["n"] ** 2)
        fleet.handler("sum", returns=lambda m: sum(o["result"] for o in m.payload["all"]["result"]))
        handle = fleet.flows.start(
            chain(
                group(job("square", {"n": n}) for n in range(8)),
                job("sum", {}, receive="all"),
            )
        )
        assert ended(handle) == "succeeded"
    counts = Counter(fleet.types())
    assert counts == {"square": 8, "sum": 1}
    assert fleet.types()[-1] == "sum"
    assert handle.results() == sum(n * n for n in range(8))


def test_a_failed_member_stops_the_chain_by_default_and_the_callback_never_runs(
    store: Driver,
) -> None:
    with Fleet(store) as fleet:
        fleet.handler("ok")
        fleet.handler("broken", fails=True)
        fleet.handler("callback")
        handle = fleet.flows.start(
            chain(group(job("ok"), job("broken"), job("ok")), job("callback", {}, receive="x"))
        )
        assert ended(handle) == "failed"
        time.sleep(0.3)  # a callback sent by mistake would have run by now
    assert "callback" not in fleet.types()
    group_branch, callback = handle.tree()["children"]
    assert [m["state"] for m in group_branch["children"]] == ["succeeded", "given_up", "succeeded"]
    assert callback["state"] == "not sent"


def test_on_failure_continue_runs_the_callback_with_the_failures_listed(store: Driver) -> None:
    with Fleet(store) as fleet:
        fleet.handler("ok", returns="fine")
        fleet.handler("broken", fails=True)
        fleet.handler("report", returns=lambda m: [o["state"] for o in m.payload["all"]["result"]])
        handle = fleet.flows.start(
            chain(
                group(job("ok"), job("broken")),
                job("report", {}, receive="all"),
                on_failure="continue",
            )
        )
        assert ended(handle) == "failed"  # a member failed; the callback still ran
    assert Counter(fleet.types())["report"] == 1
    report = next(payload for t, payload in fleet.ran if t == "report")
    first, second = report["all"]["result"]
    assert first == {"state": "succeeded", "result": "fine", "error": None}
    assert second["state"] == "given_up" and "RuntimeError: broken broke" in second["error"]


def test_groups_of_chains_and_chains_of_groups_nest(store: Driver) -> None:
    with Fleet(store) as fleet:
        fleet.handler("a", returns=lambda m: m.payload["n"])
        fleet.handler("b", returns=lambda m: m.payload["prev"]["result"] * 10)
        fleet.handler("done")
        handle = fleet.flows.start(
            chain(
                group(chain(job("a", {"n": n}), job("b", {}, receive="prev")) for n in range(3)),
                group(job("a", {"n": 7}), job("a", {"n": 8})),
                job("done", {}, receive="last"),
            )
        )
        assert ended(handle) == "succeeded"
    assert Counter(fleet.types()) == {"a": 5, "b": 3, "done": 1}
    done = next(payload for t, payload in fleet.ran if t == "done")
    assert [o["result"] for o in done["last"]["result"]] == [7, 8]
    first_group = handle.tree()["children"][0]
    assert [c["kind"] for c in first_group["children"]] == ["chain"] * 3


def test_a_group_bigger_than_a_record_counts_is_split_and_still_in_order(store: Driver) -> None:
    n = FANOUT * 2 + 5
    with Fleet(store, concurrency=8) as fleet:
        fleet.handler("member", returns=lambda m: m.payload["i"])
        fleet.handler(
            "collect", returns=lambda m: [o["result"] for o in m.payload["all"]["result"]]
        )
        handle = fleet.flows.start(
            chain(
                group(job("member", {"i": i}) for i in range(n)), job("collect", {}, receive="all")
            )
        )
        assert ended(handle) == "succeeded"
    assert handle.results() == list(range(n))
    assert len(handle.tree()["children"][0]["children"]) == n  # the parts do not show


def test_a_step_delivered_again_or_sent_twice_runs_once_and_counts_once(store: Driver) -> None:
    gate = threading.Event()
    with Fleet(store) as fleet:
        fleet.handler("slow", wait=gate)
        fleet.handler("fast")
        fleet.handler("callback")
        handle = fleet.flows.start(chain(group(job("slow"), job("fast")), job("callback")))
        slow_id = f"{handle.id}.0.0"
        fast_id = f"{handle.id}.0.1"

        def state(job_id: str) -> JobState | None:
            record = fleet.jobs.get(job_id)
            return None if record is None else record.state

        deadline = time.monotonic() + DEADLINE_S
        while (state(slow_id), state(fast_id)) != (JobState.RUNNING, JobState.SUCCEEDED):
            assert time.monotonic() < deadline, (state(slow_id), state(fast_id))
            time.sleep(0.02)
        # A second send of each (a worker killed between a send and its mark sends
        # again): the running one's copy has another token, the ended one's ended.
        fleet.flows._send(slow_id, job("slow"), None)
        fleet.flows._send(fast_id, job("fast"), None)
        # And the ended one's own message delivered again, same token (a worker
        # killed after its record ended, before its ack).
        (token,) = {m.headers[WORKFLOW_HEADER] for m in [_first_sent(fleet, fast_id)]}
        store.send(Message("fast", None, id=fast_id, headers={WORKFLOW_HEADER: token}))
        time.sleep(0.3)
        assert Counter(fleet.types()) == {"slow": 1, "fast": 1}
        gate.set()
        assert ended(handle) == "succeeded"
        deadline = time.monotonic() + DEADLINE_S
        while fleet.dispatcher.stats.skipped < 3:  # the three copies, acknowledged unrun
            assert time.monotonic() < deadline, fleet.dispatcher.stats
            time.sleep(0.02)
        time.sleep(0.3)
    assert Counter(fleet.types()) == {"slow": 1, "fast": 1, "callback": 1}


def _first_sent(fleet: Fleet, job_id: str) -> Message:
    """The step's message as it was first sent: its token is in its record."""
    record = fleet.jobs.get(job_id)
    assert record is not None and record.token is not None
    return Message("fast", None, id=job_id, headers={WORKFLOW_HEADER: record.token})


def test_a_cancelled_workflow_sends_no_further_step_and_says_cancelled(store: Driver) -> None:
    gate = threading.Event()
    with Fleet(store) as fleet:
        fleet.handler("first", wait=gate)
        fleet.handler("second")
        handle = fleet.flows.start(chain(group(job("first"), job("first")), job("second")))
        deadline = time.monotonic() + DEADLINE_S
        while fleet.types().count("first") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        handle.cancel()
        gate.set()
        assert ended(handle) == "cancelled"
        time.sleep(0.3)
    assert "second" not in fleet.types()


def test_a_workflow_started_again_with_its_id_sends_nothing_twice(store: Driver) -> None:
    with Fleet(store) as fleet:
        fleet.handler("once")
        flow = chain(group(job("once"), job("once")), job("once"))
        handle = fleet.flows.start(flow, workflow_id="wf-order-7")
        again = fleet.flows.start(flow, workflow_id="wf-order-7")
        assert ended(handle) == "succeeded" and again.id == handle.id
        time.sleep(0.3)
    assert fleet.types() == ["once"] * 3


def test_a_workflow_outliving_half_its_records_ttl_keeps_its_tree_readable() -> None:
    """A node's spec is written once; a node still written past half of the records'
    ttl writes it again, so a reader without the spec cached still sees the tree."""
    driver = MemoryDriver(f"wf-{uuid.uuid4().hex[:12]}")
    fleet = Fleet(driver)
    fleet.jobs = Jobs(driver, ttl_s=3.0)  # the spec: 4.5 s after it was written
    fleet.flows = Workflows(driver, fleet.jobs)
    fleet.dispatcher = Dispatcher(driver, records=fleet.jobs, concurrency=1)
    fleet.worker = Worker(driver, fleet.dispatcher, handle_signals=False)
    fleet.thread = threading.Thread(target=fleet.worker.run, daemon=True)
    for name in ("a", "b", "c"):
        fleet.dispatcher.register_handler(name, lambda message: time.sleep(1.6))
    with fleet:
        handle = fleet.flows.start(chain(job("a"), job("b"), job("c")))
        assert ended(handle) == "succeeded"
    # The chain ran 4.8 s at least: its first spec would be gone by now.
    fresh = Workflows(driver, Jobs(driver, ttl_s=3.0))
    tree = fresh.tree(handle.id)
    assert tree["kind"] == "chain", tree
    # Step a's own record is gone by now (3 s after it ended); its parent says how it ended.
    assert [(c["type"], c["state"]) for c in tree["children"]] == [
        ("a", "succeeded"),
        ("b", "succeeded"),
        ("c", "succeeded"),
    ], tree


def test_a_workflow_is_made_of_jobs_chains_and_groups_only(driver: MemoryDriver) -> None:
    from hermes.core import ConfigurationError

    with pytest.raises(ConfigurationError, match="holds job"):
        chain(job("a"), "b")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="needs at least one step"):
        group([])
    with pytest.raises(ConfigurationError, match="payload must be a dict"):
        job("a", [1], receive="x")
    with pytest.raises(ConfigurationError, match='on_failure must be "stop" or "continue"'):
        chain(job("a"), on_failure="skip")  # type: ignore[arg-type]
    flows = Workflows(driver, Jobs(driver))
    with pytest.raises(ConfigurationError, match="starts with 'wf-'"):
        flows.start(chain(job("a")), workflow_id="order-7")


def test_a_step_whose_worker_died_on_an_at_most_once_broker_ends_lost_and_the_rest_follows(
    store: Driver,
) -> None:
    from hermes.core.heartbeat import HeartbeatPublisher

    jobs = Jobs(store)
    flows = Workflows(store, jobs)
    handle = flows.start(chain(group(job("gone"), job("fine")), job("after", {}, receive="all")))
    # The first member was taken by a worker that then died: its message is gone
    # (at most once) and its record says running on a heartbeat no longer beating.
    registry = MemoryDriver(f"beats-{uuid.uuid4().hex}")
    dispatcher = Dispatcher(store, records=jobs)
    ran: list[str] = []
    dispatcher.register_handler("fine", lambda m: ran.append("fine"))
    dispatcher.register_handler("after", lambda m: ran.append("after"))
    dispatcher.register_handler("gone", lambda m: ran.append("gone"))
    taken = _take_one(store, "gone")
    jobs.start(
        taken,
        100,
        heartbeat="web-1:10:dead",
        registry=repr(registry),
        token=taken.headers[WORKFLOW_HEADER],
    )
    deadline = time.monotonic() + DEADLINE_S
    Worker(
        store,
        dispatcher,
        heartbeat=HeartbeatPublisher(registry, interval_s=0.05),
        handle_signals=False,
        stop_when=lambda: handle.state != "running" or time.monotonic() > deadline,
    ).run()
    assert handle.state == "failed"  # a member was lost: the chain stops there
    assert ran == ["fine"]
    states = [m["state"] for m in handle.tree()["children"][0]["children"]]
    assert states == ["lost", "succeeded"]


def _take_one(store: Driver, type_: str) -> Message:
    """Take the first waiting message (of ``type_``) off the queue, as a worker that dies does."""
    taken: list[Message] = []

    def keep(message: Message, priority: int) -> bool:
        taken.append(message)
        return True

    while not taken:
        Worker(store, keep, handle_signals=False, max_items=1).run()
        if taken[-1].type != type_:
            store.send(taken.pop())
    return taken[0]
