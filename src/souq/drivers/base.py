"""The driver interface: how the agent runs one machine (the shape of Nomad's task drivers).

A driver starts a machine's process and returns a :class:`Handle` naming it (pid *and* process
start time, so that a recycled pid is never mistaken for the machine). It reports the exit, sends
signals, stops (signal, then SIGKILL after a timeout), cleans up, and re-adopts a process that an
earlier agent started (``recover``). Drivers raise :class:`SpawnError` when a machine cannot be
started; the agent records that as a ``failed`` machine rather than an error.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

if TYPE_CHECKING:
    from pathlib import Path

    from souq.drivers.users import MachineUser

# How an exit's message says the OOM killer ended it (an event read back is known by it).
OOM_NOTE = "out of memory (oom)"
OOM = "oom"  # an ExitStatus's reason: the kernel's OOM killer ended the process

__all__ = [
    "OOM",
    "OOM_NOTE",
    "ChoosesDrivers",
    "Driver",
    "ExitStatus",
    "Handle",
    "HasMachineDirs",
    "JoinsCgroups",
    "Limits",
    "MachineSpec",
    "MakesAhead",
    "PreparesSpawns",
    "RecordsExits",
    "SpawnError",
    "chooses_drivers",
    "has_machine_dirs",
    "joins_cgroups",
    "makes_ahead",
    "prepares_spawns",
    "records_exits",
]


class SpawnError(Exception):
    """The machine's process could not be started (no such command, permission denied...)."""


@dataclass(frozen=True)
class Limits:
    """What a machine may use, enforced by cgroups where the host has them (None: unlimited)."""

    memory_mb: int | None = None
    cpus: float | None = None
    pids: int | None = None


@dataclass(frozen=True)
class MachineSpec:
    machine_id: str
    app: str
    region: str
    worker_id: str
    cmd: tuple[str, ...]
    env: Mapping[str, str]
    driver: str = "exec"  # "exec" or "sandbox"
    # Who it runs as on the host: None, the driver's machine user; the host driver sets the
    # machine's own uid (souq.drivers.identity) when it has one.
    user: MachineUser | None = None
    persist_rootfs: bool = False  # its writable layer outlives a stop (an image's, overlaid)
    image_user: str = ""  # its image's User (the sandbox runs it as that user inside)
    limits: Limits = Limits()
    network: bool = True  # sandbox only: False gives the machine a network namespace with lo
    cwd: str | None = None  # where it runs; None: its own directory (the driver's)
    image_root: str | None = None  # its image's files (the sandbox mounts them read-only)
    # Its volumes: (the directory on the host, the absolute path the machine mounts it at).
    mounts: tuple[tuple[str, str], ...] = ()
    # Its own network namespace (/run/netns/NAME, souq.network), joined before its exec, and
    # the resolv.conf bound at /etc/resolv.conf inside the sandbox; None: the host's network.
    netns: str | None = None
    resolv_conf: str | None = None


