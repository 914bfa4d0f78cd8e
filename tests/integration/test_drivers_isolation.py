"""Limits and sandboxes on this host: real cgroups (v2 or v1, whichever the host has) and real
bubblewrap. Assertions read the kernel's counters, never timings."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest

from souq.drivers import enter, sandbox
from souq.drivers.base import Limits, MachineSpec, SpawnError
from souq.drivers.cgroups import WAITERS, Cgroups, V1Backend, V2Backend, detect
from souq.drivers.host import HostDriver
from souq.drivers.waiter import waiter_path
from souq.model import MachineState
from tests.integration.agent_harness import eventually, running_agent

_BACKEND = detect()
needs_cgroups = pytest.mark.skipif(_BACKEND is None, reason="no usable cgroups on this host")
needs_bwrap = pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot run here")


def spec(
    *cmd: str,
    machine_id: str,
    limits: Limits | None = None,
    driver: str = "exec",
    network: bool = True,
) -> MachineSpec:
    return MachineSpec(
        machine_id=machine_id,
        app="demo",
        region="mad",
        worker_id="w1",
        cmd=cmd,
        env={},
        limits=limits or Limits(),
        driver=driver,
        network=network,
    )


def driver(root: Path) -> HostDriver:
    return HostDriver(root, cgroups=Cgroups(_BACKEND), sandbox_enabled=sandbox.available())


@needs_cgroups
def test_a_machine_that_allocates_beyond_its_memory_limit_exits_with_oom(tmp_path: Path) -> None:
    hog = "b = bytearray(256 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1"
    mid = "oom-hog"

    async def body() -> None:
        d = driver(tmp_path)
        assert d.isolation["cgroups"] in ("v1", "v2")
        assert "memory" in d.isolation["enforced"]  # type: ignore[operator]
        handle = d.start(spec(sys.executable, "-c", hog, machine_id=mid, limits=Limits(64)))
        status = await asyncio.wait_for(d.wait(handle), 30)
        assert status.reason == "oom", status
        assert status.signal == "SIGKILL"
        assert "out of memory (oom)" in status.describe()
        ok = d.start(spec("true", machine_id=mid, limits=Limits(64)))  # the same cgroup, reused
        assert (await asyncio.wait_for(d.wait(ok), 30)).reason is None  # counted from its start
        d.destroy(mid)
        await eventually(lambda: not any(p.exists() for p in d.cgroups.backend.dirs(mid)))  # type: ignore[union-attr]
        d.close()

    asyncio.run(body())


@needs_cgroups
def test_a_cpu_limited_busy_loop_is_throttled_by_the_kernel(tmp_path: Path) -> None:
    mid = "busy"

    async def body() -> None:
        d = driver(tmp_path)
        handle = d.start(
            spec("sh", "-c", "while :; do :; done", machine_id=mid, limits=Limits(cpus=0.05))
        )
        stat = await eventually(
            lambda: d.cgroups.cpu_stat(mid).get("nr_throttled", 0) >= 2 and d.cgroups.cpu_stat(mid),
            timeout=10,
            message="the kernel to throttle the machine",
        )
        assert stat["nr_throttled"] >= 2
        await d.stop(handle, signal.SIGKILL, 5)
        d.destroy(mid)
        d.close()

    asyncio.run(body())


@needs_cgroups
def test_the_machine_is_in_its_cgroup_from_its_first_instruction(tmp_path: Path) -> None:
    mid = "where"

    async def body() -> None:
        d = driver(tmp_path)
        handle = d.start(spec("cat", "/proc/self/cgroup", machine_id=mid, limits=Limits(128, 1)))
        await asyncio.wait_for(d.wait(handle), 10)
        out, _ = d.read_output(mid, 0, 1 << 16)
        assert f"/souq/{mid}" in out.decode(), out
        pids_max = d.cgroups.backend.dirs(mid)[-1].parent / mid / "pids.max"  # type: ignore[union-attr]
        if pids_max.exists():
            assert pids_max.read_text().strip() == "4096"
        d.destroy(mid)
        d.close()

    asyncio.run(body())


def _spares_ready(d: HostDriver) -> bool:
    pool = d.exec.waiters.ready()
    return len(pool) >= 2 and all(idle.spare is not None for idle in pool)


def _cgroup_lines(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as {controller: path}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


@pytest.mark.skipif(
    not isinstance(_BACKEND, V1Backend) or waiter_path() is None,
    reason="needs cgroup v1 and souq-waiter",
)
def test_on_v1_a_ready_waiters_spare_cgroup_becomes_the_machines_own(tmp_path: Path) -> None:
    """The waiter sits in a spare cgroup ahead of need; a start renames it to the machine's, so
    the process is born inside (no migration), and the waiter then moves out of it."""
    assert isinstance(_BACKEND, V1Backend)
    bases = _BACKEND.bases

    async def body() -> None:
        d = driver(tmp_path)
        first = d.start(spec("true", machine_id="warm", limits=Limits(64)))  # fills the pool
        await asyncio.wait_for(d.wait(first), 10)
        for run in range(2):  # a first start, then a restart in the cgroup the first one left
            await eventually(lambda: _spares_ready(d), message="ready waiters in spare cgroups")
            spare = d.exec.waiters.ready()[0].spare
            assert spare is not None
            waiter = d.exec.waiters.ready()[0].pid
            for b in bases.values():
                assert str(waiter) in (b / spare / "cgroup.procs").read_text()
            handle = d.start(spec("sleep", "60", machine_id="kept", limits=Limits(64, 1)))
            assert not any((b / spare).exists() for b in bases.values())  # renamed, not copied
            where = _cgroup_lines(Path(f"/proc/{handle.pid}/cgroup").read_text())
            for controller in bases:
                assert where[controller].endswith("/souq/kept"), (run, where)
            assert (bases["pids"] / "kept" / "pids.max").read_text().strip() == "4096"
            assert (bases["memory"] / "kept" / "memory.limit_in_bytes").read_text().strip() == str(
                64 << 20
            )
            # The waiter leaves: the machine's cgroup holds the machine alone.
            alone = [str(handle.pid)]
            await eventually(
                lambda: all(
                    (b / "kept" / "cgroup.procs").read_text().split() == alone  # noqa: B023
                    for b in bases.values()
                ),
                message="the waiter to move out of the machine's cgroup",
            )
            assert str(waiter) in (bases["memory"] / WAITERS / "cgroup.procs").read_text().split()
            assert (await d.stop(handle, signal.SIGTERM, 5)).signal == "SIGTERM"
        d.destroy("kept")
        await eventually(lambda: not any((b / "kept").exists() for b in bases.values()))
        d.close()
        leftovers = [
            p.name
            for b in bases.values()
            for p in b.iterdir()
            if p.name.startswith(f"spare-{os.getpid()}-")
        ]
        assert leftovers == []  # the ready waiters' spares went with them

    asyncio.run(body())


def _v2_scratch() -> Path | None:
    """A scratch cgroup v2 directory under our own, or None when the host has no writable v2."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            own = next(
                (
                    ln[3:]
                    for ln in Path("/proc/self/cgroup").read_text().splitlines()
                    if ln.startswith("0::")
                ),
                None,
            )
            if own is None:
                return None
            d = Path(left.split()[4]) / own.lstrip("/") / f"souq-test-{uuid.uuid4().hex[:8]}"
            try:
                d.mkdir()
            except OSError:
                return None
            return d
    return None


