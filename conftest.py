"""Fixtures that bring up the brokers driver tests talk to (see tools/services.py)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "hermes_test_services", Path(__file__).parent / "tools" / "services.py"
)
assert _spec is not None and _spec.loader is not None
services = importlib.util.module_from_spec(_spec)
sys.modules["hermes_test_services"] = services
_spec.loader.exec_module(services)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """``redis://127.0.0.1:6379/0``; redis-server is started if nothing listens."""
    return str(services.ensure_redis())


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """``amqp://guest:guest@127.0.0.1:5672/``; rabbitmq-server is started if nothing listens."""
    return str(services.ensure_rabbitmq())


@pytest.fixture(scope="session")
def sqs_endpoint() -> Iterator[str]:
    """The endpoint URL of a local SQS-compatible server, up for the whole session."""
    with services.sqs_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``127.0.0.1:PORT`` of a local Kafka-protocol broker, up for the whole session."""
    with services.kafka_broker() as bootstrap:
        yield bootstrap
