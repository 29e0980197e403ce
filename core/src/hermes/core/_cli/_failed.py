"""``hermes failed``: list, show, put back or delete what workers kept in a failed-message store."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hermes.core._cli._common import (
    FAILED_URL_ENV,
    URL_ENV,
    CliError,
    add_verbosity,
    configure_logging,
    default_url,
    named_queues,
    setup_priorities,
)
from hermes.core._cli._drivers import table
from hermes.core.app._failed import NO_REASON, ExceptionRecord, FailedMessage, FailedStore
from hermes.core.spi._registry import connect
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands


def add_parser(commands: Commands) -> None:
    """``hermes failed``: its actions (list, show, retry, purge) and their options."""
    failed = commands.add_parser(
        "failed",
        help="list, show, retry or purge the messages workers gave up on",
        description="Read the failed-message store workers keep with --failed-url: list what "
        "is in it, show one message with the exception its handler raised, put messages back "
        "on a worker's queue with their retries reset, or delete them. Needs a store its "
        "driver can list without taking messages: file://, redis:// or postgresql://.",
    )
    url_help = f"the failed-message store, the workers' --failed-url (default: ${FAILED_URL_ENV})"
    failed.add_argument("--url", help=url_help)
    add_verbosity(failed)
    actions = failed.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list",
        help="id, type, retries, when, why and the exception raised, oldest first",
        description="List the store, one line per message.",
    )
    listing.add_argument(
        "--json",
        action="store_true",
        help="every message as one JSON document, payloads and tracebacks included",
    )
    show = actions.add_parser(
        "show",
        help="one message in full: payload, reason and the traceback of what its handler raised",
        description="Show one failed message: its payload, headers, why it was given up on, "
        "and each exception its handlers raised with the traceback.",
    )
    show.add_argument("id", metavar="ID", help="an id from `hermes failed list`")
    show.add_argument("--json", action="store_true", help="the message as one JSON document")
    retry = actions.add_parser(
        "retry",
        help="put messages back on a worker's queue, retries reset",
        description="Send the messages (all without IDs) to --to, due at once with retries 0 "
        "and their id, type and payload kept, then delete them from the store.",
    )
    retry.add_argument("ids", nargs="*", metavar="ID", help="ids from `hermes failed list`")
    retry.add_argument(
        "--to",
        metavar="URL",
        help=f"the workers' queue (default: ${URL_ENV}, else file://./hermes-queue)",
    )
    purge = actions.add_parser(
        "purge", help="delete messages from the store", description="Delete messages for good."
    )
    purge.add_argument("ids", nargs="*", metavar="ID", help="ids from `hermes failed list`")
    purge.add_argument("--all", action="store_true", help="delete every message in the store")
    for action in (listing, show, retry, purge):
        # `hermes failed list --url U -v` works as well as `hermes failed --url U -v list`.
        action.add_argument("--url", default=argparse.SUPPRESS, help=url_help)
        add_verbosity(action, default=argparse.SUPPRESS)
    failed.set_defaults(run=run)


def store_url(given: str | None, option: str) -> str:
    """``given``, else ``$HERMES_FAILED_URL``; a :class:`CliError` without either."""
    url = given or os.environ.get(FAILED_URL_ENV)
    if not url:
        raise CliError(
            f"say where the failed messages are: {option} URL (the worker's --failed-url), "
            f"or ${FAILED_URL_ENV}"
        )
    return url


def run(args: argparse.Namespace) -> int:
    configure_logging(args.verbose - args.quiet)
    url = store_url(args.url, "--url")
    with FailedStore.connect(url) as store:
        if args.action == "list":
            return _list(store, url, args.json)
        if args.action == "show":
            return _show(store, url, args.id, args.json)
        if args.action == "retry":
            to = args.to or default_url("--to", "the workers' queue")
            return _retry(store, url, args.ids, to)
        return _purge(store, url, args.ids, args.all)


#: Longest exception summary on a line of ``hermes failed list``; ``show`` has it all.
LISTED_EXCEPTION_CHARS = 120


def _list(store: FailedStore, url: str, as_json: bool) -> int:
    messages = store.messages()
    if as_json:
        document = {"store": redact_url(url), "messages": [_as_json(m) for m in messages]}
        print(json.dumps(document), flush=True)
        return 0
    if not messages:
        print(f"No failed messages in {redact_url(url)}", flush=True)
        return 0
    _warn_unless_a_store(messages, url)
    rows = [["ID", "TYPE", "RETRIES", "FAILED AT", "REASON", "EXCEPTION"]]
    rows += [
        [
            m.id,
            m.type,
            str(m.retries),
            _when(m.failed_at),
            " ".join(m.failed_reason.split()),
            _listed_exception(m),
        ]
        for m in messages
    ]
    for line in table(rows):
        print(line)
    print(f"{len(messages)} failed message{'s' if len(messages) != 1 else ''} in {redact_url(url)}")
    return 0


def _listed_exception(message: FailedMessage) -> str:
    """``builtins.RuntimeError: card declined``, shortened; ``-`` when nothing was raised."""
    first = message.exception
    if first is None:
        return "-"
    text = first.summary()
    if len(text) > LISTED_EXCEPTION_CHARS:
        text = text[: LISTED_EXCEPTION_CHARS - 3] + "..."
    more = len(message.exceptions) - 1
    return f"{text} (+{more} more)" if more else text


def _show(store: FailedStore, url: str, id_: str, as_json: bool) -> int:
    found = [m for m in store.messages() if m.id == id_]
    if not found:
        raise CliError(
            f"no failed message with id {id_} in {redact_url(url)}; "
            "`hermes failed list` shows the ids"
        )
    message = found[0]
    if as_json:
        print(json.dumps(_as_json(message)), flush=True)
        return 0
    fields = [
        ("id", message.id),
        ("type", message.type),
        ("retries", str(message.retries)),
        ("created", _when(message.created)),
        ("failed at", _when(message.failed_at)),
        ("reason", message.failed_reason),
        ("payload", json.dumps(message.payload, default=str)),
    ]
    fields += [(f"header {name}", value) for name, value in sorted(message.headers.items())]
    width = max(len(name) for name, _ in fields) + 1
    lines = [f"{name + ':':<{width}} {value}" for name, value in fields]
    if not message.exceptions:
        lines.append("No exception was recorded: the reason says what put it here.")
    for record in message.exceptions:
        lines.append("")
        lines.append(_raised_by(record))
        lines.append(record.traceback.rstrip("\n") or "(no traceback recorded)")
    print("\n".join(lines), flush=True)
    return 0


def _raised_by(record: ExceptionRecord) -> str:
    by = f"{record.handler} raised" if record.handler else "Raised"
    return f"{by} {record.exception_class}: {record.message}"


def _as_json(message: FailedMessage) -> dict[str, Any]:
    return {
        "id": message.id,
        "type": message.type,
        "payload": message.payload,
        "created": message.created,
        "retries": message.retries,
        "headers": dict(message.headers),
        "failed_reason": message.failed_reason,
        "failed_at": message.failed_at,
        "exceptions": [record.as_json() for record in message.exceptions],
    }


def _warn_unless_a_store(messages: Sequence[FailedMessage], url: str) -> None:
    """A warning on stderr when messages were not put in the store by a worker.

    A Dispatcher writes ``failed_reason`` with every message it keeps; messages
    without one are most likely jobs waiting on a worker's queue, given as
    ``--url`` by mistake, which ``retry`` and ``purge`` would then move or delete.
    """
    plain = sum(1 for message in messages if message.failed_reason == NO_REASON)
    if not plain:
        return
    print(
        f"hermes: warning: {plain} of {len(messages)} messages in {redact_url(url)} carry no "
        "failed_reason: no worker gave up on them; is this a worker's queue rather than the "
        "failed-message store its --failed-url names?",
        file=sys.stderr,
        flush=True,
    )


def _retry(store: FailedStore, url: str, ids: Sequence[str], to: str) -> int:
    wanted = _existing(store, url, ids)
    chosen = [m for m in store.messages() if wanted is None or m.id in wanted]
    _warn_unless_a_store(chosen, url)
    with connect(to) as target:
        # Each goes back to the priority it failed on, where its workers read.
        _, preset = named_queues(to, [])
        setup_priorities(target, {m.retry_priority for m in chosen}, preset=preset)
        sent = store.retry(target, wanted)
    if not sent:
        print(f"No failed messages in {redact_url(url)}", flush=True)
        return 0
    print(
        f"Put {_count(sent)} back on {redact_url(to)} with retries reset: {_names(sent)}",
        flush=True,
    )
    return 0


def _purge(store: FailedStore, url: str, ids: Sequence[str], everything: bool) -> int:
    if not ids and not everything:
        raise CliError(
            "say what to delete: the IDs `hermes failed list` shows, or --all for every message"
        )
    if ids and everything:
        raise CliError("give IDs or --all, not both")
    deleted = store.purge(_existing(store, url, ids))
    print(
        f"Deleted {deleted} message{'s' if deleted != 1 else ''} from {redact_url(url)}",
        flush=True,
    )
    return 0


def _existing(store: FailedStore, url: str, ids: Sequence[str]) -> set[str] | None:
    """``ids`` as a set (None for every message), once each is known to be in the store."""
    if not ids:
        return None
    found = {message.id for message in store.messages()}
    missing = [id_ for id_ in dict.fromkeys(ids) if id_ not in found]
    if missing:
        raise CliError(
            f"no failed message with id {', '.join(missing)} in {redact_url(url)}; "
            "`hermes failed list` shows the ids; nothing was changed"
        )
    return set(ids)


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _count(messages: Sequence[FailedMessage]) -> str:
    return f"{len(messages)} message{'s' if len(messages) != 1 else ''}"


def _names(messages: Sequence[FailedMessage]) -> str:
    return ", ".join(f"#{m.id} ({m.type})" for m in messages)
