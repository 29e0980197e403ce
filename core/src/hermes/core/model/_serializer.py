from __future__ import annotations

import json
import math
import re
import sys
from typing import Any, Protocol, runtime_checkable

from hermes.core.model._errors import SerializeError
from hermes.core.model._message import Message

#: How much of a bad input an error message quotes.
QUOTE_LIMIT = 200

_encoder = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


@runtime_checkable
class Serializer(Protocol):
    """Turns messages into text for the broker and back.

    ``unserialize`` raises :class:`SerializeError` -- never another exception
    type -- for anything that is not a message, whatever the input.
    """

    def serialize(self, message: Message) -> str: ...

    def unserialize(self, data: str | bytes) -> Message: ...


def _quote(data: str | bytes) -> str:
    if isinstance(data, bytes):
        text = data[:QUOTE_LIMIT].decode("utf-8", errors="backslashreplace")
    else:
        text = data[:QUOTE_LIMIT]
    return text + ("..." if len(data) > QUOTE_LIMIT else "")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of range")
    return number


# Built once: json.loads with options builds a new decoder on every call.
_decoder = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def _is_number(value: Any) -> bool:
    """A finite JSON number a float can hold (not a bool, not 10**400)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def unencodable(payload: Any) -> str | None:
    """Where in ``payload`` the first value JSON cannot hold is, what it is and the fix.

    ``payload['order']['paid_at'] is a datetime: ...``; None when every value
    encodes (the failure was elsewhere, e.g. a payload that contains itself).
    Walked without recursion: a payload may be nested deeper than the stack.
    """
    seen: set[int] = set()
    pending: list[tuple[str, str, Any]] = [("payload", "value", payload)]
    while pending:
        path, name, value = pending.pop()
        if isinstance(value, str | int | bool) or value is None:
            continue
        if isinstance(value, float):
            if math.isfinite(value):
                continue
            return f"{path} is {value!r}: JSON has no NaN or Infinity; send None or a string"
        if isinstance(value, dict | list):
            if id(value) in seen:
                return f"{path} holds itself: JSON cannot hold a circular payload"
            seen.add(id(value))
            if isinstance(value, list):
                items = [(f"{path}[{i}]", name, item) for i, item in enumerate(value)]
            else:
                for key in value:
                    if not isinstance(key, str | int | float | bool) and key is not None:
                        return f"{path} has the key {key!r}: JSON object keys are strings"
                items = [(f"{path}[{k!r}]", str(k), item) for k, item in value.items()]
            pending.extend(reversed(items))
            continue
        return f"{path} is a {type(value).__name__}: {_fix(value, name)}"
    return None


def _fix(value: Any, name: str) -> str:
    """How to send ``value`` in a payload instead."""
    # Not imported for these: a date or a Decimal exists only once its module was imported.
    datetime = sys.modules.get("datetime")
    if datetime is not None and isinstance(value, datetime.date | datetime.time):
        return f"JSON has no dates; send {name}.isoformat() (or a UNIX timestamp)"
    decimal = sys.modules.get("decimal")
    if decimal is not None and isinstance(value, decimal.Decimal):
        return f"send str({name}) to keep every digit (or float({name}))"
    if isinstance(value, set | frozenset):
        return f"JSON has no sets; send sorted({name}) or list({name})"
    if isinstance(value, bytes | bytearray):
        return "JSON holds text; send a decoded str, or base64.b64encode(...).decode()"
    if isinstance(value, tuple):
        return f"send list({name})"
    return "a payload holds only str, int, float, bool, None, list and dict"


class MessageSerializer:
    """The PHP Hermes 4.x JSON envelope, in the same key order::

        {"message":{"id":"…","type":"…","created":1764480000.123,"payload":{…}|null,
                    "execute_at":1764480016.5|null,"retries":0}}

    Compatible with PHP's by value, not byte for byte: each side reads what the
    other writes, but the text differs, and so may a message PHP wrote again (a
    PHP retry copy). PHP's ``json_encode`` writes ``"a\\/b"`` where Python writes
    ``"a/b"``, ``1.0e+20`` for ``1e+20``, and ``2`` for a float ``2.0`` (which then
    reads as an int). Output escapes non-ASCII as ``\\uXXXX`` as PHP does; input
    may use any JSON escape.

    PHP has no empty object apart from an empty array: it writes an empty payload
    as ``[]``, which decodes here to ``{}``. Deeper down it cannot tell them apart
    either, so a nested ``{}`` that goes through a PHP retry comes back as ``[]``.

    Reading takes what PHP Hermes 4.x's ``unserialize`` takes, normalised as PHP
    does: no ``id`` (or null, or ``""``) gets a fresh UUID; no ``created`` (or
    null, or 0) is the time the message is read; ``execute_at`` and ``retries``
    are read as PHP's ``floatval`` and ``intval`` read them (``"2"`` is 2, a
    non-numeric string 0) and a negative ``retries`` is 0; a missing ``payload``
    is null. What PHP's worker would die on -- a ``type`` that is not a
    string, an ``id`` that is not a string, a ``created`` that is not a number,
    a payload that is not an object, an array or null -- raises
    :class:`SerializeError` naming the field, and so does an empty ``type``
    (PHP takes it; a Hermes message always has a type).

    A message with headers gets one more key, after ``retries``:
    ``"headers":{"traceparent":"…"}``. It is written only when there are
    headers, so a message without them is the PHP envelope, byte for byte as
    this serializer wrote it before headers existed. PHP Hermes ignores the
    key (and its retry copies lose it). Reading, a ``headers`` that is not an
    object of strings within :class:`Message`'s limits is a
    :class:`SerializeError` that names it; ``[]`` and ``null`` mean none.
    """

    def serialize(self, message: Message) -> str:
        envelope = {
            "message": {
                "id": message.id,
                "type": message.type,
                "created": message.created,
                "payload": message.payload,
                "execute_at": message.execute_at,
                "retries": message.retries,
            }
        }
        if message.headers:
            envelope["message"]["headers"] = dict(message.headers)
        try:
            return _encoder.encode(envelope)
        except (TypeError, ValueError, RecursionError) as exc:
            found = unencodable(message.payload)
            why = found if found is not None else str(exc)
            raise SerializeError(f"Cannot serialize message {message.id}: {why}") from exc

    def unserialize(self, data: str | bytes) -> Message:
        try:
            # NaN, Infinity and 1e400 are refused like PHP's json_decode does: a
            # payload holding them could never be serialized again (for a retry).
            # Bodies are UTF-8 on every broker Hermes speaks to.
            text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
            decoded = _decoder.decode(text)
        except (ValueError, RecursionError) as exc:
            # UnicodeDecodeError is a ValueError: invalid UTF-8 lands here too.
            raise SerializeError(f"Cannot unserialize message from '{_quote(data)}'", data) from exc
        except TypeError as exc:
            raise SerializeError(
                f"Cannot unserialize message from a {type(data).__name__}", None
            ) from exc
        body = decoded.get("message") if isinstance(decoded, dict) else None
        if not isinstance(body, dict):
            raise SerializeError(f"Cannot unserialize message from '{_quote(data)}'", data)
        try:
            message = self._message_from(body)
        except (ValueError, OverflowError) as exc:
            raise SerializeError(
                f"Invalid message format in '{_quote(data)}': {exc}", data
            ) from exc
        headers = body.get("headers")
        # PHP writes an empty array as [], and null is as good as no key.
        if headers is None or headers == []:
            return message
        try:
            if not isinstance(headers, dict):
                raise ValueError(f"headers must be a JSON object, got {type(headers).__name__}")
            return message.replace(headers=headers)
        except ValueError as exc:
            raise SerializeError(
                f"Invalid message headers in '{_quote(data)}': {exc}", data
            ) from exc

    @staticmethod
    def _message_from(body: dict[str, Any]) -> Message:
        # Read as PHP Hermes 4.x's MessageSerializer reads it (strict_types, PHP's
        # Message constructor): what PHP takes is taken and normalised the same way,
        # what PHP would die on raises ValueError with the field and the reason.
        id_ = body.get("id")
        if id_ is not None and not isinstance(id_, str):
            raise ValueError(f"id must be a string, got {_kind(id_)}")
        type_ = body.get("type")
        if not isinstance(type_, str) or not type_:
            raise ValueError(f"type must be a non-empty string, got {_kind(type_)}")
        created = body.get("created")
        if created is not None and not _is_number(created):
            raise ValueError(f"created must be a number or absent, got {_kind(created)}")
        payload = body.get("payload")
        if payload == []:
            payload = {}
        if payload is not None and not isinstance(payload, dict | list):
            raise ValueError(f"payload must be an object, an array or null, got {_kind(payload)}")
        execute_at = body.get("execute_at")
        if execute_at is not None:
            execute_at = _php_float(execute_at)
            if not math.isfinite(execute_at):
                raise ValueError(f"execute_at is out of range: {_kind(body['execute_at'])}")
        retries = body.get("retries")
        return Message(
            type_,
            payload,
            id=id_,
            # PHP takes a missing, null or 0 created as "now", the time it was read.
            created=float(created) if created else None,
            execute_at=execute_at,
            # A negative count (PHP would retry from it) means no retry was made yet.
            retries=max(0, _php_int(retries)) if retries is not None else 0,
        )


def _kind(value: Any) -> str:
    """``a string 'soon'``: a JSON value's kind and a bounded repr, for an error."""
    if value is None:
        return "null"
    kind = {bool: "a boolean", str: "a string", list: "an array", dict: "an object"}.get(
        type(value), "a number"
    )
    text = repr(value)
    return f"{kind} {text[:40]}{'...' if len(text) > 40 else ''}"


#: The numeric prefix PHP reads from a string (leading whitespace, a decimal number).
_NUMERIC_PREFIX = re.compile(
    r"[ \t\n\r\v\f]*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
)
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def _php_float(value: Any) -> float:
    """``floatval(value)`` as PHP computes it for a decoded JSON value."""
    if isinstance(value, str):
        found = _NUMERIC_PREFIX.match(value)
        return float(found.group(1)) if found else 0.0
    if isinstance(value, list | dict | bool):
        return 1.0 if value else 0.0
    return float(value)


def _php_int(value: Any) -> int:
    """``intval(value)`` as PHP computes it (64-bit) for a decoded JSON value."""
    if isinstance(value, int):  # bool too
        return int(value)
    if isinstance(value, list | dict):
        return 1 if value else 0
    if isinstance(value, str):
        found = _NUMERIC_PREFIX.match(value)
        if found is None:
            return 0
        text = found.group(1)
        if text.lstrip("+-").isdigit():
            return min(max(int(text), _INT_MIN), _INT_MAX)
        value = float(text)
    if not math.isfinite(value):
        return 0
    return min(max(int(value), _INT_MIN), _INT_MAX)
