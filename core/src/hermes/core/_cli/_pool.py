"""``hermes worker --processes N``: the supervisor's side of the worker command.

What the supervisor checks before any child starts, the directory of
prometheus_client's multiprocess mode, what ``--reload`` watches, and the
pool's exit summary. Each child runs the worker command itself
(``_run.run(args, child=link)``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hermes.core._cli import _run
from hermes.core._cli._common import (
    CliError,
    configure_logging,
    default_url,
    describe_error,
    one_line,
)
from hermes.core._cli._loading import load_object
from hermes.core._cli._report import serve_metrics
from hermes.core._cli._report import summary as report_summary
from hermes.core.app._dispatcher import DispatcherStats
from hermes.core.model._errors import BrokerRefusedError, DriverError, HermesError
from hermes.core.run._pool import (
    EXIT_FAILED,
    EXIT_MISTAKE,
    ChildLink,
    HelperError,
    HelperLink,
    HelperMain,
    PoolConfig,
    PoolStats,
    Supervisor,
)
from hermes.core.spi._registry import driver_for_url

#: prometheus_client's multiprocess mode: where every process writes its metrics.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def run(args: argparse.Namespace) -> int:
    """Supervise the pool until it stops; print its summary; the exit code."""
    if args.max_items:
        raise CliError(
            "--max-items stops one worker process; with a supervisor (--processes, "
            "--max-jobs-per-child, --max-memory-per-child, --reload) give "
            "--max-jobs-per-child N to replace each worker process after N messages"
        )
    if args.reload and importlib.util.find_spec("watchfiles") is None:
        raise CliError(
            "--reload needs the file-watching library watchfiles: pip install 'hermes-core[reload]'"
        )
    made_dir = None
    if args.metrics_port is not None and not os.environ.get(MULTIPROC_ENV):
        # Before any plugin imports prometheus_client: it picks file-backed values
        # when it is imported, and each child inherits that choice.
        made_dir = tempfile.mkdtemp(prefix="hermes-metrics-")
        os.environ[MULTIPROC_ENV] = made_dir
    try:
        return _supervise(args)
    finally:
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)
            del os.environ[MULTIPROC_ENV]


def _supervise(args: argparse.Namespace) -> int:
    # Mistakes every child would make alike are said once, before any starts: the
    # URL (its scheme installed, its options), and the form of --handlers. The
    # handlers module itself is imported by each child: see hermes.core.run._pool.
    args.url = args.url or default_url()
    driver_for_url(args.url)
    module, sep, attr = args.handlers.partition(":")
    if not (sep and module and attr) or "/" in module or "\\" in module or module.endswith(".py"):
        load_object(args.handlers)  # its one-line CliError, raised before any import
    verbosity = args.verbose - args.quiet
    configure_logging(verbosity, prefix=f"[supervisor pid {os.getpid()}] ")
    helpers: dict[str, HelperMain] = {}
    if args.metrics_port is not None:
        # Served by a process of its own: its threads (the server's, the sampler's)
        # would make every fork of the supervisor a hazard to the child.
        helpers["metrics server"] = lambda link: _serve_metrics(args, verbosity, link)
    config = PoolConfig(
        processes=args.processes,
        grace_s=args.grace,
        max_jobs_per_child=args.max_jobs_per_child,
        max_memory_mb=args.max_memory_per_child,
        reload_paths=(tuple(args.reload_dir) or reload_paths(args.handlers)) if args.reload else (),
    )
    started = time.monotonic()
    try:
        stats = Supervisor(config, lambda link: _child(args, link), helpers).run()
    except HelperError as exc:
        raise CliError(exc.line) from None
    print(summary(stats, time.monotonic() - started), flush=True)
    if stats.fatal is not None:
        raise CliError(stats.fatal)
    return stats.exit_code


def _serve_metrics(args: argparse.Namespace, verbosity: int, link: HelperLink) -> None:
    """The metrics server's helper process: serve ``/metrics`` until the supervisor is gone."""
    configure_logging(verbosity, prefix=f"[metrics pid {os.getpid()}] ")
    try:
        serve_metrics(args.metrics_port, args.url, args.metrics_host)
    except CliError as exc:
        link.fatal(one_line(str(exc)))
        return
    link.ready()
    link.wait_for_supervisor()


def _child(args: argparse.Namespace, link: ChildLink) -> int:
    """One child: the worker command, its one-line mistakes sent to the supervisor to say once.

    A broker failure other than a refusal (unavailable for a moment, a send it
    lost) is no mistake: the child exits :data:`EXIT_FAILED` and is replaced
    with backoff, while the other children go on. Only a mistake -- a
    configuration error, a broker that refuses the credentials -- ends the pool.
    """
    try:
        return _run.run(args, child=link)
    except CliError as exc:
        link.fatal(one_line(str(exc)))
    except BrokerRefusedError as exc:
        link.fatal(describe_error(exc))
    except DriverError:
        # The run logged it at ERROR: the supervisor's death report shows that line.
        return EXIT_FAILED
    except HermesError as exc:
        link.fatal(describe_error(exc))
    except KeyboardInterrupt:
        return 130
    return EXIT_MISTAKE


def reload_paths(spec: str) -> tuple[Path, ...]:
    """The directory of the handlers module's top-level package, found without importing it.

    A module that is a file of its own (``jobs.py``) gives its directory;
    when it cannot be found, the current directory.
    """
    top = spec.partition(":")[0].partition(".")[0]
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        found = importlib.util.find_spec(top) if top else None
    except (ImportError, ValueError):
        found = None
    if found is not None and found.submodule_search_locations:
        return tuple(Path(p) for p in found.submodule_search_locations)
    if found is not None and found.origin and os.path.isfile(found.origin):
        return (Path(found.origin).parent,)
    return (Path(cwd),)


def summary(stats: PoolStats, elapsed_s: float) -> str:
    """The single worker's summary, counted over the pool, and what happened to its children."""
    counts = stats.counts
    dispatcher = DispatcherStats(
        **{name: counts.get(name, 0) for name in DispatcherStats.__dataclass_fields__}
    )
    text = report_summary(dispatcher, elapsed_s)
    children = [f"{stats.started} worker processes started"]
    if stats.recycled:
        children.append(f"{stats.recycled} replaced at their limit")
    if stats.rolled:
        children.append(f"{stats.rolled} replaced by a rolling restart")
    if stats.requested:
        children.append(f"{stats.requested} replaced on a stop request")
    if stats.died:
        children.append(f"{stats.died} died and were replaced")
    return f"{text}; {', '.join(children)}"
