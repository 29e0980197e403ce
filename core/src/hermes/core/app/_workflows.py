"""Workflows: chains and groups of jobs whose next steps are sent once, even when workers die.

A workflow is a tree. Its leaves are jobs (:func:`job`); a :func:`chain` runs
its steps one after another, the next once the previous ended (and, unless
told ``on_failure="continue"``, succeeded); a :func:`group` runs its members
at once and ends when all of them have. A callback on a group's completion
(Celery's chord, a Sidekiq batch's ``on_complete``) is a chain of the group
and the callback job. Any node nests in any other.

Every node has an id: the root's is ``wf-<uuid>``, a child's its parent's id,
a dot, and its place (``wf-1f0c….2.0``). A leaf's message has that id, so
its job record (:class:`~hermes.core.jobs.Jobs`) is the leaf's state, and a
composite node keeps a small record of its own in the same store: which of
its children ended, and how. What the node is (its spec: the subtree under
it) is written once, beside that record, so the record rewritten as children
end stays small however big the tree. Everything is decided by
compare-and-set on those records, so any worker may take any step:

* When a step's job reaches a final state, the worker that ran it (before it
  acknowledges the message) adds the outcome to its parent's record under the
  child's place. Adding is idempotent: a message delivered again after its
  worker died finds its outcome there and adds nothing, so a member counts
  once however many times it is delivered.
* The write that completes a group, or ends a chain's step, decides what
  follows: the chain's next step is sent, or the node's own outcome goes up to
  its parent. The sender then marks the step sent. A worker killed between
  the send and the mark leaves the step unmarked; the member's message comes
  back (at-least-once), finds it unmarked and sends it again.
* So a step may be sent twice; it never runs twice. Each send of a step
  carries a fresh token (:data:`WORKFLOW_HEADER`); the first copy to start
  writes its token into the step's job record, and a copy with another token
  is acknowledged without running (:meth:`Jobs.start`). A copy delivered
  again after its step ended is acknowledged too, after the bookkeeping above.

On a broker that does not deliver a dead worker's message again (Redis by
default), a step whose worker died is marked ``lost`` by the workers' sweep
(:meth:`Jobs.sweep_lost`), which then counts it as ended like any other.

Big groups are split: a group of more than :data:`FANOUT` members is counted
through groups of at most that many (one record each), which its results and
its tree do not show, so no record is written more than ``FANOUT`` times by
its members.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from hermes.core.app._jobs import WORKFLOW_HEADER, JobRecord, Jobs, JobState
from hermes.core.model._errors import ConfigurationError, HermesError, JobTimeoutError
from hermes.core.model._message import Message, _new_id
from hermes.core.spi._door import translate_errors
from hermes.core.spi._driver import DEFAULT_PRIORITY, SupportsTally

if TYPE_CHECKING:
    from hermes.core.spi._driver import Driver, SupportsRecords

logger = logging.getLogger("hermes")

#: How a workflow's root id starts; a step's id is its parent's, a dot and its place.
ROOT_PREFIX = "wf-"
#: The most children one record counts; a bigger group is split into groups of this many.
FANOUT = 64
#: Compare-and-set rounds before a change gives up.
_MAX_ROUNDS = 200
#: Nodes whose spec a process keeps, to count their members without reading them.
_SPECS_KEPT = 4096
#: A node's spec is kept this many times the records' ``ttl_s`` (see :meth:`_NodeState.spec_due`).
SPEC_TTL_FACTOR = 1.5

OnFailure = Literal["stop", "continue"]


# What a workflow is made of ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Job:
    """A leaf: one message of ``type`` with ``payload``.

    ``receive``: the payload key under which this job gets the outcome of the
    chain's previous step (see :func:`outcome_of`; a group's ``result`` is the
    list of its members' outcomes, in member order). The payload must then be
    a dict.
    """

    type: str
    payload: Any = None
    priority: int = DEFAULT_PRIORITY
    receive: str | None = None


@dataclass(frozen=True, slots=True)
class Chain:
    """Steps one after another; ``on_failure``: ``stop`` (the default) or ``continue``."""

    steps: tuple[Node, ...]
    on_failure: OnFailure = "stop"


@dataclass(frozen=True, slots=True)
class Group:
    """Members run at once; the group ends when every member has."""

    members: tuple[Node, ...]
    #: Made by splitting a big group: counted like a group, shown as its members.
    part: bool = False


Node = Job | Chain | Group


def job(
    type: str, payload: Any = None, *, priority: int = DEFAULT_PRIORITY, receive: str | None = None
) -> Job:
    """A workflow's leaf: a message of ``type`` (see :class:`Job`)."""
    if not isinstance(type, str) or not type:
        raise ConfigurationError(f"a job's type must be a non-empty string, got {type!r}")
    if receive is not None and payload is not None and not isinstance(payload, dict):
        raise ConfigurationError(
            f"job {type!r} receives the previous step under {receive!r}: its payload must be "
            f"a dict (or None), not {payload!r}"
        )
    return Job(type, payload, priority, receive)


