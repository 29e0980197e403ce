from __future__ import annotations

import json
import math
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
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


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
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise SerializeError(f"Invalid message format in '{_quote(data)}'", data) from exc
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
        id_, type_, created = body["id"], body["type"], body["created"]
        if not isinstance(id_, str) or not isinstance(type_, str) or not _is_number(created):
            raise TypeError("id and type must be strings, created a number")
        payload = body.get("payload")
        if payload == []:
            payload = {}
        execute_at = body.get("execute_at")
        if execute_at is not None and not _is_number(execute_at):
            raise TypeError("execute_at must be a number or null")
        retries = body.get("retries")
        if retries is None:
            retries = 0
        if not _is_number(retries) or retries < 0:
            raise TypeError("retries must be a number >= 0")
        return Message(
            type_,
            payload,
            id=id_,
            created=created,
            execute_at=execute_at,
            retries=int(retries),
        )
