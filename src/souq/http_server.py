"""uvicorn inside a daemon that owns its event loop and its signals."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn

__all__ = ["EmbeddedServer"]


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
