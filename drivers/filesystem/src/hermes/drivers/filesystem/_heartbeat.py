"""Heartbeats in a queue directory: one JSON file per worker in ``workers/``.

Each beat writes ``{"expires_at": ..., "record": {...}}`` to a file in
``workers/.tmp/`` and renames it over the worker's file, so a reader sees the
old record or the new one, never half of one. Expiry is the timestamp in the
content (every process is on this machine: one clock); a listing removes the
files of workers gone for longer than :data:`REMOVE_AFTER_S`, which a worker
that forgot its record (SIGKILL) leaves behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

#: The directory under the queue directory.
WORKERS_DIR = "workers"
#: A record expired this long ago is deleted by the next listing.
REMOVE_AFTER_S = 60.0
#: Longer names are hashed: most filesystems allow 255 bytes.
_MAX_NAME = 200


def _file_name(worker_id: str) -> str:
    name = quote(worker_id, safe="-_.:") + ".json"
    if len(name) > _MAX_NAME or name.startswith("."):
        name = hashlib.sha256(worker_id.encode()).hexdigest() + ".json"
    return name


def beat(queue_dir: str, record: Mapping[str, Any], ttl_s: float) -> None:
    if not ttl_s > 0:
        raise ValueError(f"a heartbeat's ttl_s must be > 0, got {ttl_s!r}")
    directory = os.path.join(queue_dir, WORKERS_DIR)
    tmp_dir = os.path.join(directory, ".tmp")
    text = json.dumps({"expires_at": time.time() + ttl_s, "record": record})
    tmp = os.path.join(tmp_dir, uuid.uuid4().hex)
    try:
        file = open(tmp, "x", encoding="utf-8")
    except FileNotFoundError:
        os.makedirs(tmp_dir, exist_ok=True)
        file = open(tmp, "x", encoding="utf-8")
    try:
        with file:
            file.write(text)
        os.rename(tmp, os.path.join(directory, _file_name(str(record["id"]))))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def forget(queue_dir: str, worker_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(queue_dir, WORKERS_DIR, _file_name(worker_id)))


def heartbeats(queue_dir: str) -> list[dict[str, Any]]:
    directory = os.path.join(queue_dir, WORKERS_DIR)
    try:
        names = [name for name in os.listdir(directory) if name.endswith(".json")]
    except FileNotFoundError:
        return []  # no worker ever beat here
    now = time.time()
    live: list[dict[str, Any]] = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as file:
                content = json.load(file)
            expires_at = float(content["expires_at"])
            record = content["record"]
        except FileNotFoundError:
            continue  # forgotten meanwhile
        except (ValueError, KeyError, TypeError):
            # Never written by beat() (rename is atomic): someone else's file, left alone.
            continue
        if expires_at > now:
            live.append(record)
        elif expires_at < now - REMOVE_AFTER_S:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return live
