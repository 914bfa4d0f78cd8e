"""Helpers for the proxy's integration tests: machine processes and a raw HTTP client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httptools
import uvloop

from souq.natsserver import free_port
from souq.proxy import Backend

APP_SCRIPT = Path(__file__).resolve().parents[1] / "proxy_echo_app.py"
T = TypeVar("T")


def run(body: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``body`` on uvloop, as the proxy runs."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(body())


@dataclass
class Machine:
    """One machine: a real process of tests/proxy_echo_app.py on a loopback port."""

    machine_id: str
    region: str = "mad"
    tcp: bool = False
    port: int = field(default_factory=free_port)
    tcp_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Machine:
        env = dict(
            os.environ,
            PORT=str(self.port),
            SOUQ_MACHINE_ID=self.machine_id,
            SOUQ_REGION=self.region,
        )
        if self.tcp:
            env["TCP_PORT"] = str(self.tcp_port)
        self.process = subprocess.Popen(
            [sys.executable, str(APP_SCRIPT)], env=env, stdout=subprocess.PIPE
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith(b"listening"):
            self.stop()
            raise RuntimeError(f"machine {self.machine_id} did not start: {line!r}")
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(10)
            if self.process.stdout is not None:
                self.process.stdout.close()

    def backend(self, app: str, **changes: Any) -> Backend:
        return Backend(
            machine_id=self.machine_id,
            app=app,
            region=self.region,
            host="127.0.0.1",
            port=self.port,
            **changes,
        )


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    rest: bytes = b""  # bytes after a 101's head

    def json(self) -> Any:
        return json.loads(self.body)


class RawClient:
    """HTTP/1.1 over one socket, written by hand: pipelining, upgrades, broken answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.ready: list[Response] = []
        self.heads = 0  # how many of the next answers are to HEAD requests
        self._new_parser()

    @classmethod
    async def open(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def _new_parser(self) -> None:
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self._headers, self._body = {}, []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        if self.heads and self._parser.get_status_code() >= 200:
            self.heads -= 1
            self.ready.append(Response(self._parser.get_status_code(), self._headers, b""))
            self._reset = True

    def on_body(self, data: bytes) -> None:
        self._body.append(data)

    def on_message_complete(self) -> None:
        if not getattr(self, "_reset", False):
            status = self._parser.get_status_code()
            self.ready.append(Response(status, self._headers, b"".join(self._body)))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def request(
        self,
        path: str = "/",
        *,
        host: str = "web.localhost",
        method: str = "GET",
        headers: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> Response:
        if method == "HEAD":
            self.heads += 1
        await self.send(head(path, host=host, method=method, headers=headers, body=body) + body)
        return await self.response()

    async def response(self, *, timeout: float = 10.0) -> Response:
        return await asyncio.wait_for(self._response(), timeout)

    async def _response(self) -> Response:
        while not self.ready:
            data = await self.reader.read(65536)
            if not data:
                if self._headers and not {"content-length", "transfer-encoding"} & set(
                    self._headers
                ):
                    status = self._parser.get_status_code()
                    return Response(status, self._headers, b"".join(self._body))
                raise ConnectionError(f"closed before the answer was complete: {self._headers}")
            self._reset = False
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserUpgrade as upgrade:
                status = self._parser.get_status_code()
                return Response(status, self._headers, b"", data[upgrade.args[0] :])
            if self._reset:
                self._reset = False
                self._new_parser()
        return self.ready.pop(0)

    async def closed(self) -> bool:
        """Whether the proxy closed this connection (reads up to its end)."""
        try:
            return await asyncio.wait_for(self.reader.read(), 5) == b""
        except (ConnectionError, TimeoutError):
            return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def head(
    path: str = "/",
    *,
    host: str = "web.localhost",
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    headers = dict(headers or {})
    if body and "Transfer-Encoding" not in headers:
        headers.setdefault("Content-Length", str(len(body)))
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