@pytest.mark.skipif(waiter_path() is None, reason="needs souq-waiter")
def test_on_v2_the_waiter_creates_the_process_inside_its_cgroup(tmp_path: Path) -> None:
    """clone3(CLONE_INTO_CGROUP): the process is born in the machine's cgroup. Tried on this
    host's unified hierarchy, with no controllers enforced if it has none."""
    scratch = _v2_scratch()
    if scratch is None:
        pytest.skip("no writable cgroup v2 hierarchy")
    assert scratch is not None

    async def body() -> None:
        d = HostDriver(
            tmp_path, cgroups=Cgroups(V2Backend(scratch, enforced=())), sandbox_enabled=False
        )
        handle = d.start(spec("cat", "/proc/self/cgroup", machine_id="born", limits=Limits(64)))
        assert (await asyncio.wait_for(d.wait(handle), 10)).code == 0
        out, _ = d.read_output("born", 0, 1 << 16)
        assert _cgroup_lines(out.decode())[""].endswith(f"{scratch.name}/born"), out
        d.destroy("born")
        await eventually(lambda: not (scratch / "born").exists())
        d.close()

    try:
        asyncio.run(body())
    finally:
        with contextlib.suppress(OSError):
            scratch.rmdir()


@needs_bwrap
def test_a_sandboxed_machine_is_jailed(tmp_path: Path) -> None:
    script = (
        "echo pid=$$; "
        "touch /usr/souq-escape 2>/dev/null && echo usr=writable || echo usr=readonly; "
        'echo tmp="$(ls -A /tmp | wc -l)"; '
        'echo ifaces="$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " | sort | tr "\\n" ,)"; '
        "echo here > mine && echo workdir=writable"
    )

    async def body() -> None:
        d = driver(tmp_path)
        assert "sandbox" in d.drivers
        handle = d.start(
            spec("sh", "-c", script, machine_id="jail", driver="sandbox", network=False)
        )
        assert (await asyncio.wait_for(d.wait(handle), 10)).code == 0
        out = dict(
            line.split("=", 1) for line in d.read_output("jail", 0, 1 << 16)[0].decode().split()
        )
        assert int(out["pid"]) <= 3  # its own pid namespace: bwrap is 1, the command 2
        assert out["usr"] == "readonly"
        assert out["tmp"] == "0"
        assert out["ifaces"] == "lo,"
        assert out["workdir"] == "writable"
        assert (tmp_path / "jail" / "mine").read_text() == "here\n"
        d.destroy("jail")
        d.close()

    asyncio.run(body())


