"""The one place where pika's exceptions become Hermes errors."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from pika import exceptions as pika_exc

from hermes.core import (
    BrokerUnavailableError,
    ConfigurationError,
    DeliveryError,
    DriverError,
)

logger = logging.getLogger("hermes.drivers.rabbitmq")

#: Reply code of a channel the broker closed because a declaration does not
#: match the queue that exists (or an argument is invalid).
PRECONDITION_FAILED = 406

#: Reply code of a channel the broker closed because a queue does not exist.
NOT_FOUND = 404


@contextlib.contextmanager
def translate(doing: str, where: str, *, consuming: bool = False) -> Iterator[None]:
    """Raise pika's exceptions inside as :class:`DriverError` subclasses, chained.

    ``doing`` says what the driver was doing ("publishing to queue 'jobs'"),
    ``where`` names the broker (password masked); both go into the text.
    A lost connection is :class:`BrokerUnavailableError`. With ``consuming``
    (a worker's session after its queues were declared) so is a channel the
    broker closed or a consumer it cancelled: the session is gone either way,
    and the worker opens a new one.
    """
    try:
        yield
    except pika_exc.UnroutableError as exc:
        raise DeliveryError(
            f"{where}: RabbitMQ returned the message as unroutable while {doing} "
            "(the queue does not exist)"
        ) from exc
    except pika_exc.NackError as exc:
        raise DeliveryError(
            f"{where}: RabbitMQ refused the message (nack) while {doing}; "
            "a full queue with x-overflow=reject-publish or a broker error does this"
        ) from exc
    except (pika_exc.ProbableAuthenticationError, pika_exc.AuthenticationError) as exc:
        raise BrokerUnavailableError(
            f"{where}: RabbitMQ refused the user name or password while {doing} - {exc!r}"
        ) from exc
    except pika_exc.ProbableAccessDeniedError as exc:
        raise BrokerUnavailableError(
            f"{where}: RabbitMQ denied access to the virtual host while {doing} - {exc!r}"
        ) from exc
    except pika_exc.AMQPConnectionError as exc:
        raise BrokerUnavailableError(
            f"{where}: no connection to RabbitMQ while {doing} - {describe(exc)}"
        ) from exc
    except pika_exc.AMQPChannelError as exc:
        if consuming:
            raise BrokerUnavailableError(
                f"{where}: lost the channel while {doing} - {describe(exc)}"
            ) from exc
        if isinstance(exc, pika_exc.ChannelClosedByBroker):
            if exc.reply_code == PRECONDITION_FAILED:
                raise ConfigurationError(
                    f"{where}: RabbitMQ rejected the queue settings while {doing} - "
                    f"{exc.reply_text}; a queue that already exists keeps the arguments it was "
                    "declared with: use the same options (durable, x-... arguments) or delete it"
                ) from exc
            raise DriverError(
                f"{where}: RabbitMQ closed the channel while {doing} - {exc!r}"
            ) from exc
        raise DriverError(f"{where}: pika failed while {doing} - {describe(exc)}") from exc
    except pika_exc.AMQPError as exc:
        raise DriverError(f"{where}: pika failed while {doing} - {exc!r}") from exc


def describe(exc: BaseException) -> str:
    """A one-line account of a pika exception, whose ``str()`` is often empty."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else repr(exc)


def close_quietly(connection: Any) -> None:
    """Close a pika connection that is being abandoned; a failure is only logged."""
    if connection is None or not connection.is_open:
        return
    try:
        connection.close()
    except pika_exc.AMQPError as exc:
        # The connection is being abandoned; the broker cleans up after it.
        logger.debug("closing a RabbitMQ connection failed - %s", describe(exc))