def chain(*steps: Node | Iterable[Node], on_failure: OnFailure = "stop") -> Chain:
    """Steps run one after another; the next once the previous succeeded.

    ``on_failure="continue"`` runs the next step whatever the previous one's
    outcome (a callback that reports failures); ``"stop"`` (the default) ends
    the chain at the first step that did not succeed, and the steps after it
    are never sent.
    """
    if on_failure not in ("stop", "continue"):
        raise ConfigurationError(f'on_failure must be "stop" or "continue", not {on_failure!r}')
    flat = _nodes(steps, "chain")
    return Chain(flat, on_failure)


def group(*members: Node | Iterable[Node]) -> Group:
    """Members run at once (``group(job(...) for ...)`` works too)."""
    return Group(_nodes(members, "group"))


def _nodes(given: Sequence[Node | Iterable[Node]], what: str) -> tuple[Node, ...]:
    found: list[Node] = []
    for item in given:
        if isinstance(item, Job | Chain | Group):
            found.append(item)
        elif isinstance(item, Iterable) and not isinstance(item, str | bytes | Mapping):
            for each in item:
                if not isinstance(each, Job | Chain | Group):
                    raise _not_a_node(what, each)
                found.append(each)
        else:
            raise _not_a_node(what, item)
    if not found:
        raise ConfigurationError(f"a {what} needs at least one step")
    return tuple(found)


def _not_a_node(what: str, item: object) -> ConfigurationError:
    return ConfigurationError(f"a {what} holds job(), chain() and group(), not {item!r}")


def _split(node: Node) -> Node:
    """``node`` with every group of more than :data:`FANOUT` members counted through parts."""
    if isinstance(node, Job):
        return node
    if isinstance(node, Chain):
        return Chain(tuple(_split(step) for step in node.steps), node.on_failure)
    members = tuple(_split(member) for member in node.members)
    while len(members) > FANOUT:
        members = tuple(
            Group(members[i : i + FANOUT], part=True) for i in range(0, len(members), FANOUT)
        )
    return Group(members, node.part)


def to_json(node: Node) -> dict[str, Any]:
    """``node`` as the JSON a composite record keeps, to send its later steps from."""
    if isinstance(node, Job):
        data: dict[str, Any] = {"job": node.type, "payload": node.payload}
        if node.priority != DEFAULT_PRIORITY:
            data["priority"] = node.priority
        if node.receive is not None:
            data["receive"] = node.receive
        return data
    if isinstance(node, Chain):
        return {"chain": [to_json(s) for s in node.steps], "on_failure": node.on_failure}
    data = {"group": [to_json(m) for m in node.members]}
    if node.part:
        data["part"] = True
    return data


