"""The agent's configuration: typed, frozen, validated once, unknown keys rejected."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from souq.agent.machines.restart import Backoff
from souq.jobs.core import DEFAULT_LEASE_MS
from souq.limits import LOG_MAX_BYTES, check_metadata
from souq.network.addresses import DNS_PORT, FLYCAST_PORT

__all__ = ["DEFAULT_DATA_DIR", "AgentConfig", "Region"]

DEFAULT_DATA_DIR = Path("~/.local/share/souq/agent")
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _region(v: str) -> str:
    if not _TOKEN.match(v):
        raise ValueError("a region is 1-64 letters, digits, '-' or '_' (e.g. mad)")
    return v


Region = Annotated[str, AfterValidator(_region)]  # a worker's region, as configs name it


DEFAULT_PORTS = (20000, 29999)
DEFAULT_IMAGE_CACHE_MB = 10 * 1024
DEFAULT_JOBS = 4


def _address_port(text: str) -> tuple[str, int]:
    """``ADDRESS:PORT``, an IPv6 address in brackets (``[fdaa::3]:53``)."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 address without brackets: where its port starts is unsaid
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r} is not ADDRESS:PORT (e.g. [fdaa::3]:53)")
    return host, int(port)


class AgentConfig(BaseModel):
    """How one worker agent runs.

    ``data_dir`` holds ``state.db`` (SQLite: machines, reservations, events, the op log) and
    ``machines/.agent/<id>/output.log``; it defaults to ``~/.local/share/souq/agent``. ``cpus``,
    ``memory_mb``, ``disk_mb`` (default: the data dir's free space), ``gpus`` (default 0) and
    ``gpu_model`` override what the host fingerprint reports. By default SIGTERM leaves machine
    processes running so that the next agent on the same data dir re-adopts them;
    ``stop_machines_on_exit`` (set by ``souq dev``) stops them first.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    region: Region
    nats_url: str
    auth_dir: Path | None = Field(
        default=None, description="the cluster's auth directory (souq cluster init)"
    )
    worker_id: str | None = Field(
        default=None,
        description="with an auth directory holding several agent credentials: which one "
        "(agent-ID.nk); the worker takes its id from its credential",
    )
    data_dir: Path = Field(default_factory=DEFAULT_DATA_DIR.expanduser)
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    disk_mb: int | None = Field(default=None, ge=0)
    gpus: int | None = Field(default=None, ge=0)
    gpu_model: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="the model of its GPUs (machines may ask for one with guest.gpu_model)",
    )
    labels: dict[str, str] = Field(default_factory=dict)
    log_max_bytes: int = Field(
        default=LOG_MAX_BYTES,
        ge=4096,
        description="a machine's output log rotates past this size; one rotated file is kept, "
        "so a machine's output takes at most about twice this on disk",
    )
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="serve Prometheus /metrics here; 0: off"
    )
    stop_machines_on_exit: bool = False
    spot_notice_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="when its region's spot price rises above a running spot machine's bid, "
        "the machine is told (an event `preempt_notice`) and stopped this long after (AWS "
        "gives two minutes); 0: stopped at once (its stop signal, then its kill timeout)",
    )
    restart_backoff_base_s: float = Field(default=0.1, ge=0)
    restart_backoff_max_s: float = Field(default=30.0, ge=0)
    restart_reset_after_s: float = Field(default=10.0, ge=0)
    cgroups: Literal["auto", "v2", "v1", "none"] = Field(
        default="auto", description="how machine limits are enforced (auto: v2, else v1, else none)"
    )
    pids_max: int | None = Field(default=4096, gt=0, description="per machine; None: unlimited")
    advertise: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="the address machines are reached at (they listen on 127.0.0.1)",
    )
    ports: tuple[int, int] = Field(
        default=DEFAULT_PORTS,
        description="the host ports given to machines, LOW-HIGH (each agent of a host its own)",
    )
    machine_user: str | None = Field(
        default=None,
        description="the user machines run as, NAME or UID (default: nobody when the agent is "
        "root, else the agent's own user)",
    )
    default_driver: Literal["auto", "exec", "sandbox"] = Field(
        default="auto",
        description="the driver of a machine whose config names none: `auto` isolates "
        "(`sandbox`) where this host can, `exec` runs plain processes unless asked",
    )
    private_network: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="each sandboxed machine in a network namespace of its own with a private "
        "address on its app's network (souq.network): `auto` (the default: where root, ip, "
        "iptables and ip6tables, the sandbox and souq-waiter work; the worker says why not "
        "elsewhere), `on` (refused where the host cannot), `off`",
    )
    underlay: str = Field(
        default="",
        description="this host's address that other workers route its machines' private "
        "network to (docs/network.md); empty: the advertise address unless it is loopback, "
        "else none (machines reach only this worker's)",
    )
    underlay_encryption: Literal["none", "wireguard"] = Field(
        default="none",
        description="what goes between this worker's machines and other workers' over the "
        "underlay: `none` (routed straight or over VXLAN: a trusted network) or `wireguard` "
        "(encrypted; only to workers that encrypt too)",
    )
    underlay_link: Literal["auto", "vxlan", "direct"] = Field(
        default="auto",
        description="between this worker and another whose IPv4 underlay address is on this "
        "host's own IPv4 subnet and that publishes its link-local address too: `auto` (the "
        "default) routes straight over that link by IPv6 link-local next hops, no "
        "encapsulation, once a probe (ping from this worker's /48 to the other's over the "
        "link) is answered, else and whenever it stops being answered over VXLAN, said in "
        "the log; `direct`: straight without a probe (the segment must carry IPv6); `vxlan`: "
        "over VXLAN, which any IPv4 network carries, publishing no link-local",
    )
    flycast_port: int = Field(
        default=FLYCAST_PORT,
        ge=0,
        le=65535,
        description="the port of the host's edge proxy at [fdaa::4] that the machines' Flycast "
        "connections are sent to (`souq proxy --flycast`; docs/network.md); 0: no Flycast",
    )
    names_port: int = Field(
        default=DNS_PORT,
        ge=1,
        le=65535,
        description="the port at [fdaa::3] where this cluster's name server answers the "
        "machines' `.internal` names: their questions to port 53 are sent there, and an agent "
        "holding the `view` credential answers there itself unless another of this cluster "
        "does (docs/names.md); another port than 53 keeps two clusters of one host apart",
    )
    allow_root_machines: bool = Field(
        default=False, description="let machine_user be root (refused otherwise)"
    )
    image_cache_mb: int = Field(
        default=DEFAULT_IMAGE_CACHE_MB,
        ge=0,
        description="bound of the image cache (DATA_DIR/images): unused images beyond it are "
        "evicted, least recently used first",
    )

    jobs: int = Field(
        default=DEFAULT_JOBS,
        ge=0,
        le=1024,
        description="batch jobs this worker runs at once, pulled from the queue when it has "
        "room (0: it runs none)",
    )
    job_lease_s: float = Field(
        default=DEFAULT_LEASE_MS / 1000,
        ge=1,
        le=3600,
        description="a claimed job's lease: renewed every third of it while the job runs; a "
        "job whose worker died goes back to the queue once it ends",
    )
    dns: tuple[str, int] | None = Field(
        default=None,
        description="answer `.internal` names (and forward the rest to the host's resolvers) "
        "on this address, UDP and TCP (`[fdaa::3]:53` where machines have a private network; "
        "docs/names.md); None: off",
    )
    dns_upstreams: tuple[tuple[str, int], ...] | None = Field(
        default=None,
        description="where names outside `.internal` are forwarded, ADDRESS:PORT each, in "
        "order; None: the host's resolvers (/etc/resolv.conf, port 53)",
    )

    @field_validator("underlay")
    @classmethod
    def _underlay(cls, v: str) -> str:
        if v:
            try:
                return ipaddress.ip_address(v.strip("[]")).compressed
            except ValueError:
                raise ValueError(f"{v!r} is not an IP address") from None
        return v

    @field_validator("dns", mode="before")
    @classmethod
    def _dns(cls, v: Any) -> Any:
        return _address_port(v) if isinstance(v, str) else v

    @field_validator("dns_upstreams", mode="before")
    @classmethod
    def _dns_upstreams(cls, v: Any) -> Any:
        if isinstance(v, list | tuple):
            return tuple(_address_port(x) if isinstance(x, str) else x for x in v)
        return v

    @field_validator("ports", mode="before")
    @classmethod
    def _ports(cls, v: Any) -> Any:
        if isinstance(v, str):
            first, sep, last = v.partition("-")
            if not sep or not first.strip().isdigit() or not last.strip().isdigit():
                raise ValueError(f"{v!r} is not a port range LOW-HIGH (e.g. 20000-29999)")
            v = (int(first), int(last))
        if isinstance(v, tuple | list) and len(v) == 2:
            low, high = int(v[0]), int(v[1])
            if not 1024 <= low <= high <= 65535:
                raise ValueError(f"port range {low}-{high}: use 1024-65535, low to high")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        check_metadata(v, what="labels")
        return v

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir(cls, v: Any) -> Any:
        if v is None:
            return DEFAULT_DATA_DIR.expanduser()
        return Path(v).expanduser() if isinstance(v, str | Path) else v

    @property
    def backoff(self) -> Backoff:
        return Backoff(
            base_s=self.restart_backoff_base_s,
            max_s=self.restart_backoff_max_s,
            reset_after_s=self.restart_reset_after_s,
        )
