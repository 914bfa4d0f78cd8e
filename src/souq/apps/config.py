"""``souq.toml``: an app's config, in fly.toml's shape, and the machine configs it makes.

::

    app = "web"
    primary_region = "mad"

    [build]
    dir = "."                    # packed into an image at each deploy; or image = "web:v1"

    [env]
    GREETING = "salaam"

    [processes]                  # process groups: a name and its command line
    app = "python3 server.py"
    worker = "python3 worker.py"

    [http_service]               # the proxy routes HTTP to the `app` group (its `processes`)
    internal_port = 8080
    auto_stop_machines = "stop"
    auto_start_machines = true
    min_machines_running = 1
    processes = ["app"]
      [[http_service.checks]]
      path = "/healthz"
      interval = "5s"
      timeout = "2s"

    [[vm]]
    cpus = 1
    memory_mb = 256

    [deploy]
    strategy = "rolling"         # rolling | canary | bluegreen | immediate
    max_unavailable = 0.33       # a fraction of a group's machines, or a count
    wait_timeout = "5m"

    [regions]                    # machines per region (of every process group)
    mad = 2
    syd = 1

Unknown keys and bad values are :class:`~souq.errors.InvalidInput` naming the file, the line and
the key (:mod:`souq.apps.toml`). Pure: reading the file is the caller's.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from souq.apps.toml import TomlText
from souq.model.machine import APP_NAME_PATTERN
from souq.model.release import Strategy
from souq.model.services import Autostop, Check, Concurrency, Duration, Grace, Service, ServicePort

__all__ = [
    "DEFAULT_GROUP",
    "AppConfig",
    "BuildConfig",
    "DeployConfig",
    "HttpCheck",
    "HttpService",
    "ServiceConfig",
    "VmConfig",
    "load_app_config",
]

DEFAULT_GROUP = "app"  # the process group of an app that names none (fly.toml's too)
_GROUP = re.compile(r"^[a-z]([a-z0-9-]{0,29}[a-z0-9])?$")  # a DNS label, shorter
_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
_MEMORY = re.compile(r"^\s*(\d+)\s*(mb|gb)\s*$", re.IGNORECASE)


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BuildConfig(_Section):
    dir: str | None = Field(default=None, description="a directory packed into the image")
    image: str | None = Field(
        default=None, description="an image: sha256:…, a name, or a registry's"
    )

    @model_validator(mode="after")
    def _one(self) -> BuildConfig:
        if (self.dir is None) == (self.image is None):
            raise ValueError("give either `dir` or `image`")
        return self


class _TcpCheck(_Section):
    """``[[services.tcp_checks]]``: a connection to the service's port."""

    interval: Duration = 15.0
    timeout: Duration = 10.0
    grace_period: Grace = 0.0


class HttpCheck(_TcpCheck):
    """``[[http_service.checks]]``: an HTTP GET of ``path`` on the service's port."""

    path: str = "/"
    method: Literal["get", "GET"] = "get"


class _Serving(_Section):
    internal_port: int = Field(ge=1, le=65535)
    auto_start_machines: bool = True
    auto_stop_machines: bool | Autostop = "off"
    min_machines_running: int = Field(default=0, ge=0, le=10_000)
    processes: list[str] = Field(default_factory=list)
    concurrency: Concurrency | None = None

    def autostop(self) -> Literal["off", "stop", "suspend"]:
        v = self.auto_stop_machines
        return "stop" if v is True else "off" if v is False else v


class HttpService(_Serving):
    """``[http_service]``: HTTP on the proxy's port."""

    force_https: bool = Field(default=False, description="accepted for fly.toml; no TLS here yet")
    checks: list[HttpCheck] = Field(default_factory=list)


class ServiceConfig(_Serving):
    """``[[services]]``: the general form (ports and their handlers, TCP and HTTP checks)."""

    protocol: Literal["tcp"] = "tcp"
    ports: list[ServicePort] = Field(default_factory=lambda: [ServicePort(handlers=["http"])])
    http_checks: list[HttpCheck] = Field(default_factory=list)
    tcp_checks: list[_TcpCheck] = Field(default_factory=list)
    checks: list[HttpCheck] = Field(default_factory=list, description="as http_checks")


