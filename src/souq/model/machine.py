"""Machines: the config a user asks for, and the machine record a worker keeps."""

from __future__ import annotations

import re
import signal as _signal
from typing import Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    computed_field,
    field_validator,
    model_serializer,
    model_validator,
)

from souq.clock import iso_from_ms
from souq.limits import (
    CONSTRAINTS_MAX,
    DNS_LABEL_MAX,
    SERVICES_MAX,
    check_argv,
    check_env,
    check_metadata,
    dns_label_problem,
)
from souq.model.base import Input, Record
from souq.model.choices import (
    RUN_STARTS,
    EventType,
    MachineState,
    PriorityClass,
    RestartPolicy,
)
from souq.model.constraint import Constraint
from souq.model.fly_fields import (
    CONFIG_UNSUPPORTED,
    INIT_UNSUPPORTED,
    PORT_UNSUPPORTED,
    ROOTFS_UNSUPPORTED,
    SERVICE_UNSUPPORTED,
    FlyInput,
    drop_unset,
)
from souq.model.machine_parts import GuestConfig, RestartConfig, StopConfig, normalise_signal
from souq.model.placement import Placement
from souq.model.prices import MaxPrice
from souq.model.schedule import Schedule, ScheduleText, TimeZoneName, parse_schedule
from souq.model.services import Check, MachineAddress, Service
from souq.model.volume import MachineMount

__all__ = [
    "APP_NAME_PATTERN",
    "CheckStatus",
    "GuestConfig",
    "Machine",
    "MachineConfig",
    "MachineEvent",
    "MachineInit",
    "MachineState",
    "OpRecord",
    "RestartConfig",
    "RestartPolicy",
    "SandboxConfig",
    "StopConfig",
    "normalise_signal",
    "preempted_event",
    "schedule_period_s",
]

APP_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
MAX_SERVICES = SERVICES_MAX


class MachineInit(FlyInput):
    """Fly's ``init``: what the machine runs. ``exec`` replaces the image's entrypoint and
    command; ``entrypoint`` and ``cmd`` replace either one (with an image; without one the
    command is ``entrypoint + cmd``). Souq's own ``cmd`` (top level) is ``exec``."""

    unsupported = INIT_UNSUPPORTED
    exec: list[str] = Field(default_factory=list)
    entrypoint: list[str] = Field(default_factory=list)
    cmd: list[str] = Field(default_factory=list)

    @field_validator("exec", "entrypoint", "cmd", mode="before")
    @classmethod
    def _argv(cls, v: Any) -> Any:
        return [] if v is None else v

    def command(self, image: bool) -> list[str]:
        """The command it names by itself: ``exec``, or without an image ``entrypoint +
        cmd`` (with one, those resolve against the image's own at launch)."""
        if self.exec:
            return list(self.exec)
        return [] if image else [*self.entrypoint, *self.cmd]


def _fly_services(data: dict[str, Any]) -> dict[str, Any]:
    """Fly's services in Souq's shape: unsupported fields refused (or dropped, unset), and each
    service's own ``checks`` moved to the machine's, named after the service's port.

    Raw input, not validated yet: a part of another shape than Fly's is left as it is (or
    refused naming it), for the typed validation to name; never assumed."""
    services = data.get("services")
    given = data.get("checks")
    if not isinstance(services, list) or not isinstance(given, dict | None):
        return data
    checks = dict(given or {})
    shaped = []
    for i, given in enumerate(services):
        where = f"services[{i}]."
        kept = drop_unset(given, SERVICE_UNSUPPORTED, where)
        if not isinstance(kept, dict):
            shaped.append(kept)
            continue
        service = dict(kept)
        if isinstance(service.get("ports"), list):
            service["ports"] = [
                drop_unset(port, PORT_UNSUPPORTED, f"{where}ports[{j}].")
                for j, port in enumerate(service["ports"])
            ]
        own = service.pop("checks", None) or []
        if not isinstance(own, list):
            raise ValueError(f"{where}checks: a list of checks, each an object")
        for k, check in enumerate(own):
            if not isinstance(check, dict):
                raise ValueError(f"{where}checks[{k}]: a check is an object")
            kind = check.get("type") or "tcp"
            name = f"servicecheck-{k:02d}-{kind}-{service.get('internal_port')}"
            checks[name] = {"port": service.get("internal_port"), "type": kind, **check}
        shaped.append(service)
    return {**data, "services": shaped, **({"checks": checks} if checks else {})}


class SandboxConfig(Input):
    network: bool = Field(default=True, description="false: the machine sees only `lo`")


