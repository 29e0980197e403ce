"""``hermes job``, ``hermes jobs`` and ``hermes cancel``: reading and cancelling job records."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from hermes.core._cli._common import CliError, clock, one_line
from hermes.core.app._jobs import JobRecord, Jobs, JobState
from hermes.core.model._errors import UnknownJobError
from hermes.core.spi._url import redact_url

if TYPE_CHECKING:
    from hermes.core._cli._common import Commands

#: The records store of every command that reads or writes job records.
RESULTS_URL_ENV = "HERMES_RESULTS_URL"
RESULTS_URL_HELP = (
    "the job records store: a URL whose driver can keep records (memory://, file://, "
    f"redis://, postgresql://); default ${RESULTS_URL_ENV}"
)


def add_results_url(parser: argparse.ArgumentParser, help: str = RESULTS_URL_HELP) -> None:
    """``--results-url`` with its help: the same option on every command that uses records."""
    parser.add_argument("--results-url", metavar="URL", help=help)


def results_url(args: argparse.Namespace, required: bool = True) -> str | None:
    """``--results-url`` or ``$HERMES_RESULTS_URL``; a one-line mistake when required and absent."""
    url: str | None = args.results_url or os.environ.get(RESULTS_URL_ENV) or None
    if url is None and required:
        raise CliError(
            f"say where the job records are: --results-url URL (or ${RESULTS_URL_ENV}), the "
            "store the worker was given with --results-url"
        )
    return url


def open_jobs(url: str) -> Jobs:
    """The records store at ``url``; a URL whose driver cannot keep records is a mistake."""
    try:
        return Jobs(url)
    except ValueError as exc:  # ConfigurationError is one, with the drivers that can
        raise CliError(f"--results-url {redact_url(url)}: {exc}") from None


def add_parser(commands: Commands) -> None:
    """``hermes job``, ``hermes jobs`` and ``hermes cancel``."""
    job = commands.add_parser(
        "job",
        help="show a job's record",
        description="Show the record of one job: its state, attempts, error and result; for a "
        "workflow's id (wf-...), its tree: each chain, group and job with its state.",
    )
    job.add_argument("id", help="the job's id (the message id that hermes emit printed)")
    job.add_argument("--json", action="store_true", help="print the record as JSON")
    add_results_url(job)
    job.set_defaults(run=run_job)

    jobs = commands.add_parser(
        "jobs",
        help="list job records",
        description="List job records, newest first (--oldest: oldest first) in the order "
        "they were created, a page at a time: the last line (on stderr) gives the --after of "
        "the next page. Paging is stable: a job emitted meanwhile does not shift the pages.",
    )
    jobs.add_argument("--state", choices=[s.value for s in JobState], help="only this state")
    jobs.add_argument("--type", help="only jobs of this message type")
    jobs.add_argument("--priority", type=int, help="only jobs emitted on this priority")
    jobs.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    jobs.add_argument("--oldest", action="store_true", help="oldest first")
    jobs.add_argument(
        "--after", metavar="CURSOR", help="the page after this one (a --after printed before)"
    )
    jobs.add_argument("--json", action="store_true", help="print one JSON record per line")
    add_results_url(jobs)
    jobs.set_defaults(run=run_jobs)

    cancel = commands.add_parser(
        "cancel",
        help="cancel a job",
        description="Cancel a job: waiting, scheduled or waiting for a retry, no handler will "
        "start it (the worker that takes it acknowledges it unrun). A running job is told: "
        "an async handler's task is cancelled, a sync handler sees "
        "hermes.core.jobs.current_job().cancelled; one that finishes anyway succeeds.",
    )
    cancel.add_argument("id", help="the job's id")
    add_results_url(cancel)
    cancel.set_defaults(run=run_cancel)


def run_job(args: argparse.Namespace) -> int:
    # Imported here: every `hermes worker` imports this module for --results-url, and
    # the workflows module would add 3 to 5 ms to its start (bench startup row).
    from hermes.core.app._workflows import Workflows, parent_of, root_of

    jobs = open_jobs(_url(args))
    try:
        flows = Workflows(jobs.driver, jobs)
        tree = flows.tree(args.id) if flows.is_node(args.id) else None
        record = jobs.get(args.id) if tree is None else None
    finally:
        jobs.close()
    if tree is not None:
        print(json.dumps(tree, indent=2) if args.json else "\n".join(tree_lines(tree)))
        return 0
    if record is None:
        raise CliError(_unknown(args.id, jobs))
    if args.json:
        print(json.dumps(record.to_json(), indent=2, sort_keys=True))
    else:
        print(describe(record))
        parent = parent_of(record.id)
        if parent is not None:
            print(f"  workflow   step {parent[1]} of {parent[0]} (hermes job {root_of(record.id)})")
    return 0


def tree_lines(node: dict[str, Any], depth: int = 0) -> list[str]:
    """A workflow's tree, one node a line, its children indented under it."""
    what = f"{node['kind']:<5}  {node['id']}"
    if node["kind"] == "job" and node.get("type"):
        what += f"  ({node['type']})"
    lines = [f"{'  ' * depth}{what}  {node['state']}"]
    for child in node.get("children", ()):
        lines += tree_lines(child, depth + 1)
    return lines


