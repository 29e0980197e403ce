"""``hermes workers``: the live workers from their heartbeats; and the heartbeat options.

``hermes worker`` and ``hermes scheduler`` take :func:`add_heartbeat_options`
and start their publisher with :func:`publisher_for`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from hermes.core._cli._common import (
    URL_HELP,
    CliError,
    add_verbosity,
    configure_logging,
    default_url,
    env_default,
    seconds,
)
from hermes.core.model._errors import NotSupportedError
from hermes.core.run._heartbeat import (
    HEARTBEAT_INTERVAL_S,
    INTERVAL_ENV,
    MISSED_BEATS,
    HeartbeatPublisher,
    live_workers,
    pause,
    paused_priorities,
    request_quiet,
    request_stop,
    resume,
)
from hermes.core.spi._driver import Driver, SupportsHeartbeats
from hermes.core.spi._registry import connect
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands

logger = logging.getLogger("hermes")

#: Where the heartbeats are kept when the broker of --url cannot keep them.
REGISTRY_URL_ENV = "HERMES_REGISTRY_URL"
_REGISTRY_HELP = (
    "keep heartbeats on this broker when the one of --url cannot (amqp://, sqs://, kafka://), "
    f"e.g. redis://localhost:6379/0 (default: ${REGISTRY_URL_ENV})"
)


def add_heartbeat_options(parser: argparse.ArgumentParser) -> None:
    """``--heartbeat-interval``, ``--no-heartbeat`` and ``--registry-url``."""
    parser.add_argument(
        "--heartbeat-interval",
        type=seconds,
        default=env_default(INTERVAL_ENV, seconds, HEARTBEAT_INTERVAL_S),
        metavar="SECONDS",
        help="publish this process's heartbeat (for hermes workers and the dashboard) every "
        f"SECONDS; it counts as gone after {MISSED_BEATS} missed (default: ${INTERVAL_ENV}, "
        f"else {HEARTBEAT_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--no-heartbeat", action="store_true", help="publish no heartbeat for this process"
    )
    parser.add_argument("--registry-url", metavar="URL", help=_REGISTRY_HELP)


@contextlib.contextmanager
def registry(driver: Driver, registry_url: str | None) -> Iterator[SupportsHeartbeats | None]:
    """Where heartbeats are kept: ``registry_url``'s broker, else ``driver`` if it can; None."""
    registry_url = registry_url or os.environ.get(REGISTRY_URL_ENV) or None
    if registry_url is None:
        yield driver if isinstance(driver, SupportsHeartbeats) else None
        return
    with connect(registry_url) as other:
        if not isinstance(other, SupportsHeartbeats):
            raise CliError(
                f"--registry-url {redact_url(registry_url)}: {type(other).__name__} cannot keep "
                "heartbeats either; name a redis://, file:// or postgresql:// broker"
            )
        yield other


def publisher_for(
    args: argparse.Namespace,
    store: SupportsHeartbeats | None,
    url: str,
    kind: str,
    *,
    supervisor_pid: int | None = None,
    slot: int | None = None,
) -> HeartbeatPublisher | None:
    """The publisher the options ask for, or None (said once in the log when it is the broker's).

    A pool's child passes its supervisor's pid and its slot, for the record.
    """
    if args.no_heartbeat:
        return None
    if store is None:
        logger.info(
            "No heartbeat: %s keeps none; hermes workers will not list this %s "
            "(--registry-url names a broker that does)",
            redact_url(url),
            kind,
        )
        return None
    return HeartbeatPublisher(
        store,
        url=url,
        kind=kind,
        interval_s=args.heartbeat_interval,
        supervisor_pid=supervisor_pid,
        slot=slot,
    )