class RootfsConfig(FlyInput):
    """Fly's ``rootfs``: what becomes of a machine's writes to its image's root file system."""

    unsupported = ROOTFS_UNSUPPORTED
    persist: Literal["never", "always"] = Field(
        default="never",
        description="`never`: each start begins from the image (Fly's default); `always`: the "
        "machine's writable layer is kept across stops and restarts (until it is destroyed)",
    )


class MachineConfig(Input):
    cmd: list[str] = Field(
        default_factory=list,
        description="the command and its arguments; with an `image`, empty runs the image's own",
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=r"^\S+$",
        description="the image it runs (`sha256:…` or a name, see `souq image list`): its files "
        "are the machine's working directory, its command and env apply unless given here; "
        "placement prefers workers that have it cached",
    )
    init: MachineInit = Field(
        default_factory=MachineInit,
        description="Fly's form of the command (`exec`, `entrypoint`, `cmd`); `cmd` above is "
        "`init.exec`",
    )
    driver: Literal["exec", "sandbox"] | None = Field(
        default=None,
        description="`sandbox`: isolated under bubblewrap (its own mount, pid, ipc, uts and user "
        "namespaces; an image is its root file system); `exec`: a plain process; unset: "
        "`sandbox` wherever the worker can isolate, else `exec` (its placement record says so)",
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    rootfs: RootfsConfig = Field(default_factory=RootfsConfig)
    env: dict[str, str] = Field(default_factory=dict)
    guest: GuestConfig = Field(default_factory=GuestConfig)
    restart: RestartConfig = Field(default_factory=RestartConfig)
    stop_config: StopConfig = Field(default_factory=StopConfig)
    metadata: dict[str, str] = Field(default_factory=dict)
    constraints: list[Constraint] = Field(
        default_factory=list,
        max_length=CONSTRAINTS_MAX,
        description="every one must hold on the worker that takes it",
    )
    distinct_workers_for: Literal["app"] | None = Field(
        default=None, description="`app`: never two machines of this app on one worker"
    )
    services: list[Service] = Field(
        default_factory=list,
        max_length=MAX_SERVICES,
        description="ports the edge proxy routes to (each gets a host port: see `PORT`)",
    )
    checks: dict[str, Check] = Field(
        default_factory=dict, max_length=MAX_SERVICES, description="health checks, by name"
    )
    auto_destroy: bool = Field(
        default=False, description="destroy it when it exits and its restart policy says stay"
    )
    schedule: ScheduleText = Field(
        default=None,
        description="start it while it is stopped: Fly's `hourly`, `daily`, `weekly`, "
        "`monthly` (30 days) or a duration such as `90s` (that long after it last started), "
        "or a cron expression such as `0 3 * * *` (at those times, in `schedule_time_zone`)",
    )
    schedule_time_zone: TimeZoneName = Field(
        default=None,
        description="the IANA time zone a cron `schedule` is read in (Nomad's "
        "`periodic.time_zone`; default UTC)",
    )
    mounts: list[MachineMount] = Field(
        default_factory=list,
        description="the volume it mounts (one, as on Fly): it runs on the volume's worker",
    )
    standbys: list[str] = Field(
        default_factory=list,
        max_length=MAX_SERVICES,
        description="machines this one stands by for: it stays stopped, on another worker, "
        "until one of theirs goes down",
    )
    priority_class: PriorityClass = Field(
        default=PriorityClass.STANDARD,
        description="`reserved` (never displaced), `standard` or `spot` (displaced first): a "
        "create that fits nowhere may displace machines of a lower class (docs/placement.md)",
    )
    max_price: MaxPrice = Field(
        default=None,
        description="the most it bids, per hour (none: no limit); among machines of one class "
        "the cheapest bids are displaced first",
    )

    def internal_ports(self) -> list[int]:
        """The ports the machine serves on, each once: its services' in order, then its
        checks' (the worker gives each a host port)."""
        ports = [s.internal_port for s in self.services]
        ports += [c.port for c in self.checks.values()]
        return list(dict.fromkeys(ports))

    @field_validator("cmd")
    @classmethod
    def _cmd(cls, v: list[str]) -> list[str]:
        if v and not v[0].strip():
            raise ValueError("the command (cmd[0]) must not be empty")
        check_argv(v)
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str]) -> dict[str, str]:
        check_metadata(v)
        return v

    @model_validator(mode="before")
    @classmethod
    def _fly_fields(cls, data: Any) -> Any:
        data = drop_unset(data, CONFIG_UNSUPPORTED)
        if not isinstance(data, dict):
            return data
        init = data.get("init")
        if isinstance(init, dict) and init.get("exec") and init.get("exec") == data.get("cmd"):
            # The command in both forms, as the serializer writes it for Fly's clients (and so
            # every peer's message): one kept, before validation rather than by copies after.
            data = {**data, "init": {**init, "exec": []}}
        return _fly_services(data)

    @model_validator(mode="after")
    def _runs_something(self) -> MachineConfig:
        named = self.init.command(image=self.image is not None)
        if named and self.cmd and named != self.cmd:
            raise ValueError(
                f"cmd {self.cmd} and the command init names {named} disagree: give one of them"
            )
        config = self.model_copy(update={"cmd": named}) if named and not self.cmd else self
        if config.init.exec and config.init.exec == config.cmd:  # one form kept: `cmd`
            config = config.model_copy(update={"init": config.init.model_copy(update={"exec": []})})
        runs = config.cmd or config.init.entrypoint or config.init.cmd
        if not runs and config.image is None:
            raise ValueError("cmd: give the command to run, or an `image` whose command runs")
        return config

    @model_serializer(mode="wrap")
    def _with_fly_init(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A Fly client reads the command from `init` only: it is written there too.
        data: dict[str, Any] = handler(self)
        init = data.get("init")
        if self.cmd and isinstance(init, dict) and not self.init.command(self.image is not None):
            data["init"] = {**init, "exec": list(self.cmd)}
        return data

    @field_validator("checks")
    @classmethod
    def _checks(cls, v: dict[str, Check]) -> dict[str, Check]:
        for name in v:
            if not _NAME.match(name):
                raise ValueError(f"check name {name!r}: 1-63 letters, digits, '-', '_' or '.'")
        return v

    @property
    def schedule_period_s(self) -> float | None:
        """An interval schedule's period (None: not scheduled, or a cron expression)."""
        schedule = self.parsed_schedule()
        return None if schedule is None else schedule.period_s

    def parsed_schedule(self) -> Schedule | None:
        """``schedule`` read in ``schedule_time_zone`` (None: not scheduled)."""
        if self.schedule is None:
            return None
        return parse_schedule(self.schedule, self.schedule_time_zone)

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[MachineMount]) -> list[MachineMount]:
        if len(v) > 1:
            raise ValueError("a machine mounts at most one volume (as on Fly)")
        return v

    @field_validator("standbys")
    @classmethod
    def _standbys(cls, v: list[str]) -> list[str]:
        for machine_id in v:
            if not _NAME.match(machine_id):
                raise ValueError(f"standbys: {machine_id!r} is not a machine id")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        check_env(v)
        for key in v:
            if key.startswith("SOUQ_"):
                raise ValueError(f"{key!r}: names starting with SOUQ_ are set by Souq")
        return v


