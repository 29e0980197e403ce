"""The error tree of ``hermes.core.model._errors``: what a user can catch, and what each keeps."""

from __future__ import annotations

import pytest

from hermes.core import (
    BrokerUnavailableError,
    ConfigurationError,
    DeliveryError,
    DriverError,
    HermesError,
    NotSupportedError,
    SerializeError,
    UnknownPriorityError,
)
from hermes.core.model._errors import UnknownDriverError


@pytest.mark.parametrize(
    ("error", "bases"),
    [
        (SerializeError, (HermesError,)),
        (ConfigurationError, (HermesError, ValueError)),
        (UnknownDriverError, (ConfigurationError, HermesError, ValueError)),
        (NotSupportedError, (HermesError,)),
        (UnknownPriorityError, (HermesError,)),
        (DriverError, (HermesError,)),
        (BrokerUnavailableError, (DriverError, HermesError)),
        (DeliveryError, (DriverError, HermesError)),
    ],
)
def test_every_error_sits_where_the_tree_says(
    error: type[Exception], bases: tuple[type, ...]
) -> None:
    assert all(issubclass(error, base) for base in bases)
    assert issubclass(error, Exception)


def test_no_hermes_error_is_a_key_error() -> None:
    # A bare KeyError would show its text in quotes and be caught by dict-handling code.
    for error in (SerializeError, UnknownPriorityError, UnknownDriverError):
        assert not issubclass(error, KeyError)


def test_a_serialize_error_keeps_the_whole_bad_input() -> None:
    data = b"x" * 1000

    error = SerializeError("Cannot unserialize message from 'xxx...'", data)

    assert error.data == data
    assert str(error) == "Cannot unserialize message from 'xxx...'"


def test_an_unknown_priority_error_keeps_the_priority() -> None:
    error = UnknownPriorityError("no queue for priority 7", 7)

    assert error.priority == 7
    assert str(error) == "no queue for priority 7"


def test_an_unknown_driver_error_keeps_the_scheme() -> None:
    assert UnknownDriverError("nope", "foo").scheme == "foo"
