"""``hermes dashboard``: its options, the safety checks before binding, and the server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, cast

from hermes.core import FailedStore, connect, redact_url
from hermes.core._cli._common import (
    URL_HELP,
    CliError,
    add_verbosity,
    configure_logging,
    default_url,
    named_queues,
    setup_priorities,
    whole_number,
)
from hermes.core._cli._jobs import add_results_url, open_jobs, results_url
from hermes.core._cli._limits import LIMITS_URL_ENV
from hermes.core._cli._workers import REGISTRY_URL_ENV
from hermes.core.app._failed import queue_browser
from hermes.core.driver import Driver, SupportsHeartbeats, SupportsLimits

if TYPE_CHECKING:
    from hermes.dashboard._guard import Auth, Hosts

logger = logging.getLogger("hermes.dashboard")

#: The environment variable holding ``user:password`` for HTTP Basic authentication.
AUTH_ENV = "HERMES_DASHBOARD_AUTH"
DEFAULT_PORT = 8900


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "dashboard",
        help="serve a web dashboard: queues, failed messages, jobs, workers, periodic entries",
        description="Serve the Hermes dashboard (hermes-dashboard). It binds 127.0.0.1 unless "
        "--host says otherwise, and refuses any other address without authentication "
        f"(${AUTH_ENV}=user:password, or --token-env), --read-only or not. It answers only "
        "requests for its own address (and --allowed-host names). Every change is a POST from "
        "its own pages with a CSRF token; it acts only on the queues it was started with.",
    )
    parser.add_argument("--url", help=URL_HELP)
    parser.add_argument(
        "--failed-url",
        metavar="URL",
        help="the failed-message store the workers keep what they give up on (their "
        "--failed-url): listed on the Failed page, retried to --url",
    )
    add_results_url(
        parser,
        help="the job records store the workers write (their --results-url): a page per job, "
        "the Jobs list and cancel (default: $HERMES_RESULTS_URL)",
    )
    parser.add_argument(
        "--limits-url",
        metavar="URL",
        help="the store the workers keep their limits in (their --limits-url): each limit's "
        f"use on the Queues page (default: ${LIMITS_URL_ENV}, else --url when it keeps limits)",
    )
    parser.add_argument(
        "--registry-url",
        metavar="URL",
        help="where the workers' heartbeats are kept when --url cannot keep them "
        f"(default: ${REGISTRY_URL_ENV}, else --url)",
    )
    parser.add_argument(
        "--priority",
        type=int,
        action="append",
        default=[],
        metavar="P",
        help="also show and act on the queue of this priority (repeat for several)",
    )
    parser.add_argument(
        "--handlers",
        metavar="MODULE:OBJECT",
        help="the HandlerRegistry or Schedule the schedulers run, for the Periodic page",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=whole_number(1, 65535),
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host is NAME, on any port: the name a reverse proxy "
        "forwards, or this machine's name (repeat for several). Without it only the bound "
        "address is answered (on loopback: 127.0.0.1, localhost, [::1]), so a web page whose "
        "name was rebound to this machine cannot read the dashboard",
    )
    parser.add_argument(
        "--auth-env",
        metavar="NAME",
        default=AUTH_ENV,
        help=f"require HTTP Basic authentication with the user:password in $NAME (default: "
        f"${AUTH_ENV}, when set)",
    )
    parser.add_argument(
        "--token-env",
        metavar="NAME",
        help="require the token in $NAME, as a Bearer token or as the Basic password",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="show everything, change nothing: no retry, delete or purge",
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how often the overview's chart samples the queues (default 10)",
    )
    add_verbosity(parser)
    parser.set_defaults(run=run)


def is_loopback(host: str) -> bool:
    from hermes.dashboard._guard import is_loopback

    return is_loopback(host)


def hosts_from(args: argparse.Namespace) -> Hosts:
    """The Host header values the options let the dashboard answer."""
    from hermes.dashboard._guard import Hosts, split_authority

    for name in args.allowed_host:
        parsed = split_authority(name)
        if parsed is None or parsed[1] is not None:
            raise CliError(
                f"--allowed-host {name}: give a host name alone (dash.example.com), "
                "without scheme, port or path; it is answered on any port"
            )
    return Hosts.bound(args.host, args.port, args.allowed_host)


def auth_from(args: argparse.Namespace) -> Auth | None:
    """The authentication the options configure; a :class:`CliError` for a malformed one."""
    from hermes.dashboard._guard import Auth

    token = None
    if args.token_env:
        token = os.environ.get(args.token_env) or None
        if token is None:
            raise CliError(f"--token-env {args.token_env}: ${args.token_env} is not set or empty")
    user = password = None
    credentials = os.environ.get(args.auth_env) or None
    if credentials is not None:
        user, sep, password = credentials.partition(":")
        if not sep or not user or not password:
            raise CliError(f"${args.auth_env} must be user:password (both non-empty)")
    elif args.auth_env != AUTH_ENV:
        raise CliError(f"--auth-env {args.auth_env}: ${args.auth_env} is not set or empty")
    if token is None and user is None:
        return None
    return Auth(user, password, token)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.verbose - args.quiet)
    auth = auth_from(args)
    if not is_loopback(args.host) and auth is None:
        # Read-only too: the pages show payloads, failure reasons and hosts to whoever asks.
        raise CliError(
            f"--host {args.host} is not a loopback address: set ${AUTH_ENV}=user:password "
            "(or --token-env NAME) before serving the dashboard there"
        )
    hosts = hosts_from(args)
    if not args.sample_interval > 0:
        raise CliError(f"--sample-interval {args.sample_interval:g} must be > 0 seconds")
    url: str = args.url or default_url()
    registry_url = args.registry_url or os.environ.get(REGISTRY_URL_ENV) or None
    from hermes.dashboard._app import create_app
    from hermes.dashboard._state import Dashboard

    schedule = None
    if args.handlers:
        from hermes.core._cli._loading import load_object
        from hermes.core._cli._scheduler import schedule_of

        schedule = schedule_of(load_object(args.handlers), args.handlers)
    from hermes.core.spi._registry import driver_for_url

    plugin, _ = driver_for_url(url)
    driver = connect(url)
    dashboard = Dashboard(driver, url, schedule=schedule, read_only=args.read_only)
    try:
        _, from_url = named_queues(url, [])
        setup_priorities(driver, args.priority, preset=from_url)
        dashboard.browser = queue_browser(plugin, driver)
        if args.failed_url:
            dashboard.failed = FailedStore.connect(args.failed_url)
            dashboard.failed_url = args.failed_url
        records_url = results_url(args, required=False)
        if records_url:
            dashboard.jobs = open_jobs(records_url)
            dashboard.results_url = records_url
        limits_url = args.limits_url or os.environ.get(LIMITS_URL_ENV) or None
        dashboard.limits_store = _store(
            driver, limits_url, SupportsLimits, "--limits-url", "limits"
        )
        registry = _store(driver, registry_url, SupportsHeartbeats, "--registry-url", "heartbeats")
        dashboard.registry = cast("SupportsHeartbeats | None", registry)
        dashboard.sample_interval_s = args.sample_interval
        app = create_app(dashboard, hosts=hosts, auth=auth)
        dashboard.start_sampling()
        _serve(app, args, dashboard, hosts)
    finally:
        dashboard.close()
    return 0


def _store(
    driver: Driver, url: str | None, protocol: type, option: str, what: str
) -> Driver | None:
    """The driver ``option`` names when it keeps ``what`` (a one-line mistake when it does
    not), else the dashboard's own ``driver`` when it does; None when neither."""
    if url is None:
        return driver if isinstance(driver, protocol) else None
    store = connect(url)
    if not isinstance(store, protocol):
        store.close()
        raise CliError(
            f"{option} {redact_url(url)}: {type(store).__name__} keeps no {what}; "
            "name a redis://, file:// or postgresql:// store"
        )
    return store


def _serve(app: object, args: argparse.Namespace, dashboard: object, hosts: Hosts) -> None:
    import uvicorn

    where = f"http://{args.host}:{args.port}/"
    logger.info(
        "Dashboard of %s on %s%s",
        redact_url(getattr(dashboard, "url", "")),
        where,
        " (read-only)" if args.read_only else "",
    )
    logger.info("Dashboard answers Host %s (more with --allowed-host)", hosts.describe())
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=args.host,
        port=args.port,
        # Hermes's own log lines; uvicorn's access log shows paths only (no URL has a secret).
        log_config=None,
        access_log=args.verbose > 0,
        server_header=False,
    )
    server = uvicorn.Server(config)
    try:
        server.run()
    except SystemExit as exc:
        # uvicorn exits 1 when it cannot bind: a user mistake, said in one line.
        raise CliError(
            f"--host {args.host} --port {args.port}: cannot serve there (the port is in use, "
            "or the address is not this machine's)"
        ) from exc
    if not server.started:
        print(f"hermes: dashboard did not start on {where}", file=sys.stderr)
