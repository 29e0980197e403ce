"""What core hands a driver's ``put``: a message serialized once."""

from __future__ import annotations

from dataclasses import dataclass

from hermes.core.model._message import Message
from hermes.core.model._serializer import MessageSerializer, Serializer


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One body for :meth:`Driver.put`: serialized by core, put on the broker as it is."""

    #: The serialized message (or, for the kit's poison, any bytes).
    body: bytes
    #: When it may run (a UNIX timestamp), read from the message before it was
    #: serialized, so a driver that holds delayed messages never decodes a body.
    execute_at: float | None = None
    #: The message's id, for log lines and brokers that name entries (None: raw bytes).
    message_id: str | None = None


#: The serializer of ``Driver.send``: the PHP Hermes envelope.
_serializer: Serializer = MessageSerializer()


def outgoing(message: Message, serializer: Serializer | None = None) -> Outgoing:
    """``message`` serialized once, ready for :meth:`Driver.put`.

    Raises :class:`SerializeError` before anything reaches a broker.
    """
    text = (serializer or _serializer).serialize(message)
    return Outgoing(text.encode(), message.execute_at, message.id)
