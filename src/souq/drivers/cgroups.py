"""Resource limits through cgroups: a v2 and a v1 backend, picked by detection.

Each machine gets one cgroup, ``<agent's cgroup>/souq/<machine id>`` (one per controller on
v1), created on its first start and removed on destroy. Limits come from the machine's guest:
memory (``memory.max`` / ``memory.limit_in_bytes``, swap included where the host allows it),
cpu (``cpu.max`` / ``cpu.cfs_quota_us`` over a 100 ms period) and pids (``pids.max``).

**Entry.** The machine's process must be in its cgroup before it runs user code, and Python
cannot ``clone3(CLONE_INTO_CGROUP)`` (a ``preexec_fn`` would make ``Popen`` fork instead of vfork
and is not thread-safe), so souq-waiter places it; :meth:`Cgroups.prepare` says how, as a
:class:`CgroupEntry`. Moving a process between cgroups (a write to ``cgroup.procs``) can wait out
an RCU grace period, several milliseconds here, so the way in avoids one where it can:

* v2: the waiter creates the process *in* its cgroup with ``clone3(CLONE_INTO_CGROUP)``.
* v1 has no such call, but allows renaming a cgroup. Each ready waiter is moved, off the
  event loop and ahead of need, into a spare cgroup of its own (``souq/spare-…``);
  :meth:`Cgroups.prepare` renames that spare to the machine's name and writes its limits, and
  the waiter's child is born inside. The waiter then moves itself out to ``souq/waiters``, off
  the command's way; until it has (a few milliseconds), it counts against the machine's
  ``pids.max``.
* Otherwise (no spare at hand, a restart's cgroup still busy with dying leftovers) the child
  writes itself into the cgroup's ``cgroup.procs`` files between its fork and its exec.

Without the waiter the command runs behind a tiny shell prefix instead (:func:`placement_shell`:
``sh -c 'echo $$ > <cgroup>/cgroup.procs && exec "$@"' souq <cmd...>``), which costs one more
exec. Either way, if the join fails the machine does not run unconfined: it exits with status
127 (waiter) or 2 (shell), the reason in its output. A new cgroup needs no cleanup and no OOM
baseline read: only a cgroup reused by a restart is emptied of leftovers first.

**Out of memory.** The kernel's ``oom_kill`` counter (``memory.events`` on v2,
``memory.oom_control`` on v1) is read when the machine starts and when it exits; a rise means
the OOM killer ended it, and the exit is reported with ``reason="oom"``.

**Detection** (``mode="auto"``): v2 when the unified hierarchy has the memory, cpu and pids
controllers and they can be delegated to our subtree; else v1 when the memory, cpu and pids
hierarchies are mounted and writable; else none: machines run unenforced, the worker's
fingerprint says ``{"cgroups": "none", "enforced": []}`` and a warning is logged.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import shlex
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from souq.drivers.base import OOM, ExitStatus, Limits
from souq.procs import pid_alive

__all__ = [
    "CPU_PERIOD_US",
    "DEFAULT_PIDS_MAX",
    "CgroupEntry",
    "Cgroups",
    "V1Backend",
    "V2Backend",
    "detect",
    "prune",
]

log = logging.getLogger(__name__)

CPU_PERIOD_US = 100_000
AGENT_LEAF = "agent"  # the agent's leaf when its cgroup holds the machines' (v2)
DEFAULT_PIDS_MAX = 4096
CONTROLLERS = ("memory", "cpu", "pids")
V1_FREEZER = "freezer"  # v1: its own hierarchy, used when mounted (v2 has cgroup.freeze)
Mode = Literal["auto", "v2", "v1", "none"]
WAITERS = "waiters"  # v1: where a waiter placed ahead of need moves once its child is born
SPARE_PREFIX = "spare-"
_spare_numbers = itertools.count()  # spare names are unique per process (agents share bases)


@dataclass(frozen=True)
class CgroupEntry:
    """How a machine's new process gets into its cgroup (see the module's docstring)."""

    join: tuple[Path, ...] = ()  # cgroup.procs files the process writes itself into
    clone_into: Path | None = None  # v2: the cgroup directory to create the process in
    leave: tuple[Path, ...] = ()  # v1 spare: where the waiter moves itself once its child is born
    # Not a cgroup: the network namespace the process joins before its exec (souq.network).
    netns: Path | None = None

    def waiter_fields(self) -> list[str]:
        """The job's CGROUP entries for souq-waiter (see waiter.c)."""
        net = [f"n:{self.netns}"] if self.netns is not None else []
        if self.clone_into is not None:  # the waiter joins <dir>/cgroup.procs if it cannot clone
            return [f"c:{self.clone_into}", *net]
        return [f"j:{p}" for p in self.join] + [f"l:{p}" for p in self.leave] + net


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _mkdir(path: Path) -> bool:
    """Create a directory; True when it is new, False when it was there."""
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    return True