def from_json(data: Mapping[str, Any]) -> Node:
    if "job" in data:
        return Job(
            data["job"], data.get("payload"), data.get("priority", DEFAULT_PRIORITY),
            data.get("receive"),
        )  # fmt: skip
    if "chain" in data:
        return Chain(tuple(from_json(s) for s in data["chain"]), data.get("on_failure", "stop"))
    return Group(tuple(from_json(m) for m in data["group"]), bool(data.get("part")))


def _children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Chain):
        return node.steps
    if isinstance(node, Group):
        return node.members
    return ()


# Outcomes ---------------------------------------------------------------------------

#: How an ended node is summed up in its parent's record and given to a ``receive``.
Outcome = dict[str, Any]


def outcome_of(record: JobRecord) -> Outcome:
    """A job's outcome: ``{"state": ..., "result": ..., "error": "Class: message" | None}``."""
    return {
        "state": record.state.value,
        "result": record.result if record.has_result else None,
        "error": None if record.error is None or record.state is JobState.SUCCEEDED
        else str(record.error),
    }  # fmt: skip


def _succeeded(outcome: Outcome) -> bool:
    return bool(outcome.get("state") == JobState.SUCCEEDED.value)


# The records of composite nodes ----------------------------------------------------


def _node_key(node_id: str) -> str:
    return f"workflow:{node_id}"


def _spec_key(node_id: str) -> str:
    return f"workflow-spec:{node_id}"


def _tally_key(node_id: str) -> str:
    return f"workflow-members:{node_id}"


def parent_of(node_id: str) -> tuple[str, int] | None:
    """``(parent id, place)`` of a step; None for a root or an id that is not a step's."""
    if not node_id.startswith(ROOT_PREFIX) or "." not in node_id:
        return None
    parent, _, place = node_id.rpartition(".")
    return (parent, int(place)) if place.isdigit() else None


def root_of(node_id: str) -> str:
    return node_id.split(".", 1)[0]


@dataclass
class _NodeState:
    """A composite node's record: what ended among its children, and what was sent.

    What the node is lives in a record of its own (:func:`_spec_key`), written once.
    """

    #: Place -> outcome of each child that ended.
    done: dict[str, Outcome] = dataclasses.field(default_factory=dict)
    #: Places of the children whose messages were sent (a group: all at once).
    sent: list[int] = dataclasses.field(default_factory=list)
    #: running, succeeded, failed or cancelled.
    state: str = "running"
    created_at: float = dataclasses.field(default_factory=time.time)
    #: When the spec was last written (with the node, then by :meth:`spec_due` writes).
    spec_at: float = dataclasses.field(default_factory=time.time)
    finished_at: float | None = None
    #: The root only: a cancel was asked; no further step is sent.
    cancelled: bool = False

    def to_bytes(self) -> bytes:
        # Not dataclasses.asdict(): it deep-copies the spec and the outcomes on every
        # write, which made a chain of 300 steps spend nine tenths of its time there.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return json.dumps(fields, separators=(",", ":")).encode()

    def spec_due(self, ttl_s: float) -> bool:
        """Whether this write of the record should write the spec again, to outlive it.

        A record is kept ``ttl_s`` after its last write, the spec
        :data:`SPEC_TTL_FACTOR` times that after it was written: a record
        written within half of ``ttl_s`` of the spec's last write goes first;
        a later one writes the spec again (once per half ``ttl_s``).
        """
        return time.time() - self.spec_at > ttl_s / 2

    @classmethod
    def from_bytes(cls, data: bytes) -> _NodeState:
        return cls(**json.loads(data))


