"""What belongs to one process: its clients across ``fork()``, and the owner ids it writes."""

from __future__ import annotations

import logging
import os
import socket
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

logger = logging.getLogger("hermes")

_holders: weakref.WeakSet[PerProcess[object]] = weakref.WeakSet()


class PerProcess(Generic[T]):
    """A client made on first use in each process, and never used by another.

    A driver created before ``os.fork()`` (gunicorn and uWSGI pre-fork) keeps
    its clients here: in the child, :meth:`get` makes a new one and leaves the
    parent's alone — neither used nor closed, since closing a socket the
    parent still uses could tear down the parent's session. The holder's lock
    is renewed in the child, so a fork taken while another thread held it
    cannot deadlock the child.

    ``close`` is how a client is closed; an error while closing is logged.
    """

    def __init__(self, factory: Callable[[], T], close: Callable[[T], None] | None = None) -> None:
        self._factory = factory
        self._close = close
        self._lock = threading.Lock()
        self._value: T | None = None
        self._pid = 0
        _holders.add(self)  # type: ignore[arg-type]

    def get(self) -> T:
        """This process's client, made now if it has none."""
        value, pid = self._value, os.getpid()
        if value is not None and self._pid == pid:
            return value
        with self._lock:
            if self._value is None or self._pid != pid:
                self._value = self._factory()
                self._pid = pid
            return self._value

    def peek(self) -> T | None:
        """This process's client if it has made one; never makes one."""
        return self._value if self._pid == os.getpid() else None

    def discard(self) -> None:
        """Close and forget this process's client; the next :meth:`get` makes a new one."""
        with self._lock:
            value = self.peek()
            self._value = None
            self._pid = 0
        if value is not None and self._close is not None:
            try:
                self._close(value)
            except Exception as exc:
                # The client is already broken or gone; a failed close changes nothing.
                logger.debug("closing a discarded client failed - %s", exc)

    close = discard

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()


def owner_id() -> str:
    """A new ``host:pid:random`` id, for what a consumer writes where it holds messages.

    The lease, claim or lock a consumer takes names its owner with one of
    these, so an operator can tell which worker holds what (host and pid), and
    two consumers never share one: not those of one process, not a pid reused
    on the host or in another container. Call it where the consumer starts
    taking, in the process that takes: a child of ``fork()`` needs its own.
    """
    # os.urandom is what secrets.token_hex reads, without importing hmac and hashlib.
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


def _renew_locks() -> None:
    for holder in list(_holders):
        holder._after_fork_in_child()


os.register_at_fork(after_in_child=_renew_locks)