def add_parser(commands: Commands) -> None:
    """``hermes workers``: its options."""
    workers = commands.add_parser(
        "workers",
        help="list the live workers and what they run now",
        description="The workers and schedulers whose heartbeat is live on the broker: host, "
        "pid, uptime, concurrency, the jobs in their handlers now and for how long, counts. "
        f"A process that missed {MISSED_BEATS} heartbeats is not listed.",
    )
    workers.add_argument("--url", help=URL_HELP)
    workers.add_argument("--registry-url", metavar="URL", help=_REGISTRY_HELP)
    workers.add_argument("--json", action="store_true", help="the records as one JSON document")
    workers.add_argument(
        "--stop",
        metavar="ID",
        help="ask the live worker ID (its id in --json) to stop: it finishes the jobs it runs "
        "and exits within a heartbeat (a pool's child is replaced by its supervisor)",
    )
    workers.add_argument(
        "--quiet-worker",
        metavar="ID",
        help="ask the live worker ID to take no more jobs: it finishes those it runs and stays "
        "alive, quiet, until it is stopped (do this before a deploy stops it)",
    )
    workers.add_argument(
        "--pause",
        metavar="PRIORITY",
        type=int,
        help="pause PRIORITY for every worker on the registry: each finishes the jobs it runs "
        "and takes no more of that priority, within about a second, until --resume",
    )
    workers.add_argument("--resume", metavar="PRIORITY", type=int, help="end the pause of PRIORITY")
    add_verbosity(workers)
    workers.set_defaults(run=run)


def duration(seconds_: float) -> str:
    """``42s``, ``3m05s``, ``2h10m``, ``3d04h``: short enough for a table cell."""
    s = max(0, int(seconds_))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def since_text(now: float, at: object) -> str:
    """``duration(now - at)``; ``invalid`` when ``at`` is not a time (a damaged record)."""
    if not at:
        return duration(0)
    if not isinstance(at, int | float | str):
        return "invalid"
    try:
        return duration(now - float(at))
    except (ValueError, OverflowError):  # text, NaN, infinity
        return "invalid"


def in_flight_text(record: dict[str, Any], now: float) -> str:
    """``invoice.send #42 (12s), ...`` or ``-``."""
    jobs = record.get("in_flight") or []
    parts = [
        f"{job.get('type')} #{job.get('id')} ({since_text(now, job.get('since'))})" for job in jobs
    ]
    return ", ".join(parts) or "-"


def pool_text(record: dict[str, Any]) -> str:
    """``supervisor 812, worker-2`` for a pool's child (its log prefix), else ``-``."""
    supervisor = record.get("supervisor_pid")
    if supervisor is None:
        return "-"
    slot = record.get("slot")
    return f"supervisor {supervisor}" + (f", worker-{slot}" if slot is not None else "")


def _grouped(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records in their order, but a pool's children together, by slot, where the first is."""
    first: dict[tuple[str, int], int] = {}
    for index, record in enumerate(records):
        supervisor = record.get("supervisor_pid")
        key = (str(record.get("host")), supervisor if supervisor is not None else -1 - index)
        first.setdefault(key, index)

    def place(item: tuple[int, dict[str, Any]]) -> tuple[int, int, int]:
        index, record = item
        supervisor = record.get("supervisor_pid")
        if supervisor is None:
            return (index, 0, index)
        slot = record.get("slot")
        try:
            place = int(slot or 0)
        except (TypeError, ValueError):
            place = 0  # a damaged record: listed, in no particular place
        return (first[(str(record.get("host")), supervisor)], 1, place)

    return [record for _, record in sorted(enumerate(records), key=place)]


def table(records: Sequence[dict[str, Any]], now: float) -> str:
    """The records as an aligned text table, one line per worker; a pool's children together."""
    records = _grouped(records)
    header = [
        "host",
        "pid",
        "pool",
        "kind",
        "uptime",
        "concurrency",
        "handled",
        "failed",
        "last seen",
        "in flight now",
    ]
    lines = [
        [
            str(r.get("host", "?")),
            str(r.get("pid", "?")),
            pool_text(r),
            str(r.get("kind", "worker")) + (" (quiet)" if r.get("quiet") else ""),
            since_text(now, r.get("started")),
            str(r.get("concurrency", "-")),
            str(r.get("handled", "-")),
            str(r.get("failed", "-")),
            since_text(now, r.get("last_seen")) + " ago",
            in_flight_text(r, now),
        ]
        for r in records
    ]
    widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in [header, *lines]
    )