def schedule_period_s(schedule: str) -> float:
    """Seconds between two runs of an interval schedule (ValueError: not a schedule, or a cron
    expression, which has no fixed period)."""
    period = parse_schedule(schedule).period_s
    if period is None:
        raise ValueError(f"schedule {schedule!r} is a cron expression: it has no fixed period")
    return period


def validate_name(v: str | None) -> str | None:
    """A machine's name is a DNS label (it may name the machine in a host name)."""
    if v is not None and dns_label_problem("name", v):
        raise ValueError(
            f"name must be 1-{DNS_LABEL_MAX} lowercase letters, digits and '-', starting and "
            f"ending with a letter or digit (a DNS label): {v!r} is not"
        )
    return v


class MachineEvent(Record):
    # A string, not the enum: a record from a newer agent, of a type this side does not know
    # yet, still reads.
    type: str = Field(description=", ".join(EventType))
    status: MachineState = Field(description="the machine's state after the event")
    source: Literal["agent", "user"]
    timestamp: int = Field(description="milliseconds since the epoch")
    exit_code: int | None = None
    signal: str | None = None
    message: str | None = None
    oom_killed: bool = Field(
        default=False, description="an exit: the kernel's OOM killer ended the process"
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def request(self) -> dict[str, Any] | None:
        """Fly's form of an exit: ``{"exit_event": {exit_code, signal (a number), exited_at,
        restarting}}``; none for other events."""
        if self.type != EventType.EXIT:
            return None
        number = _signal.Signals[self.signal].value if self.signal in _SIGNALS else -1
        return {
            "exit_event": {
                "exit_code": self.exit_code if self.exit_code is not None else -1,
                "signal": number,
                "oom_killed": self.oom_killed,
                "requested_stop": False,
                "restarting": self.status is MachineState.STARTING,
                "exited_at": iso_from_ms(self.timestamp),
            }
        }


_SIGNALS = frozenset(_signal.Signals.__members__)


class OpRecord(Record):
    """One step of a machine's operation log (``GET .../machines/{id}/ops``), oldest first."""

    op_id: str
    kind: str = Field(description="create, start, stop, restart, signal, destroy")
    state: str = Field(description="the operation's state after the step (done: finished)")
    event: str = Field(description="what moved it: begin, idle, spawned, exited, recover...")
    timestamp: int = Field(description="milliseconds since the epoch")
    detail: dict[str, Any] = Field(default_factory=dict, description="the operation's params")


class CheckStatus(Record):
    """A health check of a machine as its worker last ran it."""

    name: str
    status: Literal["passing", "warning", "critical"] = Field(
        description="warning: not run yet, or failing within its grace period"
    )
    output: str = Field(default="", description="what the check saw")
    updated_at: str


class Machine(Record):
    id: str
    instance_id: str = Field(
        default="", description="the version of its config: a new one with every update"
    )
    name: str
    app: str
    region: str
    worker_id: str
    state: MachineState
    config: MachineConfig
    created_at: str
    updated_at: str
    events: list[MachineEvent] = Field(default_factory=list, description="newest first")
    placement: Placement | None = None
    restarts: int = 0
    pid: int | None = None
    exit_code: int | None = None
    address: MachineAddress | None = Field(
        default=None, description="where it serves: host and the host port of each internal port"
    )
    checks: list[CheckStatus] = Field(
        default_factory=list, description="its health checks as its worker runs them (started)"
    )
    gpu_ids: list[int] = Field(
        default_factory=list,
        description="the worker's GPUs it got, by index (its env's SOUQ_GPUS); empty: none",
    )
    cordoned: bool = Field(
        default=False, description="out of the proxies' rotation: it runs, gets no new requests"
    )
    skip_secrets: bool = Field(
        default=False,
        description="it starts without its app's secrets, every time: asked for (Fly's "
        "skip_secrets), or made (or last updated) by a token that may not read them",
    )

    # Fly's names for what the record holds already (written, never read back).
    @computed_field  # type: ignore[prop-decorator]
    @property
    def version(self) -> str:
        """Fly's name for ``instance_id``."""
        return self.instance_id

    @computed_field  # type: ignore[prop-decorator]
    @property
    def private_ip(self) -> str:
        """Its address on its private network (``address.private_ip``); on a worker without
        one, where it is reached: its worker's address (``address.host``)."""
        if self.address is None:
            return ""
        return self.address.private_ip or self.address.host

    @computed_field  # type: ignore[prop-decorator]
    @property
    def image_ref(self) -> dict[str, Any]:
        """Fly's parts of ``config.image``: registry, repository, tag, and the digest of the
        image it runs (``sha256:…`` of the manifest its claim resolved, whatever name the
        config gives)."""
        ref = image_ref_of(self.config.image)
        pulled = self.placement.image if self.placement is not None else None
        if pulled is not None and pulled.reference:
            ref["digest"] = pulled.reference
        return ref

    @computed_field  # type: ignore[prop-decorator]
    @property
    def host_status(self) -> str:
        """Fly's: ``ok`` (its worker answered for it)."""
        return "ok"


def preempted_event(machine: Machine) -> MachineEvent | None:
    """The event ``preempted`` of ``machine`` if it is newer than its last start (None: it was
    never displaced, or it started again since): displaced, it holds no room on its worker until
    a start takes some again."""
    for event in machine.events:  # newest first
        if event.type == EventType.PREEMPTED:
            return event
        if event.type in RUN_STARTS:
            return None
    return None


def image_ref_of(image: str | None) -> dict[str, Any]:
    """``image`` split as Fly's ``image_ref`` is: ``registry``, ``repository``, ``tag``,
    ``digest`` (each "" when absent), ``labels``."""
    ref = {"registry": "", "repository": "", "tag": "", "digest": "", "labels": {}}
    if not image:
        return ref
    name, _, digest = image.partition("@")
    if name.startswith("sha256:"):
        return {**ref, "digest": name}
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        ref["registry"], name = first, rest
    repository, colon, tag = name.rpartition(":") if ":" in name else (name, "", "")
    return {**ref, "repository": repository, "tag": tag if colon else "", "digest": digest}
