"""The deadlines of a client's request at the proxy: its headers must arrive within
``header_timeout_s`` (from the connection's opening, or the request's first byte), its body at
``body_min_rate`` bytes/s after ``body_grace_s`` (not counting while the proxy itself holds
the reading, e.g. while a machine wakes). The relay's sweeper asks every second
(:meth:`~souq.proxy.relay.Relay._sweep`); a connection past a deadline (a slowloris) is
answered ``408 request_timeout`` when nothing else is being answered on it, and closed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from souq.proxy.errors import RequestTimeout, answer

if TYPE_CHECKING:
    from souq.proxy.downstream import ClientConnection

__all__ = ["late", "time_out"]


def late(client: ClientConnection, now: float) -> str | None:
    """Why ``client`` is past a deadline for its request at ``now``, or None."""
    config = client.relay.config
    if client.head_since and now - client.head_since > config.header_timeout_s:
        return f"the request's headers did not arrive within {config.header_timeout_s:g}s"
    ex = client.parsing
    if ex is None or client.head_since or client.paused or ex.discard:
        return None  # no body being read, or the proxy holds the reading
    due = client.body_since + config.body_grace_s + ex.body_size / config.body_min_rate
    if now > due:
        return (
            f"the request's body came slower than {config.body_min_rate} bytes/s "
            f"after {config.body_grace_s:g}s"
        )
    return None


def time_out(client: ClientConnection, why: str) -> None:
    """408 if nothing is being answered on ``client``, then close it."""
    if client.closed:
        return
    if client.active is None or client.active.response_done:
        client.transport.write(answer(RequestTimeout(why), keep_alive=False))
    client.closed = True
    client.transport.close()