class Workflows:
    """Starts workflows and keeps their bookkeeping, in the job-record store of ``jobs``.

    ``driver`` is where the steps' messages are sent (the workers' broker).
    A worker's :class:`~hermes.core.Dispatcher` given ``records=`` makes one
    itself and keeps the bookkeeping as its steps end; an application makes
    one to start workflows and follow them::

        flows = Workflows(driver, jobs)
        handle = flows.start(chain(group(job("resize", {"n": n}) for n in range(10)),
                                   job("notify", {}, receive="sizes")))
        handle.wait(timeout=60)
    """

    def __init__(self, driver: Driver, jobs: Jobs) -> None:
        self.driver = driver
        self.jobs = jobs
        self._store: SupportsRecords = jobs._store
        # Asked once: a protocol's isinstance() costs more than the member's bookkeeping.
        self._tally = self._store if isinstance(self._store, SupportsTally) else None
        # Node id -> what the node is, for the nodes this process counted children of.
        self._specs: dict[str, Node] = {}
        self._specs_lock = threading.Lock()

    # Starting ------------------------------------------------------------------

    def start(self, workflow: Node, *, workflow_id: str | None = None) -> WorkflowHandle:
        """Send ``workflow``'s first steps; its handle.

        ``workflow_id`` (``wf-...``) makes a start that is tried again after a
        crash idempotent: steps already sent are not sent twice by it, and a
        step sent twice never runs twice.
        """
        if isinstance(workflow, Job):
            workflow = Chain((workflow,))
        if not isinstance(workflow, Chain | Group):
            raise ConfigurationError(f"a workflow is a chain() or a group(), not {workflow!r}")
        root = workflow_id or f"{ROOT_PREFIX}{_new_id()}"
        if not root.startswith(ROOT_PREFIX) or "." in root:
            raise ConfigurationError(f"a workflow id starts with {ROOT_PREFIX!r} and has no dot")
        self._send(root, _split(workflow), None)
        return WorkflowHandle(self, root)

    def handle(self, workflow_id: str) -> WorkflowHandle:
        return WorkflowHandle(self, workflow_id)

    def _send(self, node_id: str, node: Node, received: Any) -> None:
        """Send ``node`` (a leaf's message, or the first children of a composite)."""
        if isinstance(node, Job):
            self._send_job(node_id, node, received)
            return
        state = self._create(node_id, node)
        if state.state != "running":
            return
        places = [0] if isinstance(node, Chain) else list(range(len(_children(node))))
        self._send_children(node_id, node, places, state, received)

    def _send_children(
        self, node_id: str, node: Node, places: list[int], state: _NodeState, received: Any
    ) -> None:
        children = _children(node)
        for place in places:
            if place in state.sent:
                continue
            self._send(f"{node_id}.{place}", children[place], received)
        self._mark_sent(node_id, places)

    def _send_job(self, node_id: str, node: Job, received: Any) -> None:
        payload = node.payload
        if node.receive is not None:
            payload = {**(payload or {}), node.receive: received}
        token = os.urandom(8).hex()
        message = Message(node.type, payload, id=node_id, headers={WORKFLOW_HEADER: token})
        self.jobs.emitted(message, node.priority)
        with translate_errors(self.driver, f"sending workflow step #{node_id}"):
            self.driver.send(message, node.priority)

    # The records of composite nodes ---------------------------------------------

    def _read(self, node_id: str) -> tuple[_NodeState | None, bytes | None]:
        with translate_errors(self.driver, f"reading workflow node {node_id}"):
            data = self._store.record_get(_node_key(node_id))
        return (None if data is None else _NodeState.from_bytes(data)), data

    def _write(self, node_id: str, state: _NodeState, expect: bytes | None) -> bool:
        if state.spec_due(self.jobs.ttl_s):
            # Before the record that says so: a write that then loses its
            # compare-and-set has only kept the spec a little longer.
            self._keep_spec(node_id)
            state.spec_at = time.time()
        with translate_errors(self.driver, f"writing workflow node {node_id}"):
            return self._store.record_put(
                _node_key(node_id), state.to_bytes(), self.jobs.ttl_s, expect
            )

    def _create(self, node_id: str, node: Node) -> _NodeState:
        # The spec first: a node whose record exists always has its spec.
        self._put_spec(node_id, node)
        for _ in range(_MAX_ROUNDS):
            state, _ = self._read(node_id)
            if state is not None:
                return state
            state = _NodeState()
            if self._write(node_id, state, None):
                return state
        raise _busy(node_id)

    def _put_spec(self, node_id: str, node: Node) -> None:
        body = json.dumps(to_json(node), separators=(",", ":")).encode()
        with translate_errors(self.driver, f"writing workflow node {node_id}"):
            # Refused when there is one already: a start tried again with the
            # same workflow id, whose tree is the same.
            self._store.record_put(_spec_key(node_id), body, self._spec_ttl_s, None)

    @property
    def _spec_ttl_s(self) -> float:
        return self.jobs.ttl_s * SPEC_TTL_FACTOR

    def _keep_spec(self, node_id: str) -> None:
        """Write the spec again, as it is, so it is kept as long as the node's record."""
        with translate_errors(self.driver, f"writing workflow node {node_id}"):
            data = self._store.record_get(_spec_key(node_id))
            if data is not None:
                self._store.record_put(_spec_key(node_id), data, self._spec_ttl_s, data)

    def _mark_sent(self, node_id: str, places: list[int]) -> None:
        for _ in range(_MAX_ROUNDS):
            state, data = self._read(node_id)
            if state is None or all(p in state.sent for p in places):
                return
            state.sent = sorted(set(state.sent) | set(places))
            if self._write(node_id, state, data):
                return
        raise _busy(node_id)

    # A step ended ------------------------------------------------------------------

    def step_ended(self, record: JobRecord) -> None:
        """``record`` (a workflow step's job) is final: count it, and send what follows.

        Idempotent: called again for the same record (its message delivered
        again), it counts nothing twice and sends only what is still unsent.
        """
        if not record.state.final:
            return
        self._ended(record.id, outcome_of(record))

    def _ended(self, node_id: str, outcome: Outcome) -> None:
        while True:
            parent = parent_of(node_id)
            if parent is None:
                return  # the root ended: its record says so
            parent_id, place = parent
            ended = self._count(parent_id, place, outcome)
            if ended is None:
                return
            node_id, outcome = parent_id, ended

    def _count(self, node_id: str, place: int, outcome: Outcome) -> Outcome | None:
        """Add child ``place``'s ``outcome`` to ``node_id``; its own outcome once it ended.

        A group on a store with :class:`~hermes.core.driver.SupportsTally` is
        counted there, one call per member, and its record is written only by
        the members that find the count complete; otherwise each child's
        outcome goes into the node's record by compare-and-set.
        """
        node = self._spec(node_id)
        if node is None:
            logger.error(
                "Workflow node %s has no record (expired, or deleted): step %s.%d ended "
                "%s and nothing follows it",
                node_id,
                node_id,
                place,
                outcome.get("state"),
            )
            return None
        counted: dict[str, Outcome] | None = None
        tally = self._tally
        if tally is not None and isinstance(node, Group):
            key = _tally_key(node_id)
            value = json.dumps(outcome, separators=(",", ":")).encode()
            with translate_errors(self.driver, f"counting the members of workflow node {node_id}"):
                _, count = tally.tally_add(key, str(place), value, self.jobs.ttl_s)
                if count < len(node.members):
                    return None
                counted = {k: json.loads(v) for k, v in tally.tally_read(key).items()}
        return self._decide(node_id, node, place, outcome, counted)

    def _decide(
        self,
        node_id: str,
        node: Node,
        place: int,
        outcome: Outcome,
        counted: dict[str, Outcome] | None,
    ) -> Outcome | None:
        """The compare-and-set on ``node_id``'s record that adds ``outcome`` and decides."""
        root = root_of(node_id)
        for _ in range(_MAX_ROUNDS):
            state, data = self._read(node_id)
            if state is None:
                return None
            changed = False
            for key, each in [*(counted or {}).items(), (str(place), outcome)]:
                if key not in state.done:
                    state.done[key] = each
                    changed = True
            following: int | None = None
            if state.state == "running":
                ended = isinstance(node, Chain) or len(state.done) == len(_children(node))
                if ended and self._cancelled(root, node_id, state):
                    state.state = "cancelled"
                elif isinstance(node, Group):
                    if len(state.done) == len(node.members):
                        state.state = _summed(state.done.values())
                elif isinstance(node, Chain):
                    last = place == len(node.steps) - 1
                    if not _succeeded(outcome) and node.on_failure == "stop":
                        state.state = "failed"
                    elif last:
                        state.state = _summed(state.done.values())
                    else:
                        following = place + 1
                if state.state != "running":
                    state.finished_at = time.time()
                    changed = True
            if changed and not self._write(node_id, state, data):
                continue
            if following is not None and following not in state.sent:
                step = _children(node)[following]
                received = state.done[str(place)]
                self._send(f"{node_id}.{following}", step, received)
                self._mark_sent(node_id, [following])
            if state.state == "running":
                return None
            return self._outcome(node, state)
        raise _busy(node_id)

    def _spec(self, node_id: str) -> Node | None:
        """What ``node_id`` is (it never changes: kept for the next member of the same node)."""
        node = self._specs.get(node_id)
        if node is None:
            with translate_errors(self.driver, f"reading workflow node {node_id}"):
                data = self._store.record_get(_spec_key(node_id))
            if data is None:
                return None
            node = from_json(json.loads(data))
            with self._specs_lock:
                self._specs[node_id] = node
                if len(self._specs) > _SPECS_KEPT:
                    del self._specs[next(iter(self._specs))]
        return node

    def _outcome(self, node: Node, state: _NodeState) -> Outcome:
        done = state.done
        if isinstance(node, Group):
            members = [done.get(str(i)) for i in range(len(node.members))]
            result: Any = _flattened(node, members)
        else:
            steps = [int(p) for p in done]
            result = done[str(max(steps))].get("result") if steps else None
        return {"state": _state_value(state.state), "result": result, "error": None}

    def _cancelled(self, root: str, node_id: str, state: _NodeState) -> bool:
        if node_id == root:
            return state.cancelled
        top, _ = self._read(root)
        return top is not None and top.cancelled

    # Cancelling ------------------------------------------------------------------------

    def cancel(self, workflow_id: str) -> None:
        """No further step is sent; waiting steps are cancelled, running ones told."""
        for _ in range(_MAX_ROUNDS):
            state, data = self._read(workflow_id)
            if state is None:
                raise HermesError(f"no workflow {workflow_id} in {self.driver!r}")
            if state.cancelled:
                break
            state.cancelled = True
            if self._write(workflow_id, state, data):
                break
        else:
            raise _busy(workflow_id)
        for step_id in self._sent_steps(workflow_id):
            record = self.jobs.get(step_id)
            if record is not None and not record.state.final:
                self.jobs.cancel(step_id)

    def _sent_steps(self, node_id: str) -> list[str]:
        """The ids of every job sent under ``node_id``."""
        state, _ = self._read(node_id)
        if state is None:
            return [node_id]
        found: list[str] = []
        node = self._spec(node_id)
        if node is None:
            return [node_id]
        for place in state.sent:
            child = _children(node)[place]
            child_id = f"{node_id}.{place}"
            found += [child_id] if isinstance(child, Job) else self._sent_steps(child_id)
        return found

    # Reading ---------------------------------------------------------------------------

    def is_node(self, node_id: str) -> bool:
        """Whether ``node_id`` is a chain or a group of a workflow this store keeps."""
        return node_id.startswith(ROOT_PREFIX) and self._read(node_id)[0] is not None

    def tree(self, node_id: str) -> dict[str, Any]:
        """The node and everything under it: kind, id, state, and children or the job's record."""
        state, _ = self._read(node_id)
        if state is None:
            record = self.jobs.get(node_id)
            return {
                "kind": "job",
                "id": node_id,
                "type": record.type if record is not None else None,
                "state": record.state.value if record is not None else "not sent",
            }
        node = self._spec(node_id)
        if node is None:  # its spec expired before its record
            return {"kind": "node", "id": node_id, "state": state.state, "children": []}
        children: list[dict[str, Any]] = []
        for place, child in enumerate(_children(node)):
            child_id = f"{node_id}.{place}"
            if place not in state.sent and str(place) not in state.done:
                kind = "job" if isinstance(child, Job) else type(child).__name__.lower()
                children.append({"kind": kind, "id": child_id, "state": "not sent"})
                continue
            branch = self.tree(child_id)
            if branch["kind"] == "job" and branch["type"] is None and isinstance(child, Job):
                # Its record is gone (kept ttl_s after it ended): its parent still says.
                ended = state.done.get(str(place))
                forgotten = "record expired" if ended is None else ended.get("state")
                branch = {**branch, "type": child.type, "state": forgotten}
            if isinstance(child, Group) and child.part:
                children += branch["children"]
            else:
                children.append(branch)
        kind = "chain" if isinstance(node, Chain) else "group"
        return {"kind": kind, "id": node_id, "state": state.state, "children": children}