def run_jobs(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise CliError(f"--limit must be at least 1, got {args.limit}")
    jobs = open_jobs(_url(args))
    try:
        records, following = jobs.page(
            args.after or None,
            oldest_first=args.oldest,
            state=args.state,
            type=args.type,
            priority=args.priority,
            limit=args.limit,
        )
    except ValueError as exc:  # a cursor this store did not write
        raise CliError(f"--after {args.after!r}: {exc}") from None
    finally:
        jobs.close()
    for record in records:
        if args.json:
            print(json.dumps(record.to_json(), sort_keys=True))
        else:
            print(line(record))
    if not args.json:
        print(f"{len(records)} job{'s' if len(records) != 1 else ''}", file=sys.stderr)
    if following is not None:
        print(f"next page: --after {following}", file=sys.stderr)
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    jobs = open_jobs(_url(args))
    try:
        record = jobs.cancel(args.id)
    except UnknownJobError:
        raise CliError(_unknown(args.id, jobs)) from None
    finally:
        jobs.close()
    if record.state is JobState.CANCELLED:
        print(f"Job #{record.id} ({record.type}) cancelled: no handler will start it")
    elif record.state is JobState.RUNNING:
        print(
            f"Job #{record.id} ({record.type}) is running: its worker is told (an async "
            "handler is cancelled; a sync one stops if it checks current_job().cancelled)"
        )
    else:
        print(f"Job #{record.id} ({record.type}) had already ended: {record.state.value}")
    return 0


def _url(args: argparse.Namespace) -> str:
    url = results_url(args)
    assert url is not None  # required
    return url


def _unknown(job_id: str, jobs: Jobs) -> str:
    return (
        f"no record of job #{job_id} in {jobs.driver!r}: it was emitted without records, "
        "the worker had no --results-url, or the record expired"
    )


def line(record: JobRecord) -> str:
    """One line per record: when, state, type, id, and the error if any."""
    error = f"  {one_line(str(record.error))}" if record.error is not None else ""
    return (
        f"{clock(record.emitted_at)}  {record.state.value:<9}  {record.type}  "
        f"#{record.id}  attempts {len(record.attempts)}{error}"
    )


def describe(record: JobRecord) -> str:
    """The whole record, for a person."""
    rows = [
        f"Job #{record.id} ({record.type})",
        f"  state      {record.state.value}"
        + (" (cancel requested)" if record.cancel_requested else ""),
        f"  priority   {record.priority if record.priority is not None else '?'}",
        f"  emitted    {clock(record.emitted_at)}",
    ]
    if record.started_at is not None:
        rows.append(f"  started    {clock(record.started_at)}")
    if record.finished_at is not None:
        rows.append(f"  finished   {clock(record.finished_at)}")
    if record.retry_at is not None:
        rows.append(f"  retry at   {clock(record.retry_at)}")
    if record.expires_at is not None:
        rows.append(f"  expires    {clock(record.expires_at)}")
    if record.has_result:
        rows.append(f"  result     {json.dumps(record.result)}")
    for n, attempt in enumerate(record.attempts, 1):
        end = clock(attempt.finished_at) if attempt.finished_at is not None else "..."
        rows.append(
            f"  attempt {n}  {attempt.worker}  {clock(attempt.started_at)} - {end}  "
            f"{attempt.outcome or 'running'}"
        )
        if attempt.error is not None:
            rows.append(f"             {one_line(str(attempt.error))}")
    if record.error is not None:
        rows.append(f"  error      {one_line(str(record.error))}")
        if record.error.traceback:
            rows.append("")
            rows.append(record.error.traceback.rstrip())
    return "\n".join(rows)
