"""What pika's exceptions mean to Hermes, where the exception class alone does not say.

Core translates the driver's exceptions by the tuples the driver declares
(:attr:`LazyRabbitMqDriver.refused_errors` and the others). What is left
here is RabbitMQ's own: a channel the broker closed carries its reason as a
reply code, and a refused login or vhost deserves a line that says what to fix.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from pika import exceptions as pika_exc
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from hermes.core import BrokerRefusedError, BrokerUnavailableError, ConfigurationError, DriverError
from hermes.core.drivertools import CertificateRefusedError, error_text

logger = logging.getLogger("hermes.drivers.rabbitmq")

#: Reply code of a channel the broker closed because this user may not do that.
ACCESS_REFUSED = 403
#: Reply code of a channel the broker closed because a queue does not exist.
NOT_FOUND = 404
#: Reply code of a channel the broker closed because a declaration does not
#: match the queue that exists (or an argument is invalid).
PRECONDITION_FAILED = 406

#: The broker refused this client: a wrong user or password, a vhost that
#: does not exist or that the user may not open. Retrying cannot help.
REFUSED_ERRORS = (
    pika_exc.ProbableAuthenticationError,
    pika_exc.AuthenticationError,
    pika_exc.ProbableAccessDeniedError,
)
#: The connection is gone or cannot be made (refused, reset, heartbeat
#: timeout, blocked too long): the next attempt opens a new one.
UNAVAILABLE_ERRORS = (pika_exc.AMQPConnectionError,)
#: Any other failure of pika (an unroutable or nacked publish among them).
CLIENT_ERRORS = (pika_exc.AMQPError,)


def classify(exc: BaseException) -> type[DriverError] | None:
    """The Hermes error a pika channel exception means; None: decided by the declared tuples.

    A channel lost under a session -- closed by the broker (a queue deleted,
    the consumer timeout), cancelled, or found closed -- is
    :class:`BrokerUnavailableError`: a new connection gets a new channel.
    The broker's 403 on a channel is a permission this user lacks: refused.
    An unroutable or nacked publish is a failed send, not an absent broker.
    """
    if isinstance(exc, pika_exc.ChannelClosedByBroker) and exc.reply_code == ACCESS_REFUSED:
        return BrokerRefusedError
    if isinstance(
        exc, pika_exc.ChannelClosed | pika_exc.ChannelWrongStateError | pika_exc.ConsumerCancelled
    ):
        return BrokerUnavailableError
    return None


def refusal(exc: BaseException, where: str, user: str | None, vhost: str) -> BrokerRefusedError:
    """The one-line error for a login or vhost RabbitMQ refused, naming what to fix."""
    if isinstance(exc, pika_exc.ProbableAccessDeniedError):
        fix = (
            f"RabbitMQ refused user {user!r} the virtual host {vhost!r}: create it "
            f"(rabbitmqctl add_vhost) and give the user permissions on it "
            f"(rabbitmqctl set_permissions), or fix the vhost in the URL's path"
        )
    else:
        fix = (
            f"RabbitMQ refused the login of user {user!r}: check the user name and "
            "password in the URL"
        )
    return BrokerRefusedError(f"{where}: {fix} - {error_text(exc)}")


def connect_failure(exc: BaseException, where: str) -> DriverError | None:
    """The Hermes error for what opening a connection raised past pika's own errors, or None.

    pika hands the failure of the TLS handshake, and a timeout of the whole
    connection set-up, back as they are rather than as ``AMQPConnectionError``.
    A certificate that does not verify is refused: retrying cannot make it
    verify, the URL or the server's certificate must change. Any other TLS,
    socket or set-up failure is an absent broker, as a refused TCP
    connection is.
    """
    if CertificateRefusedError.in_chain(exc):
        return CertificateRefusedError(f"{where}: refused while connecting: {error_text(exc)}")
    if isinstance(exc, OSError | AMQPConnectorException):
        return BrokerUnavailableError(f"{where}: unavailable while connecting: {describe(exc)}")
    return None


@contextlib.contextmanager
def declaring(where: str, doing: str) -> Iterator[None]:
    """Inside, a declaration whose arguments differ from the queue's raises ConfigurationError.

    RabbitMQ closes the channel with 406 PRECONDITION_FAILED; the text says
    how to fix it, which the broker's reply alone does not.
    """
    try:
        yield
    except pika_exc.ChannelClosedByBroker as exc:
        if exc.reply_code != PRECONDITION_FAILED:
            raise
        raise ConfigurationError(
            f"{where}: RabbitMQ rejected the queue settings while {doing} - "
            f"{exc.reply_text}; a queue that already exists keeps the arguments it was "
            "declared with: use the same options (durable, x-... arguments) or delete it"
        ) from exc


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
