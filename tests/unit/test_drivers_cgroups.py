"""The cgroup backends against a fake cgroup tree (plain directories): which files they write,
which cgroup.procs files a machine joins, the placement shell, and OOM marking."""

from __future__ import annotations

import os
from pathlib import Path

from souq.drivers.base import ExitStatus, Limits
from souq.drivers.cgroups import (
    CgroupEntry,
    Cgroups,
    V1Backend,
    V2Backend,
    placement_shell,
    prune,
)


def test_v2_writes_memory_cpu_and_pids_limits(tmp_path: Path) -> None:
    cg = Cgroups(V2Backend(tmp_path), pids_max=100)
    placement = cg.prepare("m1", Limits(memory_mb=64, cpus=0.5))
    d = tmp_path / "m1"
    assert (d / "memory.max").read_text() == str(64 * 1024 * 1024)
    assert (d / "cpu.max").read_text() == "50000 100000"
    assert (d / "pids.max").read_text() == "100"
    # souq-waiter creates the process in it (clone3); the shell (no waiter) makes it join.
    assert placement == CgroupEntry(clone_into=d)
    assert placement.waiter_fields() == [f"c:{d}"]
    prefix = placement_shell((d / "cgroup.procs",))
    assert prefix[:2] == ("/bin/sh", "-c")
    assert f"echo $$ > {d}/cgroup.procs" in prefix[2]
    assert prefix[2].endswith('exec "$@"')
    assert cg.isolation == {"cgroups": "v2", "enforced": ["memory", "cpu", "pids"]}


def test_v1_writes_one_directory_per_controller(tmp_path: Path) -> None:
    bases = {c: tmp_path / c for c in ("memory", "cpu", "pids")}
    for b in bases.values():
        b.mkdir()
    cg = Cgroups(V1Backend(bases))
    procs = cg.prepare("m1", Limits(memory_mb=32, cpus=2)).join
    assert (bases["memory"] / "m1" / "memory.limit_in_bytes").read_text() == str(32 << 20)
    assert (bases["cpu"] / "m1" / "cpu.cfs_quota_us").read_text() == "200000"
    assert (bases["pids"] / "m1" / "pids.max").read_text() == "4096"
    assert procs == tuple(bases[c] / "m1" / "cgroup.procs" for c in ("memory", "cpu", "pids"))
    assert placement_shell(procs)[2].count("cgroup.procs") == 3
    # A restart reuses the cgroups and sets the cpu period it no longer can assume.
    cg.prepare("m1", Limits(memory_mb=32, cpus=2))
    assert (bases["cpu"] / "m1" / "cpu.cfs_period_us").read_text() == "100000"


def test_an_exit_is_marked_oom_when_the_kernel_counter_rose_since_the_start(
    tmp_path: Path,
) -> None:
    cg = Cgroups(V2Backend(tmp_path))
    cg.prepare("m1", Limits(memory_mb=64))
    events = tmp_path / "m1" / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    killed = ExitStatus(signal="SIGKILL")
    assert cg.annotate("m1", killed) == killed  # the baseline was read before the file existed
    cg.prepare("m1", Limits(memory_mb=64))  # a restart: baseline 0
    events.write_text("oom 1\noom_kill 1\n")
    assert cg.annotate("m1", killed).reason == "oom"
    assert cg.annotate("m1", killed).reason == "oom"  # asking twice gives the same answer
    assert "out of memory" in cg.annotate("m1", killed).describe()


def test_without_a_backend_nothing_is_prefixed_or_enforced() -> None:
    cg = Cgroups(None)
    assert cg.prepare("m1", Limits(memory_mb=64)) == CgroupEntry()
    assert cg.annotate("m1", ExitStatus(code=1)) == ExitStatus(code=1)
    assert cg.isolation == {"cgroups": "none", "enforced": []}
    assert cg.remove("m1")


def test_prune_removes_old_empty_cgroups_only(tmp_path: Path) -> None:
    backend = V2Backend(tmp_path)
    (tmp_path / "old").mkdir()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "cgroup.procs").write_text("1\n")
    assert prune(backend, older_than_s=60) == 0  # both are new
    assert prune(backend, older_than_s=-1) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


