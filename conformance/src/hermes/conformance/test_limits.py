"""What a message can be: the size limit, and every JSON value, exactly.

A message one byte over ``max_message_bytes`` is refused at send with a
:class:`DeliveryError` naming its size and the limit, before any I/O: it
never reaches the broker, alone or in a batch. And the payload comes back
as the serializer promises, through the real broker: every JSON type with
its edge values (integers past 2**53, 1e308, -0.0, 5e-324, astral and
escaped characters, empty and deeply nested containers) with its type
intact -- ``1`` stays an int, ``-0.0`` keeps its sign. The serializer's own
PHP-compatible rule is expected too: a top-level ``[]`` payload reads as ``{}``.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

import pytest

from hermes.conformance._harness import DELIVERY_S, QUIET_S, Kit, stays_false, wait_until
from hermes.conformance._worker import JOB
from hermes.core import DeliveryError, Message
from hermes.core.drivertools import MessageSerializer


def _of_size(size: int) -> Message:
    """A kit message whose serialized form is exactly ``size`` bytes."""
    serializer = MessageSerializer()
    empty = Message(JOB, {"blob": ""})
    overhead = len(serializer.serialize(empty).encode())
    blob = (string.ascii_lowercase * (size // 26 + 1))[: size - overhead]
    message = empty.replace(payload={"blob": blob})
    got = len(serializer.serialize(message).encode())
    assert got == size, f"the kit built a message of {got} bytes, not {size} (a kit bug)"
    return message


def _refused(what: str, send: Callable[[], None], size: int, limit: int) -> DeliveryError:
    try:
        send()
    except DeliveryError as exc:
        return exc
    except Exception as exc:
        raise AssertionError(
            f"{what} of {size} bytes (max_message_bytes={limit}) raised {exc!r}, not a "
            "DeliveryError"
        ) from exc
    raise AssertionError(
        f"{what} of {size} bytes was accepted although max_message_bytes={limit}: a message "
        "the driver does not promise to carry must be refused with a DeliveryError"
    )


@pytest.mark.hermes_check("round trip", "one byte over max_message_bytes is refused", new=True)
def test_a_message_one_byte_over_the_declared_maximum_is_refused_at_send_and_sends_nothing(
    hermes_kit: Kit,
) -> None:
    limit = hermes_kit.capabilities.max_message_bytes
    sender = hermes_kit.sender
    over = _of_size(limit + 1)
    small = hermes_kit.message(1)

    error = _refused("send() of a message", lambda: sender.send(over), limit + 1, limit)
    assert str(limit + 1) in str(error) and str(limit) in str(error), (
        f"the DeliveryError does not name the size ({limit + 1}) and the limit ({limit}): {error}"
    )
    _refused(
        "send_batch() with one message", lambda: sender.send_batch([small, over]), limit + 1, limit
    )
    sentinel = hermes_kit.emit(hermes_kit.message(2))
    hermes_kit.worker()
    ledger = hermes_kit.ledger
    assert wait_until(lambda: ledger.has(sentinel.id), DELIVERY_S), (
        f"a message sent after the refused ones was not delivered within {DELIVERY_S} s"
    )

    def others() -> list[str]:
        return [id_ for id_ in ledger.ids() if id_ != sentinel.id]

    assert stays_false(others, QUIET_S), (
        f"refused messages reached the broker (the check must come before any I/O): {others()}"
    )
    hermes_kit.claim(f"{limit + 1} bytes refused with DeliveryError, alone and in a batch")


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"d": value}
    return value


#: Payloads, by what they hold: each JSON type and its edge values.
_PAYLOADS: dict[str, Any] = {
    "integers": {"v": [0, -1, 2**31, 2**53, 2**53 + 1, -(2**63), 2**64, 10**30, -(10**40)]},
    "floats": {
        "v": [
            0.0,
            -0.0,
            1e308,
            -1e308,
            1.7976931348623157e308,
            5e-324,
            -5e-324,
            2.2250738585072014e-308,
            0.1,
            1 / 3,
            1e-7,
            1e21,
            1e22,
            2.0,
            -2.5,
            123456789.123456789,
        ]
    },
    "strings": {
        "v": [
            "",
            " ",
            "\x00",
            "\x1f\x7f",
            '"',
            "\\",
            "/",
            "</script>",
            "\b\f\n\r\t",
            "\u2028\u2029",
            "é€",
            "\ufeff",
            "😀",
            "𝄞",
            "\U0010ffff",
            "\ud800",
            "a" * 1000,
        ]
    },
    "keys": {"": 0, " ": 1, "ключ": 2, "😀": 3, "a\x00b": 4, "\\": 5, '"': 6, "1": 7},
    "true, false and null": {"v": [True, False, None], "t": True, "f": False, "n": None},
    "empty containers": {"v": [[], {}, [[]], [{}], {"": {}}, {"": []}, ""], "e": {}, "l": []},
    "deep nesting": {"v": _nested(100)},
    "a top-level list": [1, "two", 3.0, None, True, {}],
    "an empty object": {},
    "an empty list (reads as {} for PHP)": [],
    "no payload": None,
}


def _typed(value: Any) -> Any:
    """``value`` with its JSON type in every node: 1, 1.0 and True differ, -0.0 keeps its sign."""
    if value is None or isinstance(value, bool | str):
        return (type(value).__name__, value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, list):
        return ("list", [_typed(item) for item in value])
    if isinstance(value, dict):
        # Key order is not promised (a broker may store JSON as a JSON type).
        return ("object", sorted((key, _typed(item)) for key, item in value.items()))
    return ("unexpected", repr(value))


def _first_difference(got: Any, want: Any, path: str = "payload") -> str:
    if type(got) is not type(want):
        return f"{path} is {got!r} ({type(got).__name__}), not {want!r} ({type(want).__name__})"
    if isinstance(want, dict):
        if set(got) != set(want):
            return f"{path} has the keys {sorted(got)}, not {sorted(want)}"
        for key in want:
            found = _first_difference(got[key], want[key], f"{path}[{key!r}]")
            if found:
                return found
        return ""
    if isinstance(want, list):
        if len(got) != len(want):
            return f"{path} has {len(got)} items, not {len(want)}"
        for index, (a, b) in enumerate(zip(got, want, strict=True)):
            found = _first_difference(a, b, f"{path}[{index}]")
            if found:
                return found
        return ""
    if _typed(got) != _typed(want):
        return f"{path} is {got!r}, not {want!r}"
    return ""


@pytest.mark.hermes_check("round trip", "every JSON type and edge value, exactly", new=True)
def test_every_json_type_and_edge_value_comes_back_exactly_as_the_serializer_promises(
    hermes_kit: Kit,
) -> None:
    serializer = MessageSerializer()
    ledger = hermes_kit.ledger
    sent: dict[str, Message] = {}
    refused: dict[str, str] = {}
    for what, payload in _PAYLOADS.items():
        message = Message(JOB, payload)
        try:
            hermes_kit.emit(message)
        except DeliveryError as exc:  # a broker that cannot carry it (SQS: some characters)
            refused[what] = str(exc)
            continue
        sent[what] = message
    hermes_kit.worker()
    assert wait_until(lambda: all(ledger.has(m.id) for m in sent.values()), DELIVERY_S), (
        f"not delivered within {DELIVERY_S} s: "
        f"{[what for what, m in sent.items() if not ledger.has(m.id)]}"
    )
    for what, message in sent.items():
        promised = serializer.unserialize(serializer.serialize(message)).payload
        got = ledger.of(message.id)[0].message.payload
        difference = _first_difference(got, promised)
        assert not difference, f"{what} did not come back exactly as sent: {difference}"
    if refused:
        hermes_kit.claim(
            f"{len(sent)} payloads exact; refused by the broker: {', '.join(sorted(refused))}"
        )
    else:
        hermes_kit.claim(f"{len(sent)} payloads of every JSON type and edge value: exact")
