"""What confluent-kafka's errors mean to Hermes: the code, not the class, says it.

confluent-kafka raises one exception type, ``KafkaException``, for everything;
what went wrong is the code of the ``KafkaError`` it carries. Core translates
the driver's exceptions through :meth:`KafkaDriver.classify_error`, which reads
the code here: credentials, permissions or a TLS certificate refused stop a worker,
a broker that cannot be reached (or is electing a leader or a group
coordinator) makes it wait and try again, anything else is a failure.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from hermes.core import BrokerRefusedError, BrokerUnavailableError, DriverError
from hermes.core.drivertools import CertificateRefusedError

#: The broker refused this client: SASL credentials, or an ACL on a topic or group.
REFUSED_CODES = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)

#: Codes librdkafka does not mark retriable but that mean "the broker is not there".
UNAVAILABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._TIMED_OUT,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._WAIT_COORD,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.BROKER_NOT_AVAILABLE,
    }
)


def error_of(exc: KafkaException) -> KafkaError:
    """The ``KafkaError`` a ``KafkaException`` carries (one is made up if it carries none)."""
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        return error
    return KafkaError(KafkaError._FAIL, str(error) if error is not None else "unknown error")


def refused_certificate(error: KafkaError) -> bool:
    """Whether ``error`` is a TLS handshake that failed on the broker's certificate.

    librdkafka reports every failed handshake as ``_SSL``, a connection reset
    in the middle of one too; only a certificate that did not verify (another
    CA's, expired, another host's) is a refusal, which retrying cannot change.
    """
    return error.code() == KafkaError._SSL and CertificateRefusedError.in_chain(
        KafkaException(error)
    )


def is_refusal(error: KafkaError) -> bool:
    """Credentials, an ACL or the broker's certificate refused: the URL or broker must change."""
    return error.code() in REFUSED_CODES or refused_certificate(error)


def classify(error: KafkaError) -> type[DriverError]:
    """The Hermes error a ``KafkaError`` means."""
    code = error.code()
    if refused_certificate(error):
        return CertificateRefusedError
    if is_refusal(error):
        return BrokerRefusedError
    if code in UNAVAILABLE_CODES or code == KafkaError._SSL or error.retriable():
        return BrokerUnavailableError
    return DriverError


def explained(error: KafkaError, text: str) -> KafkaException:
    """``error``'s code with ``text`` as its reason: classified alike, read better."""
    return KafkaException(
        KafkaError(
            error.code(), f"{text}: {error.str()}", fatal=error.fatal(), retriable=error.retriable()
        )
    )
