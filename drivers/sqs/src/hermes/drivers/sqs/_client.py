"""The boto3 side of the SQS driver: what its errors mean, and client clones."""

from __future__ import annotations

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
from botocore.exceptions import SSLError as BotoSslError
from urllib3.util.ssl_match_hostname import CertificateError as HostnameMismatch

from hermes.core import BrokerRefusedError, BrokerUnavailableError, DriverError
from hermes.core.drivertools import CertificateRefusedError

#: What boto3 raises when this client may never use SQS: no usable keys or no
#: region. Retrying cannot help; a worker stops (``hermes`` exits 2).
REFUSED_ERRORS = (NoCredentialsError, PartialCredentialsError, NoRegionError)
#: The endpoint cannot be reached now: refused or closed connections,
#: connect and read timeouts (botocore's EndpointConnectionError,
#: ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError).
UNAVAILABLE_ERRORS = (BotoConnectionError, HTTPClientError)
#: Anything else boto3 raises; a ClientError's code decides (:func:`classify`).
CLIENT_ERRORS = (ClientError, BotoCoreError)


def certificate_refused(exc: BaseException) -> bool:
    """True if ``exc`` is botocore's SSLError for a certificate that did not verify.

    Other TLS failures (a handshake cut short) leave the endpoint merely unavailable.
    """
    # urllib3 matches the host name itself, and raises its own class.
    return isinstance(exc, BotoSslError) and CertificateRefusedError.in_chain(exc, HostnameMismatch)


#: ClientError codes that mean AWS refused these credentials or this permission.
_REFUSED_CODES = frozenset(
    {
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "ExpiredToken",
        "InvalidSecurity",
        "MissingAuthenticationToken",
        "AuthFailure",
    }
)
#: ClientError codes that mean "the service is there but cannot answer now".
_TRANSIENT_CODES = frozenset(
    {
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "RequestThrottled",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "KmsThrottled",
    }
)
_MISSING_QUEUE_CODES = frozenset(
    {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"}
)


def error_codes(exc: ClientError) -> set[str]:
    """Both spellings of ``exc``'s SQS error code: the JSON one and the legacy query one."""
    error = exc.response.get("Error", {})
    return {str(code) for code in (error.get("Code"), error.get("QueryErrorCode")) if code}


def error_code(exc: ClientError) -> str:
    """The SQS error code of ``exc`` (the legacy query spelling where SQS gives it)."""
    error = exc.response.get("Error", {})
    return str(error.get("QueryErrorCode") or error.get("Code") or "Unknown")


def is_missing_queue(exc: ClientError) -> bool:
    return bool(error_codes(exc) & _MISSING_QUEUE_CODES)


def classify(exc: ClientError) -> type[DriverError]:
    """What a ClientError means for Hermes, by its code.

    A missing queue (deleted meanwhile) and every other refusal of one request
    is a plain :class:`DriverError` (:class:`DeliveryError` on a send).
    """
    codes = error_codes(exc)
    if codes & _REFUSED_CODES:
        return BrokerRefusedError
    if codes & _TRANSIENT_CODES:
        return BrokerUnavailableError
    return DriverError


def clone_client(client: Any) -> Any:
    """A new SQS client like ``client`` that shares none of its connections.

    Region, endpoint and botocore config are copied. Keys that were passed to
    ``client()`` explicitly are copied too; every other kind of credentials
    (environment, profile, role) is resolved again by the standard chain,
    which finds the same ones. ``verify`` is not copied: pass
    ``client_factory`` to the driver when that is not enough (a CA of your own).
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
