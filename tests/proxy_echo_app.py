"""A machine's program for the proxy's tests: an HTTP/1.1 server on ``PORT`` (127.0.0.1).

By default it answers with JSON describing what it received (method, path, headers, body's
length and digest), which machine it is (``SOUQ_MACHINE_ID``, ``SOUQ_REGION``), which of its
connections carried the request and how many it has accepted. Paths with a purpose:

* ``/stream?mb=N`` (chunked) and ``/fixed?mb=N`` (Content-Length): N MiB of a fixed pattern;
* ``/hold?key=K`` answers once ``/release?key=K`` was called (``/held`` counts the waiting);
* ``/die`` exits the process after reading the request; ``/die-mid`` after half an answer;
* ``/garbage`` answers bytes that are not HTTP;
* ``/replay?to=region=R`` / ``?to=instance=ID`` answers with ``souq-replay`` unless it is there;
* a request with ``Upgrade: echo`` gets 101, then every byte back.

With ``TCP_PORT`` set, a raw TCP echo listens there too and greets with ``tcp <machine>\\n``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MACHINE = os.environ.get("SOUQ_MACHINE_ID", "m?")
REGION = os.environ.get("SOUQ_REGION", "local")
PATTERN = bytes(range(256)) * 256  # 64 KiB

_lock = threading.Lock()
_counts = {"connections": 0, "held": 0}
_gates: dict[str, threading.Event] = {}


def _gate(key: str) -> threading.Event:
    with _lock:
        return _gates.setdefault(key, threading.Event())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "echo/1"

    def setup(self) -> None:
        super().setup()
        with _lock:
            _counts["connections"] += 1
        self.served = 0

    def log_message(self, format: str, *args: object) -> None:
        return

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            pieces = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(pieces)
                pieces.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _echo(self, body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> None:
        doc = {
            "machine": MACHINE,
            "region": REGION,
            "method": self.command,
            "path": self.path,
            "headers": [[k, v] for k, v in self.headers.items()],
            "body_len": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "body": body[:256].decode(errors="replace"),
            "conn": self.client_address[1],
            "served_on_conn": self.served,
            "connections": _counts["connections"],
        }
        headers = {"Content-Type": "application/json", **(headers or {})}
        self._send(status, json.dumps(doc).encode(), headers)

    def _any(self) -> None:
        self.served += 1
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if self.headers.get("Upgrade", "").lower() == "echo":
            self._upgrade()
            return
        body = self._body()
        route = getattr(self, "route_" + url.path.strip("/").replace("-", "_"), None)
        if route is None:
            self._echo(body)
        else:
            route(body, query)

    def do_GET(self) -> None:
        self._any()

    def do_POST(self) -> None:
        self._any()

    def do_PUT(self) -> None:
        self._any()

    def do_DELETE(self) -> None:
        self._any()

    def do_HEAD(self) -> None:
        self._any()

    def route_stream(self, body: bytes, query: dict[str, str]) -> None:
        chunks = int(float(query.get("mb", "1")) * 16)
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for _ in range(chunks):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(PATTERN), PATTERN))
        self.wfile.write(b"0\r\n\r\n")

    def route_fixed(self, body: bytes, query: dict[str, str]) -> None:
        chunks = int(float(query.get("mb", "1")) * 16)
        self.send_response(200)
        self.send_header("Content-Length", str(chunks * len(PATTERN)))
        self.end_headers()
        for _ in range(chunks):
            self.wfile.write(PATTERN)

    def route_hold(self, body: bytes, query: dict[str, str]) -> None:
        gate = _gate(query["key"])
        with _lock:
            _counts["held"] += 1
        try:
            gate.wait(30)
        finally:
            with _lock:
                _counts["held"] -= 1
        self._echo(body)

    def route_release(self, body: bytes, query: dict[str, str]) -> None:
        _gate(query["key"]).set()
        self._send(200, b"released")

    def route_held(self, body: bytes, query: dict[str, str]) -> None:
        self._send(200, str(_counts["held"]).encode())

    def route_die(self, body: bytes, query: dict[str, str]) -> None:
        os._exit(3)

    def route_die_mid(self, body: bytes, query: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(PATTERN), PATTERN))
        self.wfile.flush()
        os._exit(3)

    def route_garbage(self, body: bytes, query: dict[str, str]) -> None:
        self.wfile.write(b"this is not HTTP at all\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True

    def route_replay(self, body: bytes, query: dict[str, str]) -> None:
        kind, _, target = query["to"].partition("=")
        here = MACHINE if kind == "instance" else REGION
        if target != here:
            self._send(409, b"not here", {"souq-replay": query["to"]})
        else:
            self._echo(body)

    def _upgrade(self) -> None:
        self.send_response(101)
        self.send_header("Connection", "Upgrade")
        self.send_header("Upgrade", "echo")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while data := self.rfile.read1(65536):
            self.connection.sendall(data)


def _tcp_echo(port: int) -> None:
    server = socket.create_server(("127.0.0.1", port))

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.sendall(f"tcp {MACHINE}\n".encode())
            while data := conn.recv(65536):
                conn.sendall(data)

    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def main() -> None:
    port = int(os.environ["PORT"])
    if "TCP_PORT" in os.environ:
        threading.Thread(target=_tcp_echo, args=(int(os.environ["TCP_PORT"]),), daemon=True).start()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    sys.stdout.write(f"listening on {port}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
