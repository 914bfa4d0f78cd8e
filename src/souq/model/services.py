"""What a machine serves, in Fly's shape: ``services`` (the ports the edge proxy routes to it,
with autostart, autostop and concurrency limits) and ``checks`` (how the proxy tells a healthy
machine from one to keep out of rotation).

A machine does not bind the port it names: every machine of a worker shares the host, so the
worker gives each ``internal_port`` a free host port of its own (:class:`MachineAddress`) and the
process reads it from ``PORT`` (the first service's) or ``PORT_<internal_port>``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_serializer, field_validator, model_validator

from souq.model.base import Input, Record
from souq.model.choices import Autostop
from souq.model.durations import format_go_duration, seconds_of

__all__ = [
    "Autostop",
    "Check",
    "Concurrency",
    "Duration",
    "Grace",
    "MachineAddress",
    "Service",
    "ServicePort",
    "parse_duration_s",
]


def parse_duration_s(value: Any) -> float:
    """``"15s"``, ``"500ms"``, ``"1m30s"`` (Go's duration text, as Fly writes it) or a number of
    seconds, as seconds; more than zero."""
    seconds = seconds_of(value)
    if seconds <= 0:
        raise ValueError("a duration must be more than zero")
    return seconds


def _grace_s(value: Any) -> float:
    return seconds_of(value)


# A field of seconds that also takes "15s", "500ms", "1m"; a grace period may be 0.
Duration = Annotated[float, BeforeValidator(parse_duration_s)]
Grace = Annotated[float, BeforeValidator(_grace_s)]


_HANDLERS = {
    "tls": "the edge proxy serves plain HTTP and TCP; terminate TLS in front of it",
    "pg_tls": "the edge proxy serves plain HTTP and TCP; terminate TLS in front of it",
    "proxy_proto": "the PROXY protocol is not supported",
    "edge_http": "the edge proxy knows only `http`",
}


class ServicePort(Input):
    """A port the proxy listens on for the service: ``handlers: ["http"]`` terminates HTTP
    (routing by Host, headers added); no handler passes TCP through."""

    port: int | None = Field(default=None, ge=1, le=65535, description="the edge's port")
    handlers: list[Literal["http"]] = Field(
        default_factory=list, description='`["http"]`, or none for raw TCP'
    )

    @field_validator("handlers", mode="before")
    @classmethod
    def _handlers(cls, v: Any) -> Any:
        for handler in v if isinstance(v, list) else []:
            if isinstance(handler, str) and handler != "http":  # another shape: typed below
                why = _HANDLERS.get(handler, "the edge proxy knows only `http`")
                raise ValueError(f"handler {handler!r} is not supported by Souq ({why})")
        return v


class Concurrency(Input):
    """Fly's limits: the proxy prefers machines under ``soft_limit`` and never sends one more
    than ``hard_limit`` (it queues, then answers 503)."""

    type: Literal["connections", "requests"] = "connections"
    soft_limit: int = Field(default=20, ge=1, le=1_000_000)
    hard_limit: int = Field(default=25, ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _limits(self) -> Concurrency:
        if self.soft_limit > self.hard_limit:
            raise ValueError(
                f"soft_limit ({self.soft_limit}) must not exceed hard_limit ({self.hard_limit})"
            )
        return self


class Service(Input):
    protocol: Literal["tcp"] = Field(default="tcp", description="`tcp` (HTTP rides on it)")

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol(cls, v: Any) -> Any:
        if v == "udp":
            raise ValueError("udp services are not supported by Souq (the edge proxy is TCP)")
        return v

    internal_port: int = Field(ge=1, le=65535, description="the port the app serves on")
    ports: list[ServicePort] = Field(
        default_factory=lambda: [ServicePort(handlers=["http"])],
        description="how the edge reaches it (default: HTTP on the proxy's port)",
    )
    autostart: bool = Field(default=True, description="a request starts a stopped machine")
    autostop: Autostop = Field(default="off", description="what the proxy does to an idle machine")
    min_machines_running: int = Field(
        default=0, ge=0, le=10_000, description="autostop leaves at least this many (per region)"
    )
    concurrency: Concurrency = Field(default_factory=Concurrency)

    @field_validator("autostop", mode="before")
    @classmethod
    def _autostop(cls, v: Any) -> Any:
        # fly.toml also says `auto_stop_machines = true/false`.
        if v is True:
            return "stop"
        if v is False:
            return "off"
        return v


class Check(Input):
    type: Literal["http", "tcp"]
    port: int = Field(ge=1, le=65535, description="an internal port (a service's, or its own)")
    path: str = Field(default="/", pattern=r"^/", max_length=2048, description="http: GET this")
    interval: Duration = Field(default=15.0, le=86_400, description="seconds, or e.g. '15s'")
    timeout: Duration = Field(default=10.0, le=3600, description="seconds, or e.g. '2s'")
    grace_period: Grace = Field(
        default=0.0, ge=0, le=3600, description="failures right after a start do not count"
    )

    @field_serializer("interval", "timeout", "grace_period")
    def _go_duration(self, seconds: float) -> str:
        # Written as Fly writes durations ("15s"): Fly's client reads a number as nanoseconds.
        return format_go_duration(seconds)


class MachineAddress(Record):
    """Where a machine is reached: the worker's address and the host port it gave each internal
    port (``{internal_port: host_port}``).

    On a worker with a private network (:mod:`souq.network`) the machine has a network of its
    own: ``private_ip`` is its IPv6 address on its app's network (Fly's ``private_ip``),
    ``ip4`` its IPv4 link address on the worker, ``network`` the network's name; it listens on
    its internal ports themselves, so ``host`` is ``ip4`` and each port maps to itself. All
    three are given at the claim and kept for the machine's life. The link address is the
    worker's own: a proxy on another host reaches the machine at ``edge_host`` (the worker's
    advertise address, when it is not loopback) on ``edge_ports``, a host port per internal
    port of a service the edge routes, forwarded into the machine by the worker."""

    host: str
    ports: dict[int, int] = Field(default_factory=dict)
    private_ip: str = Field(default="", description="its IPv6 address on its private network")
    ip4: str = Field(default="", description="its IPv4 link address on its worker")
    network: str = Field(default="", description="the private network it is on")
    edge_host: str = Field(
        default="", description="where a proxy of any host reaches it (its worker's address)"
    )
    edge_ports: dict[int, int] = Field(
        default_factory=dict,
        description="{internal_port: port at edge_host} of the services the edge routes",
    )

    def port_for(self, internal_port: int) -> int | None:
        return self.ports.get(internal_port)

    def reached_at(self, internal_port: int) -> tuple[str, int] | None:
        """Where a proxy reaches ``internal_port``: at ``edge_host`` when the worker forwards
        it there (from any host), else at ``host``."""
        edge = self.edge_ports.get(internal_port)
        if edge is not None and self.edge_host:
            return self.edge_host, edge
        port = self.ports.get(internal_port)
        return None if port is None else (self.host, port)
