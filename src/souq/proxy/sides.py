"""The client's side of an exchange as the machine's side sees it.

A machine's connection (:class:`~souq.proxy.upstream.UpstreamConnection`) streams its answer to
the client's connection it serves and tells it what became of the answer; it knows that
connection only as a :class:`ClientSide`, which the client's connection
(:class:`~souq.proxy.downstream.ClientConnection`, the one there is) extends. So the machine's
side stands below the client's and never imports it. It is a class, not a ``typing.Protocol``:
compiled, a call through it is a native call, as to the class itself (a protocol's would go
through the interpreter's attribute lookup: about 1 % more instructions a request, measured).
"""

from __future__ import annotations

import asyncio

from souq.proxy.exchange import Exchange, Replay

__all__ = ["ClientSide"]


class ClientSide(asyncio.Protocol):
    """Where a machine's answer goes, and what it is told about the answer."""

    __slots__ = ("transport", "writing_paused")

    transport: asyncio.Transport
    writing_paused: bool  # its own send buffer is full: the machine's reading pauses

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def pause_for_machine(self) -> None:
        """The machine's connection cannot send as fast as the client sends: stop reading."""
        raise NotImplementedError

    def resume_for_machine(self) -> None:
        raise NotImplementedError

    def response_done(self, ex: Exchange) -> None:
        raise NotImplementedError

    def upstream_failed(self, ex: Exchange, what: str, *, reused: bool) -> None:
        """The machine failed before the client got a byte (on a connection ``reused`` from
        the pool, or a new one)."""
        raise NotImplementedError

    def upstream_broke(self, ex: Exchange) -> None:
        """The machine failed in the middle of its answer."""
        raise NotImplementedError

    def replay(self, ex: Exchange, target: Replay) -> None:
        """The machine asked (``souq-replay``) for the request to go elsewhere."""
        raise NotImplementedError

    def switch(self, ex: Exchange, machine: asyncio.Transport, tail: bytes) -> None:
        """The machine answered 101: the two sockets are to be piped to each other."""
        raise NotImplementedError
