"""Exec and ps inside sandboxed machines: real agents, real bubblewrap, real ``nsenter``, real
cgroups. The exec'd command must see the machine's world (its hostname, ``/proc``, files,
network and environment), count against its limits, and be the machine's user, never more;
ps lists the processes of the machine's pid namespace by the pids it sees."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from souq.drivers import enter, sandbox
from souq.drivers.cgroups import detect
from souq.errors import ExecUnavailable, MachineNotStarted
from souq.model import MachineState, StopCommand
from souq.model.machine_tools import ExecCommand, ExecReply, ProcessStat
from souq.model.protocol import MachineRef
from souq.protocol import verbs as v
from souq.testing import wait_until
from tests.integration.agent_harness import APP, Harness, eventually, running_agent
from tests.integration.services_harness import HOST_PYTHON


def _static(path: str) -> bool:
    """Whether ``path`` is a statically linked program (it runs in an image with no libc)."""
    try:
        head = Path(path).read_bytes()[:4096]
    except OSError:
        return False
    return head.startswith(b"\x7fELF") and b"ld-linux" not in head


NSENTER = shutil.which("nsenter")
BUSYBOX = next((b for b in ("/bin/busybox", "/usr/bin/busybox") if _static(b)), None)
MACHINE_UID = 1048577  # a uid no one on the host has, as the lead's per-machine uids are

pytestmark = [
    pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot run here"),
    pytest.mark.skipif(NSENTER is None, reason="no nsenter (util-linux)"),
]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
needs_cgroups = pytest.mark.skipif(detect() is None, reason="no usable cgroups on this host")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's own is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="souq-enter-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def exec_in(h: Harness, machine_id: str, script: str, timeout_s: int = 30) -> ExecReply:
    cmd = ExecCommand(app=APP, machine_id=machine_id, argv=["sh", "-c", script])
    return await h.call(v.EXEC, cmd.model_copy(update={"timeout_s": timeout_s}), timeout=45)


async def ps(h: Harness, machine_id: str) -> list[ProcessStat]:
    return await h.call(v.PS, MachineRef(app=APP, machine_id=machine_id))


def pairs(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


async def sandboxed(h: Harness, *, memory_mb: int = 256, **config: object) -> str:
    """A started sandboxed machine whose command has printed ``up`` (bwrap is done)."""
    m = await h.claim(
        ["sh", "-c", "echo up uid=$(id -u); sleep 3600 & wait"],
        driver="sandbox",
        memory_mb=memory_mb,
        **config,
    )
    await h.output(m.id, "up", timeout=15)
    return m.id


def test_exec_enters_the_machines_namespaces_and_environment(nats_url: str, tmp_path: Path) -> None:
    hidden = tmp_path / "host-only"  # under /tmp, which is the machine's own tmpfs
    hidden.write_text("the host's\n")
    script = (
        "echo host=$(hostname); echo greeting=$GREETING; echo pwd=$(pwd); echo self=$$; "
        'echo init="$(tr "\\0" " " < /proc/1/cmdline)"; '
        f"test -e {hidden} && echo hidden=seen || echo hidden=hidden; "
        'echo ifaces="$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " | sort | tr "\\n" ,)"; '
        'echo cgroup="$(sort /proc/self/cgroup | tr "\\n" ";")"; '
        "touch /usr/souq-escape 2>/dev/null && echo usr=writable || echo usr=readonly"
    )

    async def body() -> None:
        async with running_agent(nats_url, tmp_path / "agent") as h:
            mid = await sandboxed(h, env={"GREETING": "hello there"}, sandbox={"network": False})
            reply = await exec_in(h, mid, script)
            assert reply.exit_code == 0, reply
            out = pairs(reply.stdout)
            assert out["host"] == "sandbox"  # its uts namespace (the worker's is another)
            assert out["greeting"] == "hello there"  # the machine's environment
            assert out["pwd"] == sandbox.WORKDIR  # the machine's directory, as it sees it
            assert int(out["self"]) < 20  # its pid namespace: bwrap is 1, the machine 2
            assert out["init"].split()[0].endswith("bwrap"), out["init"]
            assert hidden.exists() and out["hidden"] == "hidden"  # its mount namespace
            assert out["ifaces"] == "lo,"  # its network namespace
            assert out["usr"] == "readonly"
            handle = h.agent.executor.handle(mid)
            assert handle is not None
            init = enter.machine_init(handle.pid)
            assert init is not None
            own = sorted(Path(f"/proc/{init}/cgroup").read_text().splitlines())
            assert out["cgroup"].split(";")[:-1] == own  # the machine's cgroup
            assert any(line.endswith(f"/souq/{mid}") for line in own) or detect() is None

            missing = await exec_in(h, mid, "exec no-such-program-here")
            assert missing.exit_code == 127
            await h.call(v.STOP, StopCommand(app=APP, machine_id=mid))
            await h.wait(mid, MachineState.STOPPED, timeout_s=20)
            with pytest.raises(MachineNotStarted, match="started machine"):
                await exec_in(h, mid, "true")

    asyncio.run(body())


@needs_cgroups
def test_an_exec_counts_against_the_machines_memory_limit(nats_url: str, tmp_path: Path) -> None:
    hog = "b = bytearray(256 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1"

    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            mid = await sandboxed(h, memory_mb=64)
            reply = await exec_in(h, mid, f"exec {HOST_PYTHON} -c '{hog}'")
            assert reply.exit_code == 128 + 9, reply  # the kernel's OOM killer: SIGKILL
            small = await exec_in(h, mid, f"exec {HOST_PYTHON} -c 'print(len(bytearray(8)))'")
            assert small.stdout == "8\n"
            assert (await h.get(mid)).state is MachineState.STARTED  # the hog went, not it

    asyncio.run(body())


def test_ps_lists_the_machines_pid_namespace_by_the_pids_it_sees(
    nats_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            mid = await sandboxed(h)
            # A process exec starts and leaves behind (its own session) stays in the machine.
            # The exec waits until it leads its session: what is still in the exec's own group
            # when the exec ends is killed with it.
            reply = await exec_in(
                h,
                mid,
                "setsid sleep 3602 </dev/null >/dev/null 2>&1 & p=$!; "
                'until [ "$(cut -d" " -f6 /proc/$p/stat)" = "$p" ]; do :; done; echo $p',
            )
            left = int(reply.stdout)

            async def listed() -> dict[int, ProcessStat] | None:
                rows = {row.pid: row for row in await ps(h, mid)}
                return rows if left in rows and rows[left].command == "sleep 3602" else None

            rows = await eventually(
                listed, message="ps to list the process exec left (once setsid exec'd sleep)"
            )
            assert min(rows) == 1 and rows[1].command.split()[0].endswith("bwrap")
            program, _, args = rows[2].command.partition(" ")
            assert program.endswith("sh") and args.startswith("-c 'echo up")  # the command
            assert rows[2].directory == sandbox.WORKDIR  # as the machine sees it
            assert any(row.command == "sleep 3600" for row in rows.values())
            handle = h.agent.executor.handle(mid)
            assert handle is not None and handle.pid not in rows  # bwrap outside is not one

    asyncio.run(body())


@needs_root
def test_exec_is_the_machines_own_user_inside_its_user_namespace(
    nats_url: str, open_dir: Path
) -> None:
    """A machine run as an unprivileged uid: bwrap gives it a user namespace. The exec'd
    command has the uid the machine's command has inside, and is the machine's uid outside."""

    async def body() -> None:
        async with running_agent(nats_url, open_dir, machine_user=str(MACHINE_UID)) as h:
            mid = await sandboxed(h)
            inside_uid = (await h.output(mid, "up")).split("uid=")[1].split()[0]
            reply = await exec_in(h, mid, "id -u; touch made")
            assert reply.stdout.split() == [inside_uid], reply
            made = open_dir / "machines" / mid / "made"
            assert made.stat().st_uid == MACHINE_UID  # outside: the machine's uid, not root

    asyncio.run(body())


# -- bwrap in a user namespace with root inside (run here as the driver is to run it) ---------


def _jail(workdir: Path, *userns: str, image: sandbox.Image | None = None) -> subprocess.Popen[str]:
    """bwrap as the sandbox driver builds it, run by :data:`MACHINE_UID` with a user
    namespace whose root is that uid; its command says ``ready`` once the jail is built.
    ``--die-with-parent``: killing the outer bwrap ends the jail (its init, and so its pid
    namespace), as the test's teardown does."""
    argv = sandbox.bwrap_argv(workdir, network=False, machines_root=None, image=image)
    assert argv[-1] == "--"
    argv = [*argv[:-1], "--unshare-user", "--uid", "0", "--gid", "0", *userns]
    argv += ["--die-with-parent", "--"]
    proc = subprocess.Popen(
        [*argv, "sh", "-c", "echo ready; exec sleep 3600"],
        stdout=subprocess.PIPE,
        text=True,
        user=MACHINE_UID,
        group=MACHINE_UID,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "MACHINE_VAR": "set"},
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def command_env(entry: enter.Entry) -> dict[str, str]:
    """The environment of the jail's command, as an exec passes it on: read again while the
    command is in the midst of its ``exec sleep`` (``/proc`` gives none then)."""
    return wait_until(
        lambda: psutil.Process(entry.target).environ(),
        timeout=10,
        message="the jail command's environment",
    )