@dataclass(frozen=True)
class Handle:
    machine_id: str
    pid: int
    start_time: float  # the process's start time: with the pid, its identity


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: an exit ``code``, or the ``signal`` that killed it, or neither when
    the status is unknown (a process adopted from an earlier agent is not our child)."""

    code: int | None = None
    signal: str | None = None
    reason: str | None = None  # why, when the driver knows: OOM (killed by the OOM killer)

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        if returncode >= 0:
            return cls(code=returncode)
        try:
            return cls(signal=_signal.Signals(-returncode).name)
        except ValueError:
            return cls(signal=f"signal {-returncode}")

    @property
    def oom_killed(self) -> bool:
        return self.reason == OOM

    @property
    def known(self) -> bool:
        return self.code is not None or self.signal is not None

    def describe(self) -> str:
        if self.oom_killed:
            how = f"killed by {self.signal}" if self.signal else f"exited with code {self.code}"
            return f"{how}: {OOM_NOTE}"
        if self.code is not None:
            return f"exited with code {self.code}"
        if self.signal is not None:
            return f"killed by {self.signal}"
        return "exited; status unknown (the process was adopted from an earlier agent)"


class Driver(Protocol):
    @property
    def name(self) -> str: ...

    def start(self, spec: MachineSpec, *, meanwhile: Callable[[], None] | None = None) -> Handle:
        """Start the machine's process; raise :class:`SpawnError` when it cannot start.
        ``meanwhile`` is called at most once, while the process is on its way (the agent makes
        its claim durable then); if it raises, the process is killed and the error raised."""
        ...

    def watch(self, handle: Handle, on_exit: Callable[[ExitStatus], None]) -> None:
        """Call ``on_exit`` once, from the event loop, with the exit status when the process
        exits (soon if it already has; an unknown status if the handle is not being watched).
        The agent's way to follow a running machine: no task per machine."""
        ...

    async def wait(self, handle: Handle) -> ExitStatus:
        """Until the process exits (:meth:`watch` as a coroutine)."""
        ...

    def signal(self, handle: Handle, sig: int) -> bool:
        """Send ``sig`` to the machine's processes. False when the process is already gone."""
        ...

    def freeze(self, handle: Handle, frozen: bool) -> bool:
        """Freeze the machine's processes where they stand (memory, sockets and port kept), or
        thaw them. False when the process is already gone."""
        ...

    async def stop(self, handle: Handle, sig: int, timeout_s: float) -> ExitStatus:
        """Send ``sig``, then SIGKILL if the process still runs after ``timeout_s``."""
        ...

    def destroy(self, machine_id: str) -> None:
        """Remove everything the driver keeps for the machine (its files)."""
        ...

    def inspect(self, handle: Handle) -> bool:
        """Whether the process runs."""
        ...

    def recover(self, handle: Handle) -> bool:
        """Re-adopt a process an earlier agent started; False unless it is the very same one."""
        ...

    def find(self, machine_id: str) -> Handle | None:
        """The handle the driver recorded for a machine's last start, if it kept one (used when
        an agent crashed between starting a process and recording it)."""
        ...

    def read_output(self, machine_id: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Up to ``max_bytes`` of the machine's output from ``offset`` (a logical offset: it
        goes on across the log's rotations), and the output's size."""
        ...

    def output_start(self, machine_id: str) -> int:
        """The offset of the oldest byte of output still kept (older output was rotated out)."""
        ...

    def close(self) -> None:
        """Stop watching processes (they keep running)."""
        ...


@runtime_checkable
class RecordsExits(Protocol):
    """A driver that keeps each machine's last exit status on disk (the exec driver with
    souq-waiter), so that a process that died while no agent watched it is reported with its
    real status."""

    def last_exit(self, machine_id: str) -> ExitStatus: ...


@runtime_checkable
class JoinsCgroups(Protocol):
    """A driver that confines machines in cgroups: the argv prefix that puts another process
    (an exec in the machine) into a machine's cgroup, so that it counts against its limits;
    empty when the host has none."""

    def join_prefix(self, machine_id: str) -> tuple[str, ...]: ...


@runtime_checkable
class HasMachineDirs(Protocol):
    """A driver whose machines each have a directory of their own on the host, the working
    directory of a machine of no image (an exec in the machine runs there)."""

    def machine_dir(self, machine_id: str) -> Path: ...


@runtime_checkable
class PreparesSpawns(Protocol):
    """A driver that can get ready for several spawns at once (the exec driver starts that many
    souq-waiters together, so that they start up in parallel rather than one after another)."""

    def prepare_spawns(self, count: int) -> None: ...


@runtime_checkable
class ChoosesDrivers(Protocol):
    """A driver that runs machines more than one way (the host driver: ``exec`` or
    ``sandbox``): the way a machine whose config names none gets, with why it is not isolated
    when it cannot be, and a check, before a machine exists, that its program can run there
    (:class:`~souq.drivers.programs.ProgramNotRunnable` otherwise)."""

    def default_driver(self) -> tuple[str, str | None]: ...

    def check_program(self, program: str, env: Mapping[str, str], driver: str) -> None: ...


@runtime_checkable
class MakesAhead(Protocol):
    """A driver that makes a machine's sandbox ahead of its claim, for a machine id chosen
    ahead, in a network namespace made for it (:mod:`souq.drivers.warm`): the machine a claim
    then makes with that id starts in it."""

    def keep_ahead(self, spec: MachineSpec, prepare: Callable[[], None]) -> bool: ...

    def ahead_state(self, machine_id: str) -> str: ...

    def give_up_ahead(self, machine_id: str) -> None: ...

    def end_ahead(self) -> list[str]: ...


_OFFERED: dict[tuple[type, Any], bool] = {}


def _offers(kind: type, protocol: Any) -> bool:
    key = (kind, protocol)
    if key not in _OFFERED:
        _OFFERED[key] = issubclass(kind, protocol)
    return _OFFERED[key]


# Which optional protocols a driver offers, answered once per driver class rather than per call
# (an ``isinstance`` against a runtime protocol inspects every member each time: a cost paid on
# every create).


def chooses_drivers(driver: object) -> TypeGuard[ChoosesDrivers]:
    return _offers(type(driver), ChoosesDrivers)


def prepares_spawns(driver: object) -> TypeGuard[PreparesSpawns]:
    return _offers(type(driver), PreparesSpawns)


def makes_ahead(driver: object) -> TypeGuard[MakesAhead]:
    return _offers(type(driver), MakesAhead)


def records_exits(driver: object) -> TypeGuard[RecordsExits]:
    return _offers(type(driver), RecordsExits)


def joins_cgroups(driver: object) -> TypeGuard[JoinsCgroups]:
    return _offers(type(driver), JoinsCgroups)


def has_machine_dirs(driver: object) -> TypeGuard[HasMachineDirs]:
    return _offers(type(driver), HasMachineDirs)
