"""Sandboxes made ahead of their machines (souq.drivers.warm): after a machine of an image
starts, the next one's sandbox is made before its claim comes, and the machine that takes it
is isolated exactly as one started cold: a uid, a writable layer and a cgroup of its own, its
own environment, nothing of the stub left, and nothing of a slot left once it is given up.
Real bubblewrap, real mounts, real cgroups, a root agent's driver."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from souq.drivers import enter, rootfs, sandbox
from souq.drivers.base import Handle, Limits, MachineSpec
from souq.drivers.host import HostDriver
from souq.drivers.identity import MachineIds
from souq.drivers.warm import SLOT_PREFIX
from souq.images import layout_tar, pack_directory
from souq.model.machine import MachineState
from souq.testing import Cluster, wait_until
from tests import isolated
from tests.integration.agent_harness import eventually
from tests.isolated import busybox_tree, machines_root

BUSYBOX = shutil.which("busybox")
APPLETS = ("sh", "cat", "echo", "ls", "id", "sleep", "touch", "test")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="machines of their own uid need a root agent"),
    pytest.mark.skipif(not sandbox.available(), reason=f"{sandbox.unavailable()}"),
    pytest.mark.skipif(BUSYBOX is None, reason="busybox-static is missing (`make test` has it)"),
]


@pytest.fixture
def root() -> Iterator[Path]:
    with machines_root("souq-warm-") as path:
        yield path


def image(root: Path) -> Path:
    """A whole root file system of busybox alone."""
    return busybox_tree(root / "image", APPLETS)


def driver(root: Path) -> HostDriver:
    d = HostDriver(root / "data", ids=MachineIds(registry=root / "uids"))
    assert d.warm.enabled, "this host makes sandboxes ahead (cgroup v1 or none, a static waiter)"
    return d


def machine(mid: str, files: Path, script: str) -> MachineSpec:
    return MachineSpec(
        mid, "demo", "mad", "w1", ("sh", "-c", script), {"GREETING": f"hello {mid}"},
        driver="sandbox", image_root=str(files), limits=Limits(memory_mb=64, cpus=1),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def started(d: HostDriver, spec: MachineSpec) -> AsyncIterator[Handle]:
    """The machine started, and stopped and destroyed whatever the test does."""
    handle = d.start(spec)
    try:
        yield handle
    finally:
        await d.stop(handle, signal.SIGKILL, 5)
        d.destroy(spec.machine_id)


def slots(root: Path) -> list[str]:
    """The slots' names under the data directory: their roots and records."""
    names = set()
    for parent in (root / "data" / ".rootfs", root / "data" / ".agent"):
        if parent.is_dir():
            names |= {p.name for p in parent.iterdir() if p.name.startswith(SLOT_PREFIX)}
    return sorted(names)


async def output(d: HostDriver, mid: str, text: str) -> str:
    last = [""]

    async def seen() -> str | None:
        last[0] = d.read_output(mid, 0, 1 << 16)[0].decode()
        return last[0] if text in last[0] else None

    try:
        return await eventually(seen, timeout=60, message=f"{text!r} in {mid}'s output")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; it printed: {last[0]!r}") from exc


SCRIPT = (
    'echo "uid=$(id -u) env=$GREETING id=$SOUQ_MACHINE_ID"; cat /proc/self/cgroup; '
    "echo fds=$(ls /proc/self/fd | tr '\\n' ' '); "
    'test -e /mine && echo "saw-another"; touch /mine; echo written; exec sleep 600'
)


def ids_of(*names: str) -> list[str]:
    """Machine ids of this run (cgroups are the host's: no two runs share one)."""
    run = uuid.uuid4().hex[:8]
    return [f"{name}-{run}" for name in names]


def test_the_next_machine_of_an_image_takes_a_sandbox_made_for_it(root: Path) -> None:
    files = image(root)
    one, two = ids_of("first", "second")

    async def body() -> None:
        d = driver(root)
        async with started(d, machine(one, files, SCRIPT)):
            assert d.warm.taken == 0  # the image's first machine starts cold
            await output(d, one, "written")
            await eventually(lambda: len(d.warm.pids) == 1, timeout=20, message="a slot made")
            made = slots(root)
            assert len(made) == 1
            async with started(d, machine(two, files, SCRIPT)) as second:
                assert d.warm.taken == 1
                out = await output(d, two, "written")
                # Its own environment, root inside, nothing of the stub's pipes (0-2, ls's own)
                assert f"uid=0 env=hello {two} id={two}" in out, out
                assert "fds=0 1 2 3\n" in out, out
                assert "saw-another" not in out  # its own writable layer
                assert f"/souq/{two}" in out, out  # its cgroup, the slot's spare renamed
                assert d.ids is not None
                uids = {mid: d.ids.recorded(d.exec.records_dir(mid)) for mid in (one, two)}
                assert None not in uids.values()
                assert uids[one] != uids[two]
                command = await eventually(lambda: enter.machine_command(second.pid), timeout=10)
                assert os.stat(f"/proc/{command}").st_uid == uids[two]  # its uid outside
                init = int(Path(f"/proc/{command}/stat").read_text().split(") ", 1)[1].split()[1])
                held = {os.readlink(f"/proc/{init}/fd/{n}") for n in os.listdir(f"/proc/{init}/fd")}
                assert not any("souq-waiter" in target for target in held), held  # the stub's
                assert made[0] not in slots(root)  # the slot became the machine's
                assert (d.rootfs_of(two) / "root" / "mine").exists()
                # The next slot is made, for the machine after it.
                await eventually(lambda: len(d.warm.pids) == 1, timeout=20, message="next slot")
        assert not any((root / "uids" / str(uid)).exists() for uid in uids.values())
        assert not d.rootfs_of(two).exists()
        d.close()
        assert slots(root) == []  # closing gives the slot up: its root, records and uid
        assert rootfs.unmount_under(root / "data") == []
        assert os.listdir(root / "uids") == []

    asyncio.run(body())


