"""What a real PHP Hermes worker does with a message that carries headers.

Runs ``php/headers_check.php`` against a checkout of tomaj/hermes given by
``HERMES_PHP_SRC`` (its ``src/`` directory), with the php-cli and php-redis
packages installed; skipped otherwise, as PHP is not part of this
repository's test setup. The README's PHP section states the answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hermes.core import Message
from hermes.core.drivertools import MessageSerializer

SCRIPT = Path(__file__).parent / "php" / "headers_check.php"
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def _php_src() -> str:
    src = os.environ.get("HERMES_PHP_SRC", "")
    if not src or not (Path(src) / "MessageSerializer.php").is_file():
        pytest.skip("HERMES_PHP_SRC does not name tomaj/hermes's src/ directory")
    php = shutil.which("php")
    if php is None:
        pytest.skip("no php on PATH")
    modules = subprocess.run([php, "-m"], capture_output=True, text=True, check=True).stdout
    if "redis" not in modules.split():
        pytest.skip("php has no redis extension (apt-get install php-redis)")
    return src


def _run_php(src: str, key: str, body: str) -> dict[str, Any]:
    done = subprocess.run(
        ["php", str(SCRIPT), src, key],
        input=body,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    steps: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        steps.update(json.loads(line))
    return steps


def test_a_php_worker_handles_a_message_with_headers_and_its_retry_copy_drops_them(
    client: Any, namespace: str
) -> None:
    src = _php_src()
    serializer = MessageSerializer()
    message = Message("headers-check", {"n": 1}, headers=TRACE)
    steps = _run_php(src, namespace, serializer.serialize(message))

    seen = steps["seen"]
    assert (seen["id"], seen["type"], seen["payload"], seen["retries"]) == (
        message.id,
        "headers-check",
        {"n": 1},
        0,
    )
    assert not any("header" in method.lower() for method in seen["methods"])
    [retry_body] = steps["handled"]
    assert "headers" not in json.loads(retry_body)["message"]
    retry = serializer.unserialize(retry_body)
    assert (retry.id, retry.retries, dict(retry.headers)) == (message.id, 1, {})


def test_php_writes_the_bytes_python_writes_for_a_message_without_headers(
    client: Any, namespace: str
) -> None:
    src = _php_src()
    steps = _run_php(src, namespace, MessageSerializer().serialize(Message("headers-check")))
    serializer = MessageSerializer()
    for php in steps["serialized"]:
        assert serializer.serialize(serializer.unserialize(php)) == php
