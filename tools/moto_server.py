"""moto's SQS-compatible server, with one fix that keeps deep queues fast.

moto decides whether a message outlived the queue's retention period by
asking for *all* of the queue's attributes, which counts every message in
the queue -- once per message received. Draining N messages then costs
O(N^2): 900 messages took ~40 s of receives. Here the check reads the one
attribute it needs. Behaviour is unchanged; only the test server is faster.

    python tools/moto_server.py -H 127.0.0.1 -p PORT [--keep-alive]

moto's server (werkzeug's) closes every connection after its response, where
SQS keeps it open for the next request: a client then never holds a
connection between two calls, and a test that drops one under the client
finds none. With ``--keep-alive`` a front server on HOST:PORT keeps its
clients' HTTP/1.1 connections open and hands each request to moto on a
loopback port of its own, Host header and all (moto names queue URLs after it).
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from moto.core.utils import unix_time
from moto.server import main
from moto.sqs.models import SQSBackend


def _within_retention(self: SQSBackend, queue_name: str, message: Any) -> bool:
    retention_s = int(self.get_queue(queue_name).message_retention_period)
    return bool(retention_s + message.sent_timestamp / 1000 > unix_time())


SQSBackend.is_message_valid_based_on_retention_period = _within_retention  # type: ignore[method-assign]

#: Headers about one connection, not the request: the front sets its own.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "content-length",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


class _KeepAlive(BaseHTTPRequestHandler):
    """Keeps the client's connection; each request goes to moto on a connection of its own."""

    protocol_version = "HTTP/1.1"
    #: moto's port on 127.0.0.1.
    inner_port = 0

    def forward(self) -> None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            # botocore always sends a Content-Length; reading chunks is not worth it here.
            self.send_error(411, "this test server needs a Content-Length")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        inner = http.client.HTTPConnection("127.0.0.1", self.inner_port, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            inner.request(self.command, self.path, body=body, headers=headers)
            response = inner.getresponse()
            data = response.read()
        finally:
            inner.close()
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = forward

    def log_message(self, format: str, *args: Any) -> None:
        """Not logged: moto logs every request it is handed."""


def _serve_kept_alive(host: str, port: int, moto_args: list[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        inner_port: int = probe.getsockname()[1]
    # moto builds some URLs from its port: the clients' is the front's.
    os.environ["MOTO_PORT"] = str(port)
    moto = threading.Thread(
        target=main,
        args=(["-H", "127.0.0.1", "-p", str(inner_port), *moto_args],),
        name="moto",
        daemon=True,
    )
    moto.start()
    # The front's port opens once moto is there to answer: clients wait for that port.
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", inner_port)) == 0:
                break
        if not moto.is_alive() or time.monotonic() > deadline:
            sys.exit(f"moto_server: moto did not listen on 127.0.0.1:{inner_port}")
        time.sleep(0.05)
    _KeepAlive.inner_port = inner_port
    front = ThreadingHTTPServer((host, port), _KeepAlive)
    front.daemon_threads = True
    front.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=5000)
    parser.add_argument("--keep-alive", action="store_true")
    args, rest = parser.parse_known_args()
    if args.keep_alive:
        _serve_kept_alive(args.host, args.port, rest)
    else:
        main()