def _read_kv(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file (``key value`` per line) as a dict; empty when unreadable."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[key] = int(value)
    return out


def _pids_in(path: Path) -> list[int]:
    try:
        return [int(p) for p in path.read_text().split()]
    except (OSError, ValueError):
        return []


@dataclass
class V2Backend:
    """The unified hierarchy: one directory per machine under ``base`` (whose subtree has the
    controllers enabled)."""

    base: Path
    enforced: tuple[str, ...] = CONTROLLERS
    version: str = "v2"
    _swap: bool | None = field(default=None, init=False, repr=False)  # memory.swap.max exists

    def dirs(self, name: str) -> list[Path]:
        return [self.base / name]

    def create(self, name: str, limits: Limits) -> bool:
        """Make (or reuse) the cgroup and write its limits; True when it is new."""
        new = _mkdir(self.base / name)
        self.limit(name, limits, new=new)
        return new

    def limit(self, name: str, limits: Limits, *, new: bool) -> None:
        d = self.base / name
        if limits.memory_mb is not None and "memory" in self.enforced:
            _write(d / "memory.max", str(limits.memory_mb * 1024 * 1024))
            if self._swap is None:
                self._swap = (d / "memory.swap.max").exists()
            if self._swap:
                _write(d / "memory.swap.max", "0")
        if limits.cpus is not None and "cpu" in self.enforced:
            _write(d / "cpu.max", f"{_quota_us(limits.cpus)} {CPU_PERIOD_US}")
        if limits.pids is not None and "pids" in self.enforced:
            _write(d / "pids.max", str(limits.pids))

    def pids(self, name: str) -> list[int]:
        return _pids_in(self.base / name / "cgroup.procs")

    def oom_kills(self, name: str) -> int:
        return _read_kv(self.base / name / "memory.events").get("oom_kill", 0)

    def freeze(self, name: str, frozen: bool) -> bool:
        """Freeze (or thaw) every process of the cgroup; False when the kernel cannot."""
        path = self.base / name / "cgroup.freeze"
        if not path.exists():
            return False
        _write(path, "1" if frozen else "0")
        return True

    def cpu_stat(self, name: str) -> dict[str, int]:
        return _read_kv(self.base / name / "cpu.stat")


@dataclass
class V1Backend:
    """Legacy hierarchies: one directory per machine under each controller's ``bases`` entry."""

    bases: dict[str, Path]
    version: str = "v1"
    enforced: tuple[str, ...] = field(init=False)
    _memsw: bool | None = field(default=None, init=False, repr=False)  # swap accounting

    def __post_init__(self) -> None:
        self.enforced = tuple(c for c in CONTROLLERS if c in self.bases)

    def dirs(self, name: str) -> list[Path]:
        return [base / name for base in self.bases.values()]

    def create(self, name: str, limits: Limits) -> bool:
        """Make (or reuse) the cgroups and write their limits; True when they are new."""
        made = [_mkdir(d) for d in self.dirs(name)]  # every one, even after one existed
        new = all(made)
        self.limit(name, limits, new=new)
        return new

    def limit(self, name: str, limits: Limits, *, new: bool) -> None:
        if limits.memory_mb is not None and "memory" in self.bases:
            d = self.bases["memory"] / name
            limit = str(limits.memory_mb * 1024 * 1024)
            _write(d / "memory.limit_in_bytes", limit)
            if self._memsw is not False:
                try:
                    _write(d / "memory.memsw.limit_in_bytes", limit)
                    self._memsw = True
                except OSError:
                    if self._memsw is None and not (d / "memory.memsw.limit_in_bytes").exists():
                        self._memsw = False  # no swap accounting: memory alone is limited
        if limits.cpus is not None and "cpu" in self.bases:
            d = self.bases["cpu"] / name
            if not new:  # a new cgroup has the kernel's default period, which is ours
                _write(d / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(d / "cpu.cfs_quota_us", str(_quota_us(limits.cpus)))
        if limits.pids is not None and "pids" in self.bases:
            _write(self.bases["pids"] / name / "pids.max", str(limits.pids))

    def rename(self, old: str, new: str) -> None:
        """Rename the cgroups (v1 allows it within one parent), every one or none."""
        done: list[Path] = []
        try:
            for base in self.bases.values():
                (base / old).rename(base / new)
                done.append(base)
        except OSError:
            for base in done:
                with contextlib.suppress(OSError):
                    (base / new).rename(base / old)
            raise

    def pids(self, name: str) -> list[int]:
        found: set[int] = set()
        for d in self.dirs(name):
            found.update(_pids_in(d / "cgroup.procs"))
        return sorted(found)

    def freeze(self, name: str, frozen: bool) -> bool:
        """Freeze (or thaw) every process of the cgroup; False without the freezer."""
        if V1_FREEZER not in self.bases:
            return False
        _write(self.bases[V1_FREEZER] / name / "freezer.state", "FROZEN" if frozen else "THAWED")
        return True

    def oom_kills(self, name: str) -> int:
        if "memory" not in self.bases:
            return 0
        return _read_kv(self.bases["memory"] / name / "memory.oom_control").get("oom_kill", 0)

    def cpu_stat(self, name: str) -> dict[str, int]:
        if "cpu" not in self.bases:
            return {}
        return _read_kv(self.bases["cpu"] / name / "cpu.stat")


Backend = V2Backend | V1Backend


def _quota_us(cpus: float) -> int:
    return max(1000, round(cpus * CPU_PERIOD_US))


class Cgroups:
    """One cgroup per machine on the detected backend (or none: every call is a no-op)."""

    def __init__(self, backend: Backend | None, *, pids_max: int | None = DEFAULT_PIDS_MAX) -> None:
        self.backend = backend
        self.pids_max = pids_max
        self._oom_at_start: dict[str, int] = {}
        self._stale: list[str] = []  # spare cgroups to remove once empty
        self._cpu_later: dict[str, float] = {}  # cpus to write as a quota once spawned

    @property
    def isolation(self) -> dict[str, object]:
        """For the worker's fingerprint: ``{"cgroups": "v2"|"v1"|"none", "enforced": [...]}``."""
        if self.backend is None:
            return {"cgroups": "none", "enforced": []}
        return {"cgroups": self.backend.version, "enforced": list(self.backend.enforced)}

    def prepare(self, machine_id: str, limits: Limits, spare: str | None = None) -> CgroupEntry:
        """Set the machine's cgroup up with ``limits`` and say how its process gets in.
        ``spare``: the spare cgroup its waiter sits in (:meth:`make_spare`), used as the
        machine's own when it can be (v1). A cgroup a previous run left is emptied of
        leftovers first. Raises OSError when the cgroup cannot be set up."""
        b = self.backend
        if b is None:
            return CgroupEntry()
        if limits.pids is None and self.pids_max is not None:
            limits = Limits(memory_mb=limits.memory_mb, cpus=limits.cpus, pids=self.pids_max)
        self._sweep()
        self._cpu_later.pop(machine_id, None)
        if spare is not None:
            if self._adopt(spare, machine_id, limits):
                self._oom_at_start[machine_id] = 0
                return CgroupEntry(leave=self.procs_of(WAITERS))
            self._stale.append(spare)  # removed once its waiter has moved out
        if b.create(machine_id, limits):  # a new cgroup: empty, and no OOM kill counted yet
            self._oom_at_start[machine_id] = 0
        else:
            _kill(b.pids(machine_id))
            self._oom_at_start[machine_id] = b.oom_kills(machine_id)
        if isinstance(b, V2Backend):  # no spares on v2: nothing to leave
            return CgroupEntry(clone_into=b.base / machine_id)
        leave = self.procs_of(WAITERS) if spare is not None else ()
        return CgroupEntry(join=self.procs_of(machine_id), leave=leave)

    def procs_of(self, name: str) -> tuple[Path, ...]:
        assert self.backend is not None
        return tuple(d / "cgroup.procs" for d in self.backend.dirs(name))

    def _adopt(self, spare: str, machine_id: str, limits: Limits) -> bool:
        """Make the spare cgroup the machine's (v1); False when it cannot be: a cgroup a
        previous run left is still busy, or the limits leave no room for the waiter's child."""
        b = self.backend
        if not isinstance(b, V1Backend) or (limits.pids is not None and limits.pids < 2):
            return False
        try:
            b.rename(spare, machine_id)
        except OSError:  # a restart: the last run's cgroup is there; remove it if it is idle
            if not self.remove(machine_id):  # still busy
                return False
            try:
                b.rename(spare, machine_id)
            except OSError:
                return False
        # The waiter's fork and report would be charged to a small cpu quota (0.01 cpu is 1 ms
        # per 100 ms period) and stall the start by up to a period: the quota comes right
        # after the spawn (:meth:`started`).
        b.limit(machine_id, replace(limits, cpus=None), new=True)
        if limits.cpus is not None:
            self._cpu_later[machine_id] = limits.cpus
        return True

    def started(self, machine_id: str) -> None:
        """The machine's process was spawned: write a cpu quota :meth:`prepare` held back."""
        cpus = self._cpu_later.pop(machine_id, None)
        if cpus is not None and self.backend is not None:
            self.backend.limit(machine_id, Limits(cpus=cpus), new=True)

    def make_spare(self, pid: int) -> str | None:
        """Move the waiter ``pid`` into a new spare cgroup of its own and return its name; None
        when spares are of no use (v2, none) or it could not be done. Blocks for the move's
        grace period: call it off the event loop."""
        b = self.backend
        if not isinstance(b, V1Backend):
            return None
        name = f"{SPARE_PREFIX}{os.getpid()}-{next(_spare_numbers)}"
        try:
            for d in b.dirs(WAITERS):
                d.mkdir(exist_ok=True)
            for d in b.dirs(name):
                d.mkdir()
                _write(d / "cgroup.procs", str(pid))
        except OSError as exc:
            log.warning("cannot place a souq-waiter in a spare cgroup: %s", exc)
            for d in b.dirs(name):  # what is left is pruned later
                with contextlib.suppress(OSError):
                    d.rmdir()
            return None
        return name

    def drop_spare(self, name: str) -> None:
        """Remove a spare cgroup whose waiter has exited (later, if it is still busy)."""
        self._stale.append(name)
        self._sweep()

    def _sweep(self) -> None:
        """Remove the spare cgroups given up since their waiters moved out (or exited)."""
        if not self._stale or self.backend is None:
            return
        left: list[str] = []
        for name in self._stale:
            for d in self.backend.dirs(name):
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(name)
                    break
        self._stale = left

    def annotate(self, machine_id: str, status: ExitStatus) -> ExitStatus:
        """``status`` with ``reason="oom"`` when the OOM killer struck since the start."""
        b = self.backend
        if b is None or machine_id not in self._oom_at_start:
            return status
        if b.oom_kills(machine_id) > self._oom_at_start[machine_id]:
            return ExitStatus(code=status.code, signal=status.signal, reason=OOM)
        return status

    def cpu_stat(self, machine_id: str) -> dict[str, int]:
        return {} if self.backend is None else self.backend.cpu_stat(machine_id)

    def freeze(self, machine_id: str, frozen: bool) -> bool:
        """Freeze or thaw the machine's processes with the cgroup freezer; False when the host
        has none for it (the driver stops them with SIGSTOP instead)."""
        if self.backend is None:
            return False
        try:
            return self.backend.freeze(machine_id, frozen)
        except OSError as exc:
            log.info("cannot %s cgroup %s: %s", "freeze" if frozen else "thaw", machine_id, exc)
            return False

    def remove(self, machine_id: str) -> bool:
        """Kill what is left in the machine's cgroup and remove it. False when a directory is
        still busy (its processes have not finished dying): call again later."""
        self._oom_at_start.pop(machine_id, None)
        b = self.backend
        if b is None:
            return True
        self.freeze(machine_id, False)  # a frozen process dies only once thawed
        _kill(b.pids(machine_id))
        done = True
        for d in b.dirs(machine_id):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    log.warning("cannot remove cgroup %s: %s", d, exc)
                done = False
        return done


def prune(backend: Backend | None, *, older_than_s: float = 60.0) -> int:
    """Remove cgroups that hold no process and that nobody will fill:

    * machine cgroups made more than ``older_than_s`` ago: those of machines whose agent and
      data are gone (a machine that runs again gets a new one). The age spares a cgroup that
      another agent is about to fill. On cgroupfs a directory's mtime is when the kernel set up
      its inode, which can be later than its making but never earlier: an old cgroup may wait
      for a later prune, a new one is never taken.
    * spare cgroups whose agent, named in ``spare-<pid>-<n>``, is no longer running: a spare is
      only ever filled by the agent that made it, so an empty one of a dead agent goes at once.

    Returns how many."""
    if backend is None:
        return 0
    bases = [backend.base] if isinstance(backend, V2Backend) else list(backend.bases.values())
    now, removed = time.time(), 0
    for base in bases:
        with contextlib.suppress(OSError):
            for d in base.iterdir():
                with contextlib.suppress(OSError):
                    if not d.is_dir() or d.name == WAITERS or _pids_in(d / "cgroup.procs"):
                        continue
                    if d.name.startswith(SPARE_PREFIX):
                        gone = not _agent_alive(d.name)
                    else:
                        gone = now - d.stat().st_mtime > older_than_s
                    if gone:
                        d.rmdir()
                        removed += 1
    return removed


def _agent_alive(spare: str) -> bool:
    """Whether the agent that made the spare cgroup ``spare-<pid>-<n>`` still runs (when the
    name cannot be read, assume it does)."""
    try:
        pid = int(spare[len(SPARE_PREFIX) :].split("-", 1)[0])
    except ValueError:
        return True
    return pid == os.getpid() or pid_alive(pid)


def placement_shell(cgroup_procs: Iterable[Path]) -> tuple[str, ...]:
    """The argv prefix that puts a command in its cgroup when no souq-waiter does: a shell
    writes its own pid to each ``cgroup.procs`` file, then ``exec``s the command."""
    writes = " && ".join(f"echo $$ > {shlex.quote(str(p))}" for p in cgroup_procs)
    return ("/bin/sh", "-c", f'{writes} && exec "$@"', "souq")


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# -- detection ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    path: Path
    fstype: str
    options: frozenset[str]


def _mounts() -> list[_Mount]:
    out: list[_Mount] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 5 and len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
                opts = frozenset(rfields[2].split(","))
                out.append(_Mount(Path(fields[4]), rfields[0], opts))
    return out


def _own_paths() -> dict[str, str]:
    """Our cgroup per controller from /proc/self/cgroup; the v2 path under the key ``""``."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


def _under(mount: Path, own: str) -> Path:
    return mount / own.lstrip("/")


def _detect_v2(mounts: list[_Mount], own: dict[str, str]) -> V2Backend | None:
    mount = next((m.path for m in mounts if m.fstype == "cgroup2"), None)
    if mount is None or "" not in own:
        return None
    parent, _, leaf = own[""].rstrip("/").rpartition("/")  # in its leaf: DelegateSubgroup=agent
    here = _under(mount, (parent or "/") if leaf == AGENT_LEAF else own[""])
    try:
        available = set((here / "cgroup.controllers").read_text().split())
    except OSError:
        return None
    wanted = [c for c in CONTROLLERS if c in available]
    if "memory" not in wanted or "cpu" not in wanted:
        return None
    enable = " ".join(f"+{c}" for c in wanted)
    try:
        try:
            _write(here / "cgroup.subtree_control", enable)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            # "No internal processes": move the agent into a leaf of its own cgroup first.
            (here / AGENT_LEAF).mkdir(exist_ok=True)
            _write(here / AGENT_LEAF / "cgroup.procs", str(os.getpid()))
            _write(here / "cgroup.subtree_control", enable)
        base = here / "souq"
        base.mkdir(exist_ok=True)
        _write(base / "cgroup.subtree_control", enable)
    except OSError as exc:
        log.info("cgroup v2 at %s is not usable: %s", here, exc)
        return None
    return V2Backend(base, enforced=tuple(wanted))


def _detect_v1(mounts: list[_Mount], own: dict[str, str]) -> V1Backend | None:
    bases: dict[str, Path] = {}
    for c in (*CONTROLLERS, V1_FREEZER):
        mount = next((m.path for m in mounts if m.fstype == "cgroup" and c in m.options), None)
        if mount is None:
            continue
        base = _under(mount, own.get(c, "/")) / "souq"
        try:
            base.mkdir(exist_ok=True)
        except OSError as exc:
            log.info("cgroup v1 %s at %s is not usable: %s", c, base, exc)
            continue
        if os.access(base, os.W_OK):
            bases[c] = base
    if "memory" not in bases or "cpu" not in bases:
        return None
    return V1Backend(bases)


def detect(mode: Mode = "auto") -> Backend | None:
    """The cgroup backend to use (None: no enforcement; a warning is logged)."""
    if mode == "none":
        return None
    mounts, own = _mounts(), _own_paths()
    backend: Backend | None = None
    if mode in ("auto", "v2"):
        backend = _detect_v2(mounts, own)
    if backend is None and mode in ("auto", "v1"):
        backend = _detect_v1(mounts, own)
    if backend is None:
        log.warning(
            "no usable cgroups (%s): machines run without resource limits; run the agent as "
            "root, or in a delegated cgroup v2 subtree with the memory, cpu and pids controllers",
            mode,
        )
    return backend
