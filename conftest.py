"""Fixtures that bring up the brokers driver tests talk to (see tools/services.py).

Also makes tools/testing.py importable as ``hermes_test_support``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


def _load(name: str, file: str) -> ModuleType:
    """``tools/<file>`` as the module ``name``, importable by every test suite."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "tools" / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


services = _load("hermes_test_services", "services.py")
support = _load("hermes_test_support", "testing.py")


@pytest.fixture(name="eventually")
def eventually_fixture() -> Callable[..., Any]:
    """``hermes_test_support.eventually``, as a fixture."""
    return support.eventually


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