@pytest.fixture
def workdir(open_dir: Path) -> Path:
    path = open_dir / "machine"
    path.mkdir()
    os.chown(path, MACHINE_UID, MACHINE_UID)
    return path


@needs_root
def test_exec_into_a_user_namespace_is_root_inside_and_the_machines_uid_outside(
    workdir: Path,
) -> None:
    jail = _jail(workdir, "--disable-userns")
    try:
        entry = enter.entry_of(jail.pid)
        assert "user" in entry.namespaces and (entry.uid, entry.gid) == (0, 0)
        assert NSENTER is not None
        script = "id -u; hostname; touch /run/souq/made; umount /tmp || echo kept; exec sleep 60"
        inside = subprocess.Popen(
            [*enter.nsenter_argv(entry, NSENTER), "sh", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=command_env(entry),
        )
        try:
            assert inside.stdout is not None
            assert [inside.stdout.readline() for _ in range(3)] == ["0\n", "sandbox\n", "kept\n"]
            (child,) = psutil.Process(inside.pid).children()  # nsenter forks into the pid ns
            status = enter.parse_status(Path(f"/proc/{child.pid}/status").read_text())
            assert status["Uid"].split() == [str(MACHINE_UID)] * 4  # never host root
            assert status["Gid"].split() == [str(MACHINE_UID)] * 4
            assert status["Groups"] == ""
            assert (enter.inside_pid(status) or 0) < 20
            # (read once it has exec'd its sleep: mid-exec, /proc says no environment at all)
            slept = wait_until(
                lambda: child.name() == "sleep" and child.environ(),
                timeout=10,
                message="the entered command's sleep",
            )
            assert slept["MACHINE_VAR"] == "set"
            assert (workdir / "made").stat().st_uid == MACHINE_UID
        finally:
            inside.kill()
            inside.wait()
    finally:
        jail.kill()
        jail.wait()


@needs_root
@pytest.mark.skipif(BUSYBOX is None, reason="no static busybox to make an image of")
def test_exec_into_a_machine_of_a_whole_image_runs_the_images_programs(
    workdir: Path, open_dir: Path
) -> None:
    """The image is the machine's root: the exec'd command is looked up and run there, and
    sees the image's files, none of the host's."""
    rootfs = open_dir / "rootfs"
    for made in ("bin", "dev", "proc", "tmp", "run"):  # bwrap mounts over the last four
        (rootfs / made).mkdir(parents=True)
    assert BUSYBOX is not None
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in ("sh", "sleep", "cat", "id", "ls"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    (rootfs / "marker").write_text("from the image\n")
    jail = _jail(workdir, "--disable-userns", image=sandbox.Image(rootfs))
    try:
        entry = enter.entry_of(jail.pid)
        assert NSENTER is not None
        script = "cat /marker; id -u; pwd; ls /usr 2>/dev/null || echo no-usr"
        ran = subprocess.run(
            [*enter.nsenter_argv(entry, NSENTER), "sh", "-c", script],
            capture_output=True,
            text=True,
            env=command_env(entry),
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines() == ["from the image", "0", "/", "no-usr"]
    finally:
        jail.kill()
        jail.wait()


@needs_root
def test_a_user_namespace_that_owns_the_sandbox_is_not_entered_as_root(workdir: Path) -> None:
    """Plain ``--unshare-user --uid 0``: the user namespace owns the jail's mounts. Root
    entering it would hold every capability there, which the machine's command does not."""
    jail = _jail(workdir)
    try:
        with pytest.raises(enter.CannotEnter, match="capabilities") as refused:
            enter.entry_of(jail.pid)
        assert refused.value.reason == "wider"
        # What it guards against: a bare nsenter as root can undo the machine's mounts.
        (command,) = psutil.Process(enter.machine_init(jail.pid) or 0).children()
        assert NSENTER is not None
        flags = ["--user", "--mount", "--setuid=0", "--setgid=0"]
        undo = subprocess.run(
            [NSENTER, f"--target={command.pid}", *flags, "--", "umount", "/tmp"],
            capture_output=True,
            check=False,
        )
        assert undo.returncode == 0, undo.stderr
    finally:
        jail.kill()
        jail.wait()


def test_a_worker_without_nsenter_says_so(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            mid = await sandboxed(h)
            empty = tmp_path / "empty"
            empty.mkdir()
            # The agent's own PATH without nsenter, for the exec alone (its clean-up at the
            # end needs `ip` again, to remove the machine's network namespace).
            with monkeypatch.context() as patched:
                patched.setenv("PATH", str(empty))
                with pytest.raises(ExecUnavailable, match="nsenter") as refused:
                    await exec_in(h, mid, "true")
            assert refused.value.hint is not None and "util-linux" in refused.value.hint
            assert refused.value.status == "exec_unavailable"

    asyncio.run(body())


def test_an_exec_s_command_is_the_agent_s_own_while_it_runs(nats_url: str, tmp_path: Path) -> None:
    """The reaper leaves an exec's command to the exec that waits for it (its status would
    otherwise be lost, and the exec's wait never end): the agent names it as its own until the
    exec has its answer, and no longer."""

    async def body() -> None:
        async with running_agent(nats_url, tmp_path / "agent") as h:
            mid = await sandboxed(h, sandbox={"network": False})
            tools = h.agent._service.verbs.tools  # type: ignore[union-attr]
            waiting = asyncio.create_task(
                exec_in(h, mid, "while [ ! -e /tmp/go ]; do sleep 0.02; done; echo done")
            )
            running = await eventually(lambda: set(tools.running), message="the exec running")
            assert running <= h.agent.owned_pids()
            assert (await exec_in(h, mid, "touch /tmp/go")).exit_code == 0
            reply = await waiting
            assert (reply.exit_code, reply.stdout) == (0, "done\n")
            assert not running & h.agent.owned_pids()  # the exec's command, no longer its own
            assert tools.running == set()

    asyncio.run(body())
