"""The keep-alive pool: idle connections to each machine, last in first out, bounded.

Last in, first out keeps the warm connections busy and lets the cold ones reach ``idle_s``
and close (:meth:`UpstreamPool.sweep`, called every second by the relay). A connection the
machine closes while idle leaves the pool at once.
"""

from __future__ import annotations

import asyncio

from souq.proxy.upstream import Address, UpstreamConnection

__all__ = ["UpstreamPool"]


class UpstreamPool:
    """Idle keep-alive connections per machine address, last in first out."""

    def __init__(self, *, per_machine: int, idle_s: float, connect_timeout_s: float) -> None:
        self.per_machine = per_machine
        self.idle_s = idle_s
        self.connect_timeout_s = connect_timeout_s
        self.idle: dict[Address, list[UpstreamConnection]] = {}
        self._loop = asyncio.get_running_loop()
        self.now = self._loop.time()  # a coarse clock, set by every sweep: idle times need no more

    def checkout(self, address: Address) -> UpstreamConnection | None:
        conns = self.idle.get(address)
        while conns:
            conn = conns.pop()
            if not conn.closed:
                return conn
        return None

    async def connect(self, address: Address) -> UpstreamConnection:
        """A new connection (raises OSError or TimeoutError)."""
        async with asyncio.timeout(self.connect_timeout_s):
            _, conn = await self._loop.create_connection(
                lambda: UpstreamConnection(self, address), address[0], address[1]
            )
        return conn

    def checkin(self, conn: UpstreamConnection) -> None:
        conns = self.idle.get(conn.address)
        if conns is None:
            conns = self.idle[conn.address] = []
        if len(conns) >= self.per_machine:
            conn.close()
            return
        conn.idle_since = self.now
        conns.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        conns = self.idle.get(conn.address)
        if conns and conn in conns:
            conns.remove(conn)

    def sweep(self) -> None:
        """Close the connections idle for longer than ``idle_s``."""
        self.now = now = self._loop.time()
        limit = now - self.idle_s
        for address, conns in list(self.idle.items()):
            for conn in [c for c in conns if c.idle_since < limit or c.closed]:
                conns.remove(conn)
                conn.close()
            if not conns:
                del self.idle[address]

    def has_idle(self, address: Address) -> bool:
        """Whether an idle kept-alive connection to ``address`` is here."""
        return any(not conn.closed for conn in self.idle.get(address, ()))

    def idle_count(self) -> int:
        return sum(len(conns) for conns in self.idle.values())

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()
