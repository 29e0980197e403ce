"""The boto3 side of the SQS driver: the one place that translates its errors, and client clones."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import boto3
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from hermes.core import BrokerUnavailableError, ConfigurationError, DriverError

#: Error codes that mean "the service is there but cannot answer now".
_TRANSIENT_CODES = frozenset(
    {
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "RequestThrottled",
        "Throttling",
        "ThrottlingException",
    }
)
_MISSING_QUEUE_CODES = frozenset(
    {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"}
)


def error_code(exc: ClientError) -> str:
    """The SQS error code of ``exc`` (both the JSON and the legacy query spelling)."""
    error = exc.response.get("Error", {})
    return str(error.get("QueryErrorCode") or error.get("Code") or "Unknown")


def is_missing_queue(exc: ClientError) -> bool:
    error = exc.response.get("Error", {})
    return bool({error.get("Code"), error.get("QueryErrorCode")} & _MISSING_QUEUE_CODES)


@contextlib.contextmanager
def translate_errors(
    action: str, queue: str, failure: type[DriverError] = DriverError
) -> Iterator[None]:
    """Turn what boto3 raises during ``action`` on ``queue`` into Hermes errors.

    Unreachable endpoints and throttling become :class:`BrokerUnavailableError`;
    missing credentials or region :class:`ConfigurationError`; anything else
    ``failure``. The boto3 exception is chained as ``__cause__``.
    """
    try:
        yield
    except ClientError as exc:
        code = error_code(exc)
        text = exc.response.get("Error", {}).get("Message", "")
        where = f"SQS {action} on queue {queue!r}"
        if code in _TRANSIENT_CODES:
            raise BrokerUnavailableError(f"{where}: service unavailable ({code}: {text})") from exc
        if is_missing_queue(exc):
            raise failure(f"{where}: the queue does not exist (deleted meanwhile?)") from exc
        raise failure(f"{where} failed: {code}: {text}") from exc
    except (BotoConnectionError, HTTPClientError) as exc:
        raise BrokerUnavailableError(
            f"SQS {action} on queue {queue!r}: endpoint unreachable - {exc}"
        ) from exc
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise ConfigurationError(
            f"SQS {action} on queue {queue!r}: no usable AWS credentials ({exc}); set "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or an instance role"
        ) from exc
    except NoRegionError as exc:
        raise ConfigurationError(
            f"SQS {action} on queue {queue!r}: no AWS region; add ?region=… to the URL "
            "or set AWS_DEFAULT_REGION"
        ) from exc
    except BotoCoreError as exc:
        raise failure(f"SQS {action} on queue {queue!r} failed: {exc}") from exc


def clone_client(client: Any) -> Any:
    """A new SQS client like ``client`` that shares none of its connections.

    Region, endpoint and botocore config are copied. Keys that were passed to
    ``client()`` explicitly are copied too; every other kind of credentials
    (environment, profile, role) is resolved again by the standard chain,
    which finds the same ones. Pass ``client_factory`` to the driver when
    that is not enough.
    """
    meta = client.meta
    kwargs: dict[str, Any] = {
        "region_name": meta.region_name,
        "endpoint_url": meta.endpoint_url,
        "config": meta.config,
    }
    get_credentials = getattr(client, "_get_credentials", None)
    credentials = get_credentials() if callable(get_credentials) else None
    if credentials is not None and getattr(credentials, "method", None) == "explicit":
        frozen = credentials.get_frozen_credentials()
        kwargs.update(
            aws_access_key_id=frozen.access_key,
            aws_secret_access_key=frozen.secret_key,
            aws_session_token=frozen.token,
        )
    return boto3.session.Session().client("sqs", **kwargs)
