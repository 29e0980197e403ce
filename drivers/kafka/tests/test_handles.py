"""librdkafka handles are destroyed only in the process that made them, whatever forks meanwhile."""

from __future__ import annotations

import gc
import os
import signal
import time
import weakref
from typing import Any

from confluent_kafka.admin import AdminClient

from hermes.drivers.kafka import _handles

#: Nothing listens there: the clients never connect, and need not.
_CONFIG = {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}
#: How long a child may take to check and exit (it takes milliseconds).
_CHILD_S = 20.0


def _admin() -> AdminClient:
    return AdminClient(dict(_CONFIG))


def _in_child(check: Any) -> int | None:
    """Run ``check()`` in a forked child: its exit code (0: it returned True), None if it hung."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if check() else 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + _CHILD_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)  # a join on the parent's threads never returns
    os.waitpid(pid, 0)
    return None


def test_a_discarded_handle_is_destroyed_once_nothing_else_holds_it() -> None:
    holder = _handles.Handles().per_process(_admin)
    handle = holder.get()
    gone = weakref.ref(handle)
    holder.discard()
    _handles.destroy_unused()
    assert gone() is handle, "a retired handle still held elsewhere was destroyed"
    del handle
    _handles.destroy_unused()
    assert gone() is None, "a retired handle nothing holds was not destroyed"


def _fails_holding(holder: Any) -> None:
    handle = holder.get()  # noqa: F841 - the traceback's frame holds it
    raise RuntimeError("a failure whose traceback holds a handle")


def test_a_forked_child_never_destroys_the_parents_handles() -> None:
    live = _handles.Handles().per_process(_admin)
    retired = _handles.Handles().per_process(_admin)
    live_ref = weakref.ref(live.get())

    def kept_after_dropping_everything() -> bool:
        live.discard()  # the child's holder lets go of the parent's handle
        gc.collect()  # the cycle holding the retired one is collected here
        _handles.destroy_unused()
        return live_ref() is not None and retired_ref() is not None

    gc.disable()  # the parent must not collect the cycle below before the fork
    try:
        # The shape that crashed children: a discarded handle still held by the
        # traceback of an exception in a reference cycle, garbage not yet collected.
        try:
            _fails_holding(retired)
        except RuntimeError as exc:
            exc.cycle = exc  # type: ignore[attr-defined]
        retired_ref = weakref.ref(retired.get())
        retired.discard()
        assert retired_ref() is not None, "the traceback no longer holds the handle"
        outcome = _in_child(kept_after_dropping_everything)
    finally:
        gc.enable()

    assert outcome == 0, (
        "the child destroyed a parent's handle"
        if outcome == 3
        else f"the child did not exit cleanly (exit code {outcome}; None: it hung)"
    )
    assert live_ref() is not None, "the parent lost its live handle"
    gc.collect()
    _handles.destroy_unused()
    assert retired_ref() is None, "the parent kept a retired handle nothing holds any more"
    live.discard()
    _handles.destroy_unused()
    assert live_ref() is None, "the parent kept a handle its holder discarded"


def test_a_childs_own_handles_are_destroyed_in_the_child() -> None:
    def own_destroyed() -> bool:
        holder = _handles.Handles().per_process(_admin)
        ref = weakref.ref(holder.get())
        holder.discard()
        _handles.destroy_unused()
        return ref() is None

    assert _in_child(own_destroyed) == 0