@needs_bwrap
def test_a_sandboxed_machine_with_network_keeps_the_hosts_interfaces(tmp_path: Path) -> None:
    async def body() -> None:
        d = driver(tmp_path)
        handle = d.start(
            spec("cat", "/proc/net/dev", machine_id="net", driver="sandbox", network=True)
        )
        assert (await asyncio.wait_for(d.wait(handle), 10)).code == 0
        host = Path("/proc/net/dev").read_text().count(":")
        assert d.read_output("net", 0, 1 << 16)[0].decode().count(":") == host
        d.close()

    asyncio.run(body())


def test_without_cgroups_machines_run_unenforced_and_say_so(tmp_path: Path) -> None:
    async def body() -> None:
        d = HostDriver(tmp_path, cgroups="none", sandbox_enabled=False)
        assert {k: d.isolation[k] for k in ("cgroups", "enforced")} == {
            "cgroups": "none",
            "enforced": [],
        }
        assert d.drivers == ["exec"]
        handle = d.start(spec("true", machine_id="plain", limits=Limits(64, 0.5)))
        assert (await asyncio.wait_for(d.wait(handle), 10)).code == 0
        d.close()

    asyncio.run(body())


def test_a_command_that_cannot_be_found_still_fails_to_spawn(tmp_path: Path) -> None:
    async def body() -> None:
        d = driver(tmp_path)
        with pytest.raises(SpawnError, match="cannot run 'no-such-command-souq'"):
            d.start(spec("no-such-command-souq", machine_id="nope", limits=Limits(64)))
        d.close()

    asyncio.run(body())


@needs_cgroups
def test_the_agent_reports_an_oom_exit_and_its_isolation(nats_url: str, tmp_path: Path) -> None:
    hog = "b = bytearray(256 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1"

    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            fp = h.agent.fingerprint
            assert fp.isolation["cgroups"] in ("v1", "v2")
            assert "memory" in fp.isolation["enforced"]
            assert fp.drivers == (["exec", "sandbox"] if sandbox.available() else ["exec"])
            m = await h.claim([sys.executable, "-c", hog], memory_mb=64, restart={"policy": "no"})
            m = await h.wait(m.id, MachineState.STOPPED, timeout_s=30)
            exit_event = next(e for e in m.events if e.type == "exit")
            assert exit_event.signal == "SIGKILL"
            assert exit_event.message is not None
            assert "out of memory (oom)" in exit_event.message

    asyncio.run(body())


@needs_bwrap
def test_the_agent_runs_a_machine_in_the_sandbox_when_asked(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            m = await h.claim(
                ["sh", "-c", "echo pid=$$ host=$(hostname)"],
                driver="sandbox",
                sandbox={"network": False},
            )
            assert m.config.driver == "sandbox"
            out = await h.output(m.id, "host=")
            assert "host=sandbox" in out
            assert int(out.split("pid=")[1].split()[0]) <= 3

    asyncio.run(body())


def _state(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("State:"):
            return line.split()[1]
    return ""


@needs_bwrap
def test_without_a_freezer_a_sandboxed_machines_command_is_stopped_and_continued(
    tmp_path: Path,
) -> None:
    """SIGSTOP and SIGCONT reach the command, which is in a session of its own in the sandbox
    (bwrap's group alone would leave it running)."""
    mid = "frozen"

    async def body() -> None:
        d = HostDriver(tmp_path, cgroups="none", sandbox_enabled=True)
        handle = d.start(
            spec("sh", "-c", "echo up; exec sleep 600", machine_id=mid, driver="sandbox")
        )
        await eventually(lambda: b"up" in d.read_output(mid, 0, 1 << 16)[0], timeout=10)
        command = await eventually(lambda: enter.machine_command(handle.pid), timeout=10)
        assert command is not None
        assert d.freeze(handle, True)
        await eventually(lambda: _state(command) == "T", timeout=10, message="the command stopped")
        assert d.freeze(handle, False)
        await eventually(lambda: _state(command) != "T", timeout=10, message="it continued")
        status = await d.stop(handle, signal.SIGTERM, 10)
        assert status.signal == "SIGTERM" or status.code == 128 + signal.SIGTERM, status
        d.destroy(mid)
        d.close()

    asyncio.run(body())


@needs_bwrap
def test_a_sandboxed_machines_stop_signal_reaches_its_command(tmp_path: Path) -> None:
    """The signal goes to the command's own group in the sandbox: sent to bwrap's, the outer
    bwrap died of it and what was left was killed before the command's handler could run."""
    mid = "trapping"
    script = "trap 'echo got-term; exit 7' TERM; echo armed; while :; do sleep 1; done"

    async def body() -> None:
        d = HostDriver(tmp_path, cgroups="none", sandbox_enabled=True)
        handle = d.start(spec("sh", "-c", script, machine_id=mid, driver="sandbox"))
        await eventually(lambda: b"armed" in d.read_output(mid, 0, 1 << 16)[0], timeout=10)
        await eventually(lambda: enter.machine_command(handle.pid), timeout=10)
        status = await d.stop(handle, signal.SIGTERM, 30)
        assert status.code == 7, status  # its own exit, through bwrap's
        assert b"got-term" in d.read_output(mid, 0, 1 << 16)[0]
        d.destroy(mid)
        d.close()

    asyncio.run(body())
