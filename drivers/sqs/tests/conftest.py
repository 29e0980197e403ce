"""Fixtures for the SQS driver tests: every test gets its own queues on the local moto server."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import boto3
import pytest

from hermes.core import connect
from hermes.drivers.sqs import AmazonSqsDriver

REGION = "us-east-1"


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def queue_name() -> str:
    return f"t-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def sqs_url(sqs_endpoint: str, queue_name: str) -> str:
    """``sqs://<fresh queue>?region=…&endpoint_url=…`` on the local server."""
    return f"sqs://{queue_name}?region={REGION}&endpoint_url={quote(sqs_endpoint, safe='')}"


@pytest.fixture
def sqs(sqs_endpoint: str) -> Any:
    """A plain boto3 client, for looking at the queues behind the driver's back."""
    return boto3.session.Session().client("sqs", region_name=REGION, endpoint_url=sqs_endpoint)


@pytest.fixture
def make_driver(sqs_url: str) -> Iterator[Callable[..., AmazonSqsDriver]]:
    """``make_driver(**options)``: a driver on the test's queue; its queues are deleted after."""
    drivers: list[AmazonSqsDriver] = []

    def make(url: str | None = None, **options: Any) -> AmazonSqsDriver:
        driver = connect(url or sqs_url, **options)
        assert isinstance(driver, AmazonSqsDriver)
        drivers.append(driver)
        return driver

    yield make
    for driver in drivers:
        driver.teardown()
        driver.close()
