"""What acts on one machine in place, without an operation of its life cycle: ``exec`` (a
command in the machine's context), ``ps`` (its processes), its ``metadata`` keys and its
``cordon`` (out of the proxies' rotation). The request bodies a user sends, in Fly's shapes
(:class:`ExecBody`, :class:`MetadataBody`), the bus messages a broker sends the machine's
worker, and the pure rules both sides share: how a command string becomes argv, how output is
bounded, what a process row says.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pydantic import Field, model_validator

from souq.limits import METADATA_KEY_MAX
from souq.model.base import Input, Record
from souq.model.protocol import MachineRef

__all__ = [
    "EXEC_DEFAULT_TIMEOUT_S",
    "EXEC_MAX_TIMEOUT_S",
    "EXEC_OUTPUT_MAX_BYTES",
    "ExecBody",
    "ExecCommand",
    "ExecReply",
    "ListenSocket",
    "MachineCordonCommand",
    "MachineMemory",
    "MetadataBody",
    "MetadataCommand",
    "ProcessSnapshot",
    "ProcessStat",
    "bounded",
    "exec_argv",
    "exit_code_of",
    "process_stat",
]

EXEC_DEFAULT_TIMEOUT_S = 30  # Fly's `timeout` is omitted when 0: this is the default then
EXEC_MAX_TIMEOUT_S = 300
EXEC_OUTPUT_MAX_BYTES = 256 * 1024  # of stdout and of stderr each: the reply crosses the bus
_TRUNCATED = "\n[output truncated at {n} bytes]\n"


def exec_argv(cmd: str | None, command: list[str] | None) -> list[str]:
    """The argv of an exec: Fly's ``cmd`` (one string, split as a POSIX shell splits words:
    quotes and backslashes, no expansion), or Souq's ``command`` (argv as it is). Exactly one."""
    if (cmd is None) == (command is None):
        raise ValueError(
            "give the command as `cmd` (one string, split like a shell would) or `command` "
            "(a list of arguments), not both and not neither"
        )
    if cmd is not None:
        try:
            argv = shlex.split(cmd)
        except ValueError as exc:  # e.g. "No closing quotation"
            raise ValueError(f"cmd: cannot split {cmd[:64]!r} into arguments: {exc}") from None
    else:
        argv = list(command or [])
    if not argv or not argv[0].strip():
        raise ValueError("cmd: the command is empty; name the program to run")
    return argv


class ExecBody(Input):
    """``POST /v1/apps/{app}/machines/{id}/exec``: Fly's ``MachineExecRequest``, or Souq's
    ``command`` (argv) instead of ``cmd``."""

    cmd: str | None = Field(default=None, description="the command line, split like a shell")
    command: list[str] | None = Field(default=None, description="argv, instead of `cmd`")
    container: str | None = Field(default=None, description="Fly's; Souq machines have none")
    machine: bool = Field(default=False, description="Fly's; a Souq machine is one context")
    stdin: str | None = Field(default=None, description="written to the command's stdin")
    timeout: int = Field(
        default=0,
        ge=0,
        le=EXEC_MAX_TIMEOUT_S,
        description=f"seconds (0 or absent: {EXEC_DEFAULT_TIMEOUT_S})",
    )

    @model_validator(mode="after")
    def _one_command(self) -> ExecBody:
        exec_argv(self.cmd, self.command)
        if self.container:
            raise ValueError(
                f"container: Souq machines run no containers; leave out {self.container!r}"
            )
        return self

    def argv(self) -> list[str]:
        return exec_argv(self.cmd, self.command)

    def timeout_s(self) -> int:
        return self.timeout or EXEC_DEFAULT_TIMEOUT_S


class ExecCommand(MachineRef):
    argv: list[str]
    stdin: str | None = None
    timeout_s: int = EXEC_DEFAULT_TIMEOUT_S


class ExecReply(Record):
    """Fly's ``MachineExecResponse`` (``exit_code`` an int32), and whether output was cut."""

    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = Field(
        default=False, description=f"stdout or stderr was cut at {EXEC_OUTPUT_MAX_BYTES} bytes"
    )


def bounded(data: bytes, limit: int = EXEC_OUTPUT_MAX_BYTES) -> tuple[str, bool]:
    """Output as text, cut at ``limit`` bytes (with a line saying so); whether it was cut."""
    if len(data) <= limit:
        return data.decode(errors="replace"), False
    return data[:limit].decode(errors="ignore") + _TRUNCATED.format(n=limit), True


def exit_code_of(returncode: int) -> int:
    """A shell's exit code: a process killed by signal ``n`` is ``128 + n``."""
    return returncode if returncode >= 0 else 128 - returncode


class ListenSocket(Record):
    proto: str = Field(description="tcp, tcp6, udp or udp6")
    address: str = Field(description="HOST:PORT it listens on")


class MachineMemory(Record):
    """``GET .../machines/{id}/memory``: a started machine's memory, as its worker reads it."""

    limit_mb: int = Field(description="its limit: the config's `guest.memory_mb`, MiB")
    rss_mb: float = Field(description="resident memory of its processes now, summed, MiB")
    processes: int = Field(description="how many processes it has")


class ProcessStat(Record):
    """Fly's ``ProcessStat``: every number is a JSON integer (Go decodes int32 and uint64)."""

    pid: int
    stime: int = Field(description="when it started, seconds since the epoch")
    rtime: int = Field(description="how long it has run, seconds")
    command: str
    directory: str
    cpu: int = Field(description="CPU time used (user and system), milliseconds")
    rss: int = Field(description="resident memory, bytes")
    listen_sockets: list[ListenSocket] = Field(default_factory=list)


@dataclass(frozen=True)
class ProcessSnapshot:
    """What the worker read of one process (psutil's figures, as they come)."""

    pid: int
    create_time: float  # seconds since the epoch
    cmdline: tuple[str, ...]
    name: str
    cwd: str
    cpu_user_s: float
    cpu_system_s: float
    rss: int
    listening: tuple[tuple[str, str, int], ...] = ()  # (proto, host, port)


def process_stat(p: ProcessSnapshot, now_s: float) -> ProcessStat:
    """One row of ``ps``: whole, non-negative integers, as Fly's client decodes them."""
    sockets = [
        ListenSocket(proto=proto, address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        for proto, host, port in p.listening
    ]
    return ProcessStat(
        pid=p.pid,
        stime=max(0, int(p.create_time)),
        rtime=max(0, int(now_s - p.create_time)),
        command=shlex.join(p.cmdline) if p.cmdline else f"[{p.name}]",
        directory=p.cwd,
        cpu=max(0, round((p.cpu_user_s + p.cpu_system_s) * 1000)),
        rss=max(0, int(p.rss)),
        listen_sockets=sockets,
    )


class MetadataBody(Input):
    """``POST …/metadata/{key}``: Fly's ``{"value": STRING}``."""

    value: str


class MetadataCommand(MachineRef):
    """Set ``key`` to ``value``, or delete it (``value`` None)."""

    key: str = Field(min_length=1, max_length=METADATA_KEY_MAX)
    value: str | None = None


class MachineCordonCommand(MachineRef):
    """Take the machine out of the proxies' rotation (``cordoned``), or put it back."""

    cordoned: bool