def test_a_slot_left_by_an_agent_that_went_away_is_swept_by_the_next(root: Path) -> None:
    files = image(root)
    (one,) = ids_of("first")

    async def body() -> None:
        d = driver(root)
        async with started(d, machine(one, files, "exec sleep 600")):
            await eventually(lambda: len(d.warm.pids) == 1, timeout=20, message="a slot made")
            (slot,) = d.warm.ready()
            assert slot.waiter.warm is not None
            os.close(slot.waiter.warm)  # as the agent's end closes when it is killed
            await eventually(lambda: _gone(slot.pid), timeout=10, message="the sandbox ended")
            assert slots(root), "what the slot left is there until an agent sweeps it"
            d.warm.forget()  # as an agent that was killed does
        d.exec.close()
        later = driver(root)  # the next agent on the directory
        assert slots(root) == []
        assert rootfs.unmount_under(root / "data") == []
        assert os.listdir(root / "uids") == []
        later.close()

    asyncio.run(body())


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] in "ZX"
    except OSError:
        return True


def test_a_machine_that_does_not_fit_the_slot_starts_cold(root: Path) -> None:
    files = image(root)
    volume = root / "volume"
    volume.mkdir()
    one, other = ids_of("first", "with-volume")

    async def body() -> None:
        d = driver(root)
        async with started(d, machine(one, files, "exec sleep 600")):
            await eventually(lambda: len(d.warm.pids) == 1, timeout=20, message="a slot made")
            spec = replace(
                machine(other, files, "echo in; exec sleep 600"), mounts=((str(volume), "/data"),)
            )
            async with started(d, spec):
                assert d.warm.taken == 0  # its volume is not in the slot's sandbox
                await output(d, other, "in")
                assert len(d.warm.pids) == 1  # the slot waits for a machine it fits
        d.close()
        assert slots(root) == []

    asyncio.run(body())


def _stub_roots() -> list[str]:
    """The roots of the stubs waiting in sandboxes made ahead: what their bwrap binds as /."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes() == STUB:
                parent = Path(f"/proc/{entry}/stat").read_text().split(") ", 1)[1].split()[1]
                argv = Path(f"/proc/{parent}/cmdline").read_bytes().decode().split("\0")
                found.append(argv[argv.index("--bind") + 1])
        except (OSError, ValueError, IndexError):
            continue
    return found


STUB = b"/proc/self/fd/4\0stub\0"


def _bwrap_command(pid: int) -> list[str]:
    """What follows ``--`` on the command line of the machine's bwrap (its handle's pid)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    return argv[argv.index("--") + 1 :]


def test_a_killed_agent_readopts_a_machine_that_started_warm_and_sweeps_its_slot() -> None:
    with machines_root("souq-warm-agent-") as root, Cluster(root, regions={}) as cluster:
        agent = cluster.add_agent(
            "mad", machine_user=None, default_driver=None, stop_machines_on_exit=False,
            extra_args=["--private-network", "off"],
        )  # fmt: skip
        cluster.wait_for_workers()
        files = image(root / "files")
        with cluster.client() as client:
            ref = client.push_image(layout_tar(pack_directory(files, cmd=["sh"]))).reference
        data = root / "workers" / "mad-1" / "machines"
        config = {
            "image": ref,
            "guest": {"memory_mb": 64},
            "cmd": ["sh", "-c", "echo up; exec sleep 600"],
        }

        def warm_names() -> list[str]:
            """The slots whose sandbox is made: its stub waits in the slot's root."""
            return sorted({root.split("/")[-2] for root in _stub_roots() if str(data) in root})

        first = isolated.started(cluster, config)
        wait_until(warm_names, timeout=30, message="a slot made after the image's first machine")
        (slot,) = warm_names()
        second = isolated.started(cluster, config)
        try:
            pid = int((data / ".agent" / second.id / "pid").read_text().split()[0])
            assert _bwrap_command(pid) == ["/proc/self/fd/4", "stub"]  # it took the slot
            assert slot not in warm_names()
            before = sorted(isolated.processes_of(second.id))
            wait_until(warm_names, timeout=30, message="the next slot")
            (left,) = warm_names()
            agent.stop(signal.SIGKILL)
            agent.start()
            with cluster.client() as client:
                client.wait(isolated.APP, second.id, MachineState.STARTED, timeout=30)
            assert sorted(isolated.processes_of(second.id)) == before  # adopted, not restarted
            assert left not in warm_names()  # the slot the killed agent left is swept
            assert isolated.output(cluster, second, "up")
            with cluster.client() as client:  # an exec enters it as it enters a cold one
                reply = client.exec(
                    isolated.APP, second.id, ["sh", "-c", "hostname; id -u; cat /proc/1/comm"],
                    stdin=None, timeout_s=30,
                )  # fmt: skip
            assert (reply.exit_code, reply.stdout) == (0, "sandbox\n0\nbwrap\n")
        finally:
            isolated.destroy(cluster, first, second)