def _flattened(node: Group, members: list[Outcome | None]) -> list[Outcome | None]:
    """A group's member outcomes in order, the parts of a split group opened up."""
    found: list[Outcome | None] = []
    for member, outcome in zip(node.members, members, strict=True):
        if isinstance(member, Group) and member.part:
            found += outcome.get("result") or [] if outcome else [None] * len(member.members)
        else:
            found.append(outcome)
    return found


def _summed(outcomes: Iterable[Outcome]) -> str:
    states = [o.get("state") for o in outcomes]
    if all(s == JobState.SUCCEEDED.value for s in states):
        return "succeeded"
    if any(s == JobState.CANCELLED.value for s in states):
        return "cancelled"
    return "failed"


def _state_value(state: str) -> str:
    """A composite node's state as a job's outcome says it (failed: given up)."""
    return {"succeeded": "succeeded", "cancelled": "cancelled"}.get(state, "given_up")


def _busy(node_id: str) -> HermesError:
    return HermesError(
        f"the record of workflow node {node_id} kept changing under {_MAX_ROUNDS} writes"
    )


class WorkflowHandle:
    """One workflow as the code that started it sees it: state, tree, results, cancel."""

    def __init__(self, workflows: Workflows, workflow_id: str) -> None:
        self.workflows = workflows
        self.id = workflow_id

    @property
    def state(self) -> str | None:
        """``running``, ``succeeded``, ``failed``, ``cancelled``; None when there is no record."""
        state, _ = self.workflows._read(self.id)
        return None if state is None else state.state

    def tree(self) -> dict[str, Any]:
        """Each node with its state; a job's is its record's (see :meth:`Workflows.tree`)."""
        return self.workflows.tree(self.id)

    def results(self) -> Any:
        """Once ended: a group's member outcomes in order, or a chain's last step's result."""
        state, _ = self.workflows._read(self.id)
        if state is None:
            raise HermesError(f"no workflow {self.id}")
        node = self.workflows._spec(self.id)
        if node is None:
            raise HermesError(f"no workflow {self.id}")
        return self.workflows._outcome(node, state)["result"]

    def wait(self, timeout: float | None = None) -> str:
        """Block until the workflow ended; its state. :class:`JobTimeoutError` at ``timeout``.

        The store wakes the wait when the workflow's record changes (pub/sub,
        LISTEN/NOTIFY, a condition), as :meth:`JobHandle.result` waits.
        """
        flows = self.workflows
        deadline = None if timeout is None else time.monotonic() + timeout
        state, data = flows._read(self.id)
        while True:
            if state is not None and state.state != "running":
                return state.state
            left = 60.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                now = "not started" if state is None else state.state
                raise JobTimeoutError(f"workflow {self.id} is still {now} after {timeout:g} s")
            with translate_errors(flows.driver, f"waiting on workflow {self.id}"):
                data = flows._store.record_wait(_node_key(self.id), data, min(left, 60.0))
            state = None if data is None else _NodeState.from_bytes(data)

    def cancel(self) -> None:
        self.workflows.cancel(self.id)

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.id}>"