def test_v1_a_waiters_spare_cgroup_is_renamed_to_the_machines(tmp_path: Path) -> None:
    bases = {c: tmp_path / c for c in ("memory", "cpu", "pids")}
    for b in bases.values():
        (b / "spare-1").mkdir(parents=True)
    cg = Cgroups(V1Backend(bases))
    placement = cg.prepare("m1", Limits(memory_mb=32, cpus=2), spare="spare-1")
    # The process is born inside; the waiter moves itself out to the waiters' cgroup after.
    waiters = tuple(bases[c] / "waiters" / "cgroup.procs" for c in ("memory", "cpu", "pids"))
    assert placement == CgroupEntry(leave=waiters)
    assert placement.waiter_fields() == [f"l:{p}" for p in waiters]
    assert not any((b / "spare-1").exists() for b in bases.values())
    assert (bases["memory"] / "m1" / "memory.limit_in_bytes").read_text() == str(32 << 20)
    assert (bases["pids"] / "m1" / "pids.max").read_text() == "4096"
    # The cpu quota waits for the spawn: the waiter's own work must not be charged to it.
    assert not (bases["cpu"] / "m1" / "cpu.cfs_quota_us").exists()
    cg.started("m1")
    assert (bases["cpu"] / "m1" / "cpu.cfs_quota_us").read_text() == "200000"


def test_v1_a_restart_whose_old_cgroup_is_busy_joins_it_and_gives_the_spare_up(
    tmp_path: Path,
) -> None:
    bases = {c: tmp_path / c for c in ("memory", "cpu", "pids")}
    for b in bases.values():
        (b / "spare-2").mkdir(parents=True)
    cg = Cgroups(V1Backend(bases))
    cg.prepare("m1", Limits(memory_mb=32))  # the first run's cgroup: files in it, not removable
    placement = cg.prepare("m1", Limits(memory_mb=32), spare="spare-2")
    assert placement.join == tuple(bases[c] / "m1" / "cgroup.procs" for c in bases)
    assert placement.leave == tuple(bases[c] / "waiters" / "cgroup.procs" for c in bases)
    assert all((b / "spare-2").exists() for b in bases.values())  # removed once empty
    cg.prepare("m2", Limits())  # any later start sweeps the given-up spares
    assert not any((b / "spare-2").exists() for b in bases.values())


def test_v2_has_no_use_for_spares(tmp_path: Path) -> None:
    cg = Cgroups(V2Backend(tmp_path))
    assert cg.make_spare(1) is None
    (tmp_path / "spare-3").mkdir()
    placement = cg.prepare("m1", Limits(memory_mb=64), spare="spare-3")
    assert placement.clone_into == tmp_path / "m1"


def test_prune_removes_the_empty_spares_of_agents_that_are_gone_whatever_their_age(
    tmp_path: Path,
) -> None:
    backend = V2Backend(tmp_path)
    gone = tmp_path / "spare-4000000-0"  # above any pid_max: no such agent
    ours = tmp_path / f"spare-{os.getpid()}-0"
    busy = tmp_path / "spare-4000000-1"
    for d in (gone, ours, busy):
        d.mkdir()
    (busy / "cgroup.procs").write_text("1\n")
    assert prune(backend, older_than_s=60) == 1  # new, but its agent is dead
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ours.name, busy.name])


def test_v2_an_agent_started_in_its_leaf_uses_the_cgroup_above(tmp_path: Path) -> None:
    """Under systemd (Delegate=yes, DelegateSubgroup=agent) a restarted agent starts in
    SERVICE/agent: the machines its previous run left are in SERVICE/souq, and it finds them."""
    from souq.drivers.cgroups import _detect_v2, _Mount

    service = tmp_path / "system.slice" / "souq-agent.service"
    (service / "agent").mkdir(parents=True)
    (service / "cgroup.controllers").write_text("cpu memory pids\n")
    (service / "cgroup.subtree_control").write_text("")
    mounts = [_Mount(tmp_path, "cgroup2", frozenset())]
    backend = _detect_v2(mounts, {"": "/system.slice/souq-agent.service/agent"})
    assert backend is not None
    assert backend.base == service / "souq"
    elsewhere = _detect_v2(mounts, {"": "/system.slice/souq-agent.service"})
    assert elsewhere is not None and elsewhere.base == service / "souq"