def run(args: argparse.Namespace) -> int:
    url: str = args.url or default_url()
    configure_logging(args.verbose - args.quiet, default_level=logging.WARNING)
    with connect(url) as driver, registry(driver, args.registry_url) as store:
        if store is None:
            raise CliError(
                f"{redact_url(url)}: {type(driver).__name__} keeps no heartbeats; give "
                "--registry-url, the broker the workers were started with it"
            )
        if args.pause is not None or args.resume is not None:
            return _pause(store, args.pause, args.resume)
        records = live_workers(store)
        if args.stop is not None:
            what = "stop: it finishes the jobs it runs and exits within a heartbeat"
            return _ask(request_stop, "--stop", store, records, args.stop, what)
        if args.quiet_worker is not None:
            what = (
                "take no more jobs: within a heartbeat it finishes those it runs and stays "
                "alive, quiet, until it is stopped (hermes workers --stop)"
            )
            return _ask(request_quiet, "--quiet-worker", store, records, args.quiet_worker, what)
        paused = paused_priorities(store)
    now = time.time()
    if args.json:
        paused_json = {str(p): info for p, info in sorted(paused.items())}
        print(json.dumps({"at": now, "workers": records, "paused": paused_json}), flush=True)
        return 0
    if paused:
        for priority, info in sorted(paused.items()):
            print(f"Priority {priority} paused {info.get('by', '')}".rstrip(), flush=True)
    if not records:
        print(f"No live workers on {redact_url(url)}")
        return 0
    print(table(records, now), flush=True)
    return 0


def _pause(store: SupportsHeartbeats, priority: int | None, resumed: int | None) -> int:
    if priority is not None and resumed is not None:
        raise CliError("--pause and --resume: give one of them")
    try:
        if priority is not None:
            if not pause(store, priority, "with hermes workers --pause"):
                print(f"Priority {priority} was paused already", flush=True)
                return 0
            print(
                f"Paused priority {priority}: each worker finishes the jobs it runs and takes "
                "no more of it, within about a second, until hermes workers --resume",
                flush=True,
            )
            return 0
        assert resumed is not None
        if not resume(store, resumed, "with hermes workers --resume"):
            print(f"Priority {resumed} was not paused", flush=True)
            return 0
    except NotSupportedError as exc:
        raise CliError(str(exc)) from None
    print(f"Resumed priority {resumed}: the workers take it again", flush=True)
    return 0


def _live_worker(records: Sequence[dict[str, Any]], worker_id: str) -> dict[str, Any]:
    found = [r for r in records if r.get("id") == worker_id and r.get("kind") == "worker"]
    if not found:
        raise CliError(f"no live worker {worker_id!r}: `hermes workers --json` lists their ids")
    return found[0]


def _ask(
    request: Callable[[SupportsHeartbeats, str, str], None],
    option: str,
    store: SupportsHeartbeats,
    records: Sequence[dict[str, Any]],
    worker_id: str,
    what: str,
) -> int:
    """Leave ``request`` (stop, quiet) for the live worker ``worker_id``; say what it does."""
    record = _live_worker(records, worker_id)
    try:
        request(store, worker_id, f"with hermes workers {option}")
    except NotSupportedError as exc:
        raise CliError(str(exc)) from None
    print(
        f"Asked worker {worker_id} ({record.get('host', '?')} pid {record.get('pid', '?')}) to "
        f"{what}",
        flush=True,
    )
    return 0
