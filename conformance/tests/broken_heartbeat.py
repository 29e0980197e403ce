"""A deliberately broken heartbeat store: the kit's heartbeat row must fail it.

Loaded into the kit's runs with ``--hermes-plugin broken_heartbeat``: a
memory driver whose ``beat`` ignores the ttl, so a SIGKILLed worker would be
listed for ever, and one whose ``forget`` of one worker drops them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broken_claim import memory_plugin

from hermes.core import hookimpl
from hermes.core.driver import DriverPlugin
from hermes.core.spi._memory import MemoryDriver


class NeverExpires(MemoryDriver):
    """Keeps every record for a day, whatever ttl it is given."""

    def beat(self, record: Mapping[str, Any], ttl_s: float) -> None:
        super().beat(record, 86400.0)


class ForgetsEveryone(MemoryDriver):
    """``forget(id)`` of one worker drops every worker's record."""

    def forget(self, worker_id: str) -> None:
        for record in self.heartbeats():
            super().forget(str(record["id"]))


@hookimpl
def hermes_drivers() -> list[DriverPlugin]:
    return [
        memory_plugin("heartbeat-never-expires", NeverExpires),
        memory_plugin("heartbeat-forgets-everyone", ForgetsEveryone),
    ]