class VmConfig(_Section):
    """``[[vm]]``: the machines' size (of the groups in ``processes``, or of all)."""

    cpus: float = Field(default=1, gt=0, le=1024)
    memory_mb: int = Field(default=256, gt=0, le=16 * 1024 * 1024)
    memory: str | None = Field(default=None, description="fly.toml's form, e.g. '512mb', '1gb'")
    processes: list[str] = Field(default_factory=list)

    def memory_in_mb(self) -> int:
        if self.memory is None:
            return self.memory_mb
        match = _MEMORY.match(self.memory)
        assert match is not None  # checked by the validator
        amount = int(match.group(1))
        return amount * 1024 if match.group(2).lower() == "gb" else amount

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        if v is not None and not _MEMORY.match(v):
            raise ValueError(f"{v!r} is not a size: write e.g. '512mb' or '1gb'")
        return v


class DeployConfig(_Section):
    strategy: Strategy = Strategy.ROLLING
    max_unavailable: float = Field(
        default=0.33, gt=0, description="a fraction (< 1) of a group's machines, or a count"
    )
    wait_timeout: Duration = Field(default=300.0, description="seconds, or e.g. '5m'")

    def unavailable(self, machines: int) -> int:
        """How many of ``machines`` may be down at once (at least one)."""
        if self.max_unavailable < 1:
            return max(1, int(machines * self.max_unavailable))
        return max(1, int(self.max_unavailable))


