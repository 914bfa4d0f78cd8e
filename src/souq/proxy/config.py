"""The relay's settings, frozen and checked in one place."""

from __future__ import annotations

from dataclasses import dataclass

from souq.limits import HttpLimits, require_positive

__all__ = ["RelayConfig"]

_HTTP = HttpLimits()  # the deadlines every Souq HTTP server keeps (souq.limits)


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """How one proxy process behaves.

    ``domain``: ``APP.<domain>`` routes to app APP. ``region``: the proxy's own region (nearest
    machines first). ``queue_timeout_s``: how long a request may wait for a machine (queued at
    the hard limit, or while one wakes) before ``503 no_machines``; ``queue_limit``: how many
    may wait per app. ``replay_body_bytes``: how much of a request body is kept so that a retry
    or a ``souq-replay`` can send it again. ``idle_per_machine``: the keep-alive connections
    kept open to each machine; ``upstream_idle_s`` / ``client_idle_s``: how long an unused
    keep-alive connection to a machine / from a client stays open. ``header_timeout_s``: a
    request's headers must be in by then, from the connection's opening or the request's first
    byte; ``body_grace_s``, ``body_min_rate``: its body by ``body_grace_s`` after them plus a
    second per ``body_min_rate`` bytes received (not counting while the proxy itself holds the
    reading); past either the client gets 408 and the connection is closed (checked every
    second)."""

    domain: str = "localhost"
    region: str | None = None
    queue_timeout_s: float = 10.0
    queue_limit: int = 512
    connect_timeout_s: float = 5.0
    replay_body_bytes: int = 64 * 1024
    idle_per_machine: int = 128
    upstream_idle_s: float = 30.0
    client_idle_s: float = 75.0
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = _HTTP.header_timeout_s
    body_grace_s: float = _HTTP.body_grace_s
    body_min_rate: int = _HTTP.body_min_rate
    backlog: int = 1024

    def __post_init__(self) -> None:
        if not self.domain or self.domain.startswith(".") or self.domain != self.domain.lower():
            raise ValueError(f"domain {self.domain!r}: lower case, without a leading dot")
        require_positive(
            self,
            "queue_timeout_s",
            "connect_timeout_s",
            "upstream_idle_s",
            "client_idle_s",
            "header_timeout_s",
            "body_grace_s",
        )
        if self.body_min_rate < 1:
            raise ValueError("body_min_rate must be at least 1")
        if self.queue_limit < 0 or self.replay_body_bytes < 0 or self.idle_per_machine < 0:
            raise ValueError("queue_limit, replay_body_bytes and idle_per_machine must be >= 0")
