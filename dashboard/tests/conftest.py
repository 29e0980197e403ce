"""A real ``hermes worker`` and a real ``hermes dashboard`` on Redis, and headless Chromium.

Every session gets Redis keys of its own (a prefix), so these tests share
the server with any other suite. The worker reads priority 100 only; the
dashboard also shows priorities 50 and 60, where messages wait untouched
for the tests that count and purge them.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The tests' helper module and the worker's handlers module, importable by name.
sys.path.insert(0, str(Path(__file__).parent))

from dash_support import Deployment, deploy


def redis_urls(redis_url: str, prefix: str) -> tuple[str, str, str]:
    """The queue's, the failed store's and the records store's URLs under ``prefix``."""
    return tuple(f"{redis_url}?prefix={prefix}{part}" for part in ("", "failed:", "records:"))  # type: ignore[return-value]


@pytest.fixture(scope="session")
def deployment(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    prefix = f"dash-{uuid.uuid4().hex[:8]}:"
    work = tmp_path_factory.mktemp("dashboard")
    with deploy(*redis_urls(redis_url, prefix), work, "dash_jobs:handlers") as deployment:
        yield deployment


@pytest.fixture(scope="session")
def hostile(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A deployment whose values are as long as real ones get: a key prefix that makes
    the broker URL 150 characters, and handlers of a 400-character type."""
    prefix = f"dash-{uuid.uuid4().hex[:8]}-tenant-acme-corporation-eu-west-production-blue-" * 2
    work = tmp_path_factory.mktemp("hostile")
    with deploy(*redis_urls(redis_url, prefix), work, "dash_jobs:hostile") as deployment:
        yield deployment


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    import hermes_test_services

    with hermes_test_services.chromium_browser() as driver:
        yield driver