class AppConfig(_Section):
    app: str = Field(pattern=APP_NAME_PATTERN)
    primary_region: str = Field(pattern=_REGION.pattern)
    build: BuildConfig | None = None
    env: dict[str, str] = Field(default_factory=dict)
    processes: dict[str, str] = Field(default_factory=dict)
    http_service: HttpService | None = None
    services: list[ServiceConfig] = Field(default_factory=list)
    vm: list[VmConfig] = Field(default_factory=list)
    deploy: DeployConfig = Field(default_factory=DeployConfig)
    regions: dict[str, int] = Field(default_factory=dict)

    @field_validator("processes")
    @classmethod
    def _processes(cls, v: dict[str, str]) -> dict[str, str]:
        for name, command in v.items():
            if not _GROUP.match(name):
                raise ValueError(
                    f"process group {name!r}: 1-31 lowercase letters, digits and '-', "
                    "starting with a letter (a DNS label)"
                )
            try:
                if not shlex.split(command):
                    raise ValueError(f"process group {name!r} has an empty command")
            except ValueError as exc:
                raise ValueError(f"process group {name!r}: {exc}") from None
        return v

    @field_validator("regions")
    @classmethod
    def _regions(cls, v: dict[str, int]) -> dict[str, int]:
        for region, count in v.items():
            if not _REGION.match(region):
                raise ValueError(f"region {region!r}: lower-case letters, digits and '-'")
            if not 0 <= count <= 1000:
                raise ValueError(f"region {region!r}: a count of 0 to 1000 machines")
        return v

    # -- what it makes ---------------------------------------------------------------------

    def unknown_groups(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Where a section names a process group ``[processes]`` does not have, and which."""
        known = set(self.groups())
        found: list[tuple[tuple[str | int, ...], str]] = []
        if self.http_service is not None:
            found += [(("http_service", "processes"), g) for g in self.http_service.processes]
        for i, s in enumerate(self.services):
            found += [(("services", i, "processes"), g) for g in s.processes]
        for i, v in enumerate(self.vm):
            found += [(("vm", i, "processes"), g) for g in v.processes]
        return [(loc, g) for loc, g in found if g not in known]

    def groups(self) -> list[str]:
        """The process groups, in the file's order (``app`` when it names none)."""
        return list(self.processes) or [DEFAULT_GROUP]

    def served(self, group: str) -> bool:
        """Whether the group has services (the proxy routes to it)."""
        return bool(self._services_of(group))

    def counts(self) -> dict[str, int]:
        """Machines of each group per region: ``[regions]``, else one in the primary region."""
        return dict(self.regions) if self.regions else {self.primary_region: 1}

    def machine_config(self, group: str, *, image: str, release: int) -> dict[str, Any]:
        """The machine config (API shape) of a machine of ``group`` running ``image``, part of
        release ``release``."""
        command = self.processes.get(group)
        services, checks = self._services_of(group), self._checks_of(group)
        vm = self._vm_of(group)
        config: dict[str, Any] = {
            "image": image,
            "cmd": shlex.split(command) if command else [],
            "env": dict(self.env),
            "guest": {"cpus": vm.cpus, "memory_mb": vm.memory_in_mb()} if vm else {},
            "metadata": {"souq_release": str(release), "souq_process_group": group},
            "restart": {"policy": "always" if services else "on-failure"},
        }
        if services:
            config["services"] = [s.model_dump(mode="json") for s in services]
        if checks:
            config["checks"] = {k: c.model_dump(mode="json") for k, c in checks.items()}
        return config

    def _applies(self, processes: list[str], group: str) -> bool:
        return not processes or group in processes

    def _services_of(self, group: str) -> list[Service]:
        out: list[Service] = []
        http = self.http_service
        if http is not None and self._applies(http.processes, group):
            out.append(_service(http, [ServicePort(handlers=["http"])]))
        for s in self.services:
            if self._applies(s.processes, group):
                out.append(_service(s, s.ports))
        return out

    def _checks_of(self, group: str) -> dict[str, Check]:
        checks: dict[str, Check] = {}
        http = self.http_service
        if http is not None and self._applies(http.processes, group):
            for i, c in enumerate(http.checks):
                checks[f"http-{i}"] = _http_check(c, http.internal_port)
        for n, s in enumerate(self.services):
            if not self._applies(s.processes, group):
                continue
            for i, c in enumerate([*s.http_checks, *s.checks]):
                checks[f"service-{n}-http-{i}"] = _http_check(c, s.internal_port)
            for i, t in enumerate(s.tcp_checks):
                checks[f"service-{n}-tcp-{i}"] = Check(
                    type="tcp",
                    port=s.internal_port,
                    interval=t.interval,
                    timeout=t.timeout,
                    grace_period=t.grace_period,
                )
        return checks

    def _vm_of(self, group: str) -> VmConfig | None:
        chosen = [v for v in self.vm if group in v.processes]
        chosen = chosen or [v for v in self.vm if not v.processes]
        return chosen[0] if chosen else None


def _service(s: _Serving, ports: list[ServicePort]) -> Service:
    return Service(
        internal_port=s.internal_port,
        ports=ports,
        autostart=s.auto_start_machines,
        autostop=s.autostop(),
        min_machines_running=s.min_machines_running,
        concurrency=s.concurrency or Concurrency(),
    )


def _http_check(c: HttpCheck, port: int) -> Check:
    return Check(
        type="http",
        port=port,
        path=c.path,
        interval=c.interval,
        timeout=c.timeout,
        grace_period=c.grace_period,
    )


def load_app_config(text: str, path: str = "souq.toml") -> AppConfig:
    """Parse and check ``text`` (the contents of ``path``); :class:`InvalidInput` names the
    line and the key of the first problem."""
    doc = TomlText.parse(text, path)
    try:
        config = AppConfig.model_validate(doc.data)
    except ValidationError as exc:
        # A misspelt key is also a missing one: say the misspelling, it explains both.
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        first = errors[0]
        loc = [p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown key"
        elif first["type"] == "missing":
            message = "missing: it is required"
        raise doc.error(loc, message, hint="see docs/apps.md for souq.toml's keys") from None
    for where, group in config.unknown_groups():
        raise doc.error(
            where,
            f"process group {group!r} is not in [processes]",
            hint=f"name one of {', '.join(config.groups())}",
        )
    return config
