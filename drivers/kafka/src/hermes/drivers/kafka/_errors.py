"""confluent-kafka's exceptions as Hermes errors: the one place the driver maps them.

confluent-kafka raises one exception type, ``KafkaException``, for everything;
what went wrong is the code of the ``KafkaError`` it carries. A broker that
cannot be reached (or is electing a leader or a group coordinator) becomes
:class:`BrokerUnavailableError`, so the worker waits and tries again; anything
else becomes the error the caller names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from confluent_kafka import KafkaError, KafkaException

from hermes.core import BrokerUnavailableError, DriverError

#: Codes librdkafka does not mark retriable but that mean "the broker is not there".
_UNAVAILABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._TIMED_OUT,
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


def translate(exc: KafkaException, doing: str, failed: type[DriverError]) -> DriverError:
    """The Hermes error for ``exc``, raised while ``doing`` (chain it: ``raise ... from exc``)."""
    error = error_of(exc)
    if error.retriable() or error.code() in _UNAVAILABLE:
        return BrokerUnavailableError(f"Kafka unavailable while {doing}: {error.str()}")
    return failed(f"Kafka failed while {doing}: {error.str()}")


@contextlib.contextmanager
def kafka_errors(doing: str, failed: type[DriverError] = DriverError) -> Iterator[None]:
    """Inside the block, a ``KafkaException`` is raised as :func:`translate` maps it."""
    try:
        yield
    except KafkaException as exc:
        raise translate(exc, doing, failed) from exc
