"""uvicorn inside a daemon that owns its event loop and its signals, with Souq's deadlines per
connection (:mod:`souq.http_guard`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from souq.http_guard import guarded_protocol
from souq.limits import HttpLimits

__all__ = ["EmbeddedServer", "server_config"]

# Seconds an idle keep-alive connection stays open after its last answer (uvicorn's own).
KEEP_ALIVE_S = 5


def server_config(
    app: ASGIApp, *, limits: HttpLimits | None = None, **options: Any
) -> uvicorn.Config:
    """uvicorn's config for one of Souq's APIs: httptools with the deadlines of ``limits``, no
    lifespan, no access log."""
    return uvicorn.Config(
        app,
        http=guarded_protocol(limits or HttpLimits()),
        lifespan="off",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_S,
        **options,
    )


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers (whoever runs the loop owns the signals), and
    with an event for "listening"."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()
