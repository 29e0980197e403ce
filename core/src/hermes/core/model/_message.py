from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datetime

#: How many headers a message may carry, and how long a name and a value may be
#: (in characters). Headers are metadata -- trace context, a correlation id --
#: sent with every copy of the message; a W3C ``tracestate`` is at most 512.
MAX_HEADERS = 64
MAX_HEADER_NAME = 128
MAX_HEADER_VALUE = 4096

#: What a message without headers holds: one shared, read-only empty mapping.
NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def _new_id() -> str:
    """A random (version 4) UUID's text, as ``str(uuid.uuid4())`` writes it.

    Built here from 16 random bytes: importing :mod:`uuid` (and the
    :mod:`platform` it pulls in) was a tenth of ``import hermes.core``.
    """
    h = os.urandom(16).hex()
    variant = "89ab"[int(h[16], 16) & 3]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}"


def _describe(value: Any) -> str:
    """``int 42``: the type and a bounded repr, for an error message."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _timestamp(value: Any) -> float:
    """``execute_at`` as a UNIX timestamp: a number, or a ``datetime`` (naive: local time)."""
    # Not imported for this: a datetime exists only once its module was imported.
    datetime = sys.modules.get("datetime")
    if datetime is not None and isinstance(value, datetime.datetime):
        return float(value.timestamp())
    # Any real number (int, float, Decimal, numpy's) but a bool, which is surely a mistake.
    if hasattr(value, "__float__") and not isinstance(value, bool | str | bytes):
        return float(value)
    raise ValueError(
        "Message execute_at must be a UNIX timestamp (a number, e.g. time.time() + 60) or a "
        f"datetime, got {_describe(value)}"
    )


def _checked_headers(headers: Mapping[str, str] | None) -> Mapping[str, str]:
    """``headers`` as a read-only copy, or a ``ValueError`` naming the bad one."""
    if headers is None:
        return NO_HEADERS
    if not isinstance(headers, Mapping):
        raise ValueError(
            f"Message headers must be a mapping of str to str, got {_describe(headers)}"
        )
    if not headers:
        return NO_HEADERS
    if len(headers) > MAX_HEADERS:
        raise ValueError(f"Message headers: at most {MAX_HEADERS} allowed, got {len(headers)}")
    copied: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"Message header names must be non-empty strings, got {name!r}")
        if len(name) > MAX_HEADER_NAME:
            raise ValueError(
                f"Message header name {name[:40]!r}... is longer than {MAX_HEADER_NAME} characters"
            )
        if not isinstance(value, str):
            raise ValueError(f"Message header {name!r} must be a string, got {_describe(value)}")
        if len(value) > MAX_HEADER_VALUE:
            raise ValueError(
                f"Message header {name!r} is longer than {MAX_HEADER_VALUE} characters "
                f"({len(value)})"
            )
        copied[name] = value
    return MappingProxyType(copied)


@dataclass(frozen=True, slots=True, init=False)
class Message:
    """One job: a type that selects the handlers, and a JSON payload for them.

    Immutable. A retry is a new ``Message`` made with :meth:`replace`. Priority
    is not part of the message: it is chosen per ``send()``.

    Construction refuses, with a ``ValueError`` naming the field, what a PHP
    Hermes worker on the same queue could not take: a type or id that is not a
    string, and a payload that is not a dict, a list or ``None`` (PHP's
    ``Message`` takes ``?array``; a string or number payload makes its worker die
    with the message already taken off the queue). Values inside the payload are
    checked when it is serialized, at ``send()``.

    ``headers`` are short string pairs that travel with the message and every
    retry copy (trace context, a correlation id, who emitted it): at most
    :data:`MAX_HEADERS`, names up to :data:`MAX_HEADER_NAME` characters, values
    up to :data:`MAX_HEADER_VALUE`. They are kept read-only; a message with
    none serializes to exactly the PHP Hermes envelope.
    """

    #: Selects the handlers registered with ``Dispatcher.register_handler(type, ...)``.
    type: str
    #: A dict (a JSON object), a list, or ``None`` when the job needs no data.
    payload: Any
    #: A UUID4 string unless given; ``None`` or an empty string gets a fresh UUID.
    id: str
    #: UNIX timestamp (float seconds) of creation; kept across retries.
    created: float
    #: UNIX timestamp before which the message should not run, or ``None``.
    execute_at: float | None
    #: How many times this job was retried before (0 for a fresh message).
    retries: int
    #: Read-only ``str -> str`` metadata, empty unless given; kept by :meth:`replace`.
    #: (Left out of ``hash()``, so a message without a payload stays hashable.)
    headers: Mapping[str, str] = field(hash=False)

    def __init__(
        self,
        type: str,
        payload: dict[str, Any] | list[Any] | None = None,
        *,
        id: str | None = None,
        created: float | None = None,
        execute_at: float | datetime.datetime | None = None,
        retries: int = 0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(type, str) or not type:
            raise ValueError(f"Message type must be a non-empty string, got {type!r}")
        if id is not None and not isinstance(id, str):
            raise ValueError(f"Message id must be a string (or None for a new one), got {id!r}")
        if payload is not None and not isinstance(payload, dict | list):
            raise ValueError(
                "Message payload must be a dict, a list or None (a JSON object or array), "
                f"got {_describe(payload)}"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"Message retries must be an int >= 0, got {retries!r}")
        if execute_at is not None:
            execute_at = _timestamp(execute_at)
        setattr_ = object.__setattr__
        setattr_(self, "type", type)
        setattr_(self, "payload", payload)
        setattr_(self, "id", id or _new_id())
        setattr_(self, "created", time.time() if created is None else float(created))
        setattr_(self, "execute_at", execute_at)
        setattr_(self, "retries", retries)
        setattr_(self, "headers", _checked_headers(headers))

    def replace(self, **changes: Any) -> Message:
        """A copy with some fields changed (``id`` and ``created`` are kept unless given)."""
        fields: dict[str, Any] = {
            "type": self.type,
            "payload": self.payload,
            "id": self.id,
            "created": self.created,
            "execute_at": self.execute_at,
            "retries": self.retries,
            "headers": self.headers,
        }
        unknown = changes.keys() - fields.keys()
        if unknown:
            raise TypeError(f"Message has no field(s) {sorted(unknown)}")
        fields.update(changes)
        return Message(**fields)