def test_a_driver_told_to_make_no_slot_starts_every_machine_cold(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOUQ_WARM_SANDBOXES", "off")
    files = image(root)
    one, two = ids_of("first", "second")

    async def body() -> None:
        d = HostDriver(root / "data", ids=MachineIds(registry=root / "uids"))
        assert not d.warm.enabled
        async with started(d, machine(one, files, "echo one; exec sleep 600")):
            await output(d, one, "one")
            async with started(d, machine(two, files, "echo two; exec sleep 600")) as second:
                await output(d, two, "two")
                assert d.warm.taken == 0
                assert _bwrap_command(second.pid)[-3:] == [
                    "/bin/sh",
                    "-c",
                    "echo two; exec sleep 600",
                ]
        assert slots(root) == []
        d.close()

    asyncio.run(body())


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 is missing")
def test_a_slot_made_ahead_in_a_namespace_is_only_its_machines_and_given_up_if_it_does_not_fit(
    root: Path,
) -> None:
    """A slot made ahead of its claim (the private network's, souq.agent.machines.network_slots)
    joins the namespace ``prepare`` made; its machine starts in it, warm; a machine of that id
    that does not fit its sandbox (another working directory) gives it up and starts cold, in
    the same namespace; a machine of any other id never takes it."""
    files = image(root)
    (files / "work").mkdir()
    run = uuid.uuid4().hex[:8]
    ahead, misfit, stranger = (f"ahead-{run}", f"misfit-{run}", f"stranger-{run}")
    resolv = root / "resolv.conf"
    resolv.write_text("nameserver fdaa::3\n")
    made: list[str] = []

    def in_netns(mid: str, script: str, cwd: str | None = None) -> MachineSpec:
        spec = machine(mid, files, script)
        return replace(spec, netns=f"/run/netns/souq-t-{mid}", resolv_conf=str(resolv), cwd=cwd)

    def prepare(mid: str) -> None:
        subprocess.run(["ip", "netns", "add", f"souq-t-{mid}"], check=True)
        made.append(mid)

    def netns_of(pid: int) -> int:
        return os.stat(f"/proc/{pid}/ns/net").st_ino

    async def body() -> None:
        d = driver(root)
        try:
            for mid in (ahead, misfit):
                spec = in_netns(mid, "exec sleep 600")
                assert d.keep_ahead(spec, lambda mid=mid: prepare(mid))
            await eventually(
                lambda: all(d.ahead_state(m) == "ready" for m in (ahead, misfit)),
                timeout=30, message="the slots made ahead",
            )  # fmt: skip
            assert made == [ahead, misfit]
            other = in_netns(stranger, "echo stranger; exec sleep 600")
            subprocess.run(["ip", "netns", "add", f"souq-t-{stranger}"], check=True)
            async with started(d, other):  # no slot names its namespace: cold
                await output(d, stranger, "stranger")
                assert d.warm.taken == 0
            async with started(d, in_netns(ahead, "cat /etc/resolv.conf; exec sleep 600")) as h:
                assert d.warm.taken == 1 and d.ahead_state(ahead) == ""
                assert "nameserver fdaa::3" in await output(d, ahead, "nameserver")
                ns = os.stat(f"/run/netns/souq-t-{ahead}").st_ino
                assert netns_of(h.pid) == ns  # its sandbox joined the namespace made ahead
            spec = in_netns(misfit, "echo misfit; exec sleep 600", cwd=str(files / "work"))
            async with started(d, spec) as h:
                assert d.warm.taken == 1 and d.ahead_state(misfit) == ""  # given up: cold
                await output(d, misfit, "misfit")
                assert netns_of(h.pid) == os.stat(f"/run/netns/souq-t-{misfit}").st_ino
            await eventually(
                lambda: not _stub_roots_under(root), timeout=20, message="the misfit's slot ended"
            )
        finally:
            d.close()
            for mid in (ahead, misfit, stranger):
                subprocess.run(["ip", "netns", "delete", f"souq-t-{mid}"], check=False)
        assert slots(root) == []

    asyncio.run(body())


def _stub_roots_under(root: Path) -> list[str]:
    return [r for r in _stub_roots() if r.startswith(str(root))]
