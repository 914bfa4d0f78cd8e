"""Everything a machine user expects, inside a sandboxed machine: a real cluster whose root agent
keeps its own defaults (no ``--machine-user``, no ``--default-driver``: machines that name no
driver run under bubblewrap as a uid of their own), driven through the public API and a real
edge proxy. Logs, exec, ps, secrets, volumes at their path, the stop signal and its timeout,
re-adoption after a kill -9 of the agent, suspend and resume, autostop and autostart through the
proxy, metadata and the GPUs' env."""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from souq.drivers import sandbox
from souq.images import layout_tar, pack_directory
from souq.model.machine import Machine, MachineState
from souq.testing import AgentProcess, Cluster, ProxyProcess, wait_until
from tests.clusters import ClusterSpec, agent
from tests.isolated import machines_root

ECHO = Path(__file__).with_name("echo_app.py")
BUSYBOX = shutil.which("busybox")
APPLETS = ("sh", "cat", "echo", "sleep", "hostname")
PYTHON = "/usr/bin/python3"  # the host's, which a machine's own uid may run

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="isolation needs a root agent"),
    pytest.mark.skipif(not sandbox.available(), reason=f"{sandbox.unavailable()}"),
    pytest.mark.skipif(shutil.which("nsenter") is None, reason="no nsenter (util-linux)"),
    pytest.mark.skipif(not os.access(PYTHON, os.X_OK), reason=f"no {PYTHON}"),
    pytest.mark.skipif(BUSYBOX is None, reason="busybox-static is missing (`make test` has it)"),
]


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    with machines_root("souq-inside-") as path:
        yield path


CLUSTER = ClusterSpec(
    "inside",
    regions={},
    root_fixture="root",
    agents=(
        agent(
            "mad",
            machine_user=None,
            default_driver=None,
            stop_machines_on_exit=False,
            extra_args=["--gpus", "1", "--gpu-model", "T4"],
        ),
    ),
)


@pytest.fixture(scope="module")
def echo(root: Path) -> str:
    """The echo app where every machine's uid may read it."""
    shared = root / "share"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    target = shared / "echo_app.py"
    shutil.copy(ECHO, target)
    target.chmod(0o644)
    return str(target)


@pytest.fixture(scope="module")
def proxy(cluster: Cluster, root: Path) -> Iterator[ProxyProcess]:
    with ProxyProcess(
        nats_url=cluster.nats.url,
        log_path=root / "proxy.log",
        extra_args=["--autostop-interval", "1"],
    ) as p:
        yield p


def busybox_image(cluster: Cluster, root: Path, motd: str) -> str:
    """A whole root file system of busybox alone whose /etc/motd says ``motd``, pushed."""
    (root / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX or "", root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc").mkdir()
    (root / "etc" / "motd").write_text(motd + "\n")
    with cluster.client() as client:
        return client.push_image(layout_tar(pack_directory(root, cmd=["sh"]))).reference


def app_name() -> str:
    return "in" + uuid.uuid4().hex[:10]


def agent(cluster: Cluster) -> AgentProcess:
    return cluster.agents[0]


def started(cluster: Cluster, app: str, config: dict[str, object]) -> Machine:
    with cluster.client() as client:
        machine = client.create_machine(app, "mad", {"guest": {"memory_mb": 64}, **config})
        ready = client.wait(app, machine.id, MachineState.STARTED, timeout=60)
    assert ready.config.driver == "sandbox"  # the worker's own default
    return ready


def shell(cluster: Cluster, app: str, script: str, **config: object) -> Machine:
    return started(cluster, app, {"cmd": ["sh", "-c", script], **config})


def logs_with(cluster: Cluster, app: str, machine: Machine, text: str, timeout: float = 30) -> str:
    last = [""]

    def seen() -> str | None:
        with cluster.client() as client:
            last[0] = client.logs(app, machine.id)
        return last[0] if text in last[0] else None

    try:
        found = wait_until(seen, timeout=timeout, message=f"{text!r} in the machine's logs")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; it printed: {last[0]!r}") from exc
    assert found is not None
    return found


def run_in(cluster: Cluster, app: str, machine: Machine, script: str) -> tuple[int, str, str]:
    with cluster.client() as client:
        reply = client.exec(app, machine.id, ["sh", "-c", script], stdin=None, timeout_s=30)
    return reply.exit_code, reply.stdout, reply.stderr


def state_of(cluster: Cluster, app: str, machine: Machine) -> MachineState:
    with cluster.client() as client:
        return client.get_machine(app, machine.id).state


def destroy(cluster: Cluster, app: str, *machines: Machine) -> None:
    with cluster.client() as client:
        for machine in machines:
            client.destroy(app, machine.id, force=True)


def test_logs_carry_the_machines_stdout_and_stderr(cluster: Cluster) -> None:
    app = app_name()
    m = shell(cluster, app, "echo to-out; echo to-err >&2; hostname; exec sleep 600")
    try:
        text = logs_with(cluster, app, m, "sandbox")
        assert "to-out" in text and "to-err" in text
    finally:
        destroy(cluster, app, m)


def test_exec_runs_in_the_machines_namespaces(cluster: Cluster) -> None:
    app = app_name()
    m = shell(cluster, app, "echo up; exec sleep 600", env={"GREETING": "hi there"})
    try:
        logs_with(cluster, app, m, "up")
        code, out, _ = run_in(cluster, app, m, "hostname; echo $GREETING; echo $$; id -u")
        assert code == 0
        host, greeting, pid, uid = out.split("\n")[:4]
        assert (host, greeting) == ("sandbox", "hi there")
        assert int(pid) < 20  # its own pid namespace
        assert uid == "0"  # root of its own user namespace
        assert run_in(cluster, app, m, "exit 3")[0] == 3
    finally:
        destroy(cluster, app, m)


def test_ps_lists_the_processes_of_the_machine(cluster: Cluster) -> None:
    app = app_name()
    m = shell(cluster, app, "echo up; sleep 3601 & wait")
    try:
        logs_with(cluster, app, m, "up")

        def listed() -> list[str] | None:
            with cluster.client() as client:
                rows = client.processes(app, m.id)
            commands = [row.command for row in rows]
            return commands if "sleep 3601" in commands else None

        commands = wait_until(listed, timeout=20, message="ps to list the machine's sleep")
        assert commands is not None
        assert commands[0].split()[0].endswith("bwrap")  # pid 1 of its namespace
        assert not any("souq agent" in c for c in commands)  # nothing of the worker's
    finally:
        destroy(cluster, app, m)


def test_the_apps_secrets_are_in_the_machines_environment(cluster: Cluster) -> None:
    app = app_name()
    with cluster.client() as client:
        client.set_secrets(app, {"DB_PASSWORD": "s3cr3t"})
    script = 'test "$DB_PASSWORD" = s3cr3t && echo has-secret; echo "said=$DB_PASSWORD"; sleep 600'
    m = shell(cluster, app, script)
    try:
        text = logs_with(cluster, app, m, "said=")
        assert "has-secret" in text
        assert "s3cr3t" not in text  # the logs redact a secret's value
        check = 'test "$DB_PASSWORD" = s3cr3t && echo has-secret'
        assert run_in(cluster, app, m, check)[1] == "has-secret\n"  # exec's env too
    finally:
        destroy(cluster, app, m)


def test_a_volume_is_mounted_at_its_path(cluster: Cluster) -> None:
    app = app_name()
    with cluster.client() as client:
        volume = client.create_volume(app, {"name": "data", "region": "mad", "size_gb": 1})
    script = 'echo "at=$SOUQ_VOLUME_DATA"; echo kept > /data/note; echo written; exec sleep 600'
    m = shell(cluster, app, script, mounts=[{"volume": volume.id, "path": "/data"}])
    try:
        assert "at=/data" in logs_with(cluster, app, m, "written")
        host_file = agent(cluster).data_dir / "volumes" / volume.id / "note"
        assert host_file.read_text() == "kept\n"  # the volume's own directory on the host
        assert run_in(cluster, app, m, "cat /data/note")[1] == "kept\n"
    finally:
        destroy(cluster, app, m)
    second = shell(cluster, app, "cat /data/note; exec sleep 600", mounts=[
        {"volume": volume.id, "path": "/data"}
    ])  # fmt: skip
    try:
        assert "kept" in logs_with(cluster, app, second, "kept")  # it outlives a machine
    finally:
        destroy(cluster, app, second)


def test_stop_sends_the_stop_signal_to_the_machines_program(cluster: Cluster) -> None:
    app = app_name()
    script = (
        "trap 'echo got-usr1' USR1; trap 'echo got-term; exit 0' TERM; echo armed; "
        "while :; do sleep 1; done"
    )
    m = shell(cluster, app, script, stop_config={"signal": "SIGTERM", "timeout": "30s"})
    try:
        logs_with(cluster, app, m, "armed")
        with cluster.client() as client:
            client.signal(app, m.id, "SIGUSR1")  # `souq machine signal`: it lives on
            logs_with(cluster, app, m, "got-usr1")
            assert client.get_machine(app, m.id).state is MachineState.STARTED
            client.stop(app, m.id)
            client.wait(app, m.id, MachineState.STOPPED, timeout=30)
        assert "got-term" in logs_with(cluster, app, m, "got-term")
    finally:
        destroy(cluster, app, m)


def test_a_program_that_ignores_the_signal_is_killed_after_the_timeout(cluster: Cluster) -> None:
    app = app_name()
    script = "trap 'echo ignored' TERM; echo armed; while :; do sleep 1; done"
    m = shell(cluster, app, script, stop_config={"signal": "SIGTERM", "timeout": "2s"})
    try:
        logs_with(cluster, app, m, "armed")
        with cluster.client() as client:
            client.stop(app, m.id)
            client.wait(app, m.id, MachineState.STOPPED, timeout=30)
        assert "ignored" in logs_with(cluster, app, m, "ignored")  # it did get the signal
        assert not pids_of(cluster, m)  # SIGKILL after the timeout: nothing of it left
    finally:
        destroy(cluster, app, m)


def _environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def pids_of(cluster: Cluster, machine: Machine) -> set[int]:
    """Host pids of the machine's processes (those whose environment names it)."""
    named = f"SOUQ_MACHINE_ID={machine.id}"
    return {p for p in agent(cluster).machine_pids() if named in _environ(p).split("\0")}


def shells_of(pids: set[int]) -> set[int]:
    """Those of ``pids`` that are not a ``sleep`` (bwrap, its init, the machine's shell)."""
    return {p for p in pids if _comm(p) not in ("sleep", "")}


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_a_killed_agent_readopts_its_sandboxed_machine(cluster: Cluster) -> None:
    app = app_name()
    script = "trap 'echo got-term; exit 0' TERM; echo up; while :; do sleep 1; done"
    m = shell(cluster, app, script, stop_config={"signal": "SIGTERM", "timeout": "30s"})
    a = agent(cluster)
    try:
        logs_with(cluster, app, m, "up")
        before = shells_of(pids_of(cluster, m))  # not its loop's short sleeps
        assert before
        a.stop(signal.SIGKILL)
        a.start()
        wait_until(
            lambda: state_of(cluster, app, m) is MachineState.STARTED,
            timeout=30,
            message="the machine started again after the agent came back",
        )
        after = shells_of(pids_of(cluster, m))
        assert before == after  # the same processes: adopted, not restarted
        assert run_in(cluster, app, m, "hostname")[1] == "sandbox\n"  # exec reaches it
        with cluster.client() as client:
            client.stop(app, m.id)
            client.wait(app, m.id, MachineState.STOPPED, timeout=30)
        assert "got-term" in logs_with(cluster, app, m, "got-term")  # the signal reached it
        assert not any(os.path.exists(f"/proc/{p}") and _environ(p) for p in before)
    finally:
        destroy(cluster, app, m)


def test_suspend_freezes_and_resume_continues_the_same_processes(cluster: Cluster) -> None:
    app = app_name()
    m = shell(cluster, app, "echo up; exec sleep 600")
    try:
        logs_with(cluster, app, m, "up")
        pids = pids_of(cluster, m)
        with cluster.client() as client:
            client.suspend(app, m.id)
            client.wait(app, m.id, MachineState.SUSPENDED, timeout=30)
            client.start(app, m.id)
            client.wait(app, m.id, MachineState.STARTED, timeout=30)
        now = pids_of(cluster, m)
        assert pids <= now  # resumed, not restarted
        assert run_in(cluster, app, m, "echo alive")[1] == "alive\n"
    finally:
        destroy(cluster, app, m)


def test_the_proxy_autostops_an_idle_machine_and_autostarts_it(
    cluster: Cluster, proxy: ProxyProcess, echo: str
) -> None:
    app = app_name()
    config = {
        "cmd": [PYTHON, echo],
        "services": [{"internal_port": 8080, "autostop": "stop", "autostart": True}],
    }
    m = started(cluster, app, config)
    try:
        wait_until(
            lambda: state_of(cluster, app, m) is MachineState.STOPPED,
            timeout=60,
            message="the proxy to stop the idle machine",
        )
        with httpx.Client(base_url=proxy.url, headers={"Host": f"{app}.localhost"}) as http:
            answer = http.get("/hello", timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["machine_id"] == m.id
        assert state_of(cluster, app, m) is MachineState.STARTED
    finally:
        destroy(cluster, app, m)


def test_metadata_is_set_and_read_on_a_running_sandboxed_machine(cluster: Cluster) -> None:
    app = app_name()
    m = shell(cluster, app, "echo up; exec sleep 600", metadata={"role": "primary"})
    try:
        logs_with(cluster, app, m, "up")
        with cluster.client() as client:
            client.set_metadata(app, m.id, "tier", "gold")
            assert client.metadata(app, m.id) == {"role": "primary", "tier": "gold"}
            client.set_metadata(app, m.id, "role", None)
            assert client.metadata(app, m.id) == {"tier": "gold"}
        assert state_of(cluster, app, m) is MachineState.STARTED  # in place, no restart
        assert run_in(cluster, app, m, "echo ok")[1] == "ok\n"
    finally:
        destroy(cluster, app, m)


def test_the_gpus_env_reaches_the_sandboxed_machine(cluster: Cluster) -> None:
    app = app_name()
    script = 'echo "gpus=$SOUQ_GPUS milli=$SOUQ_GPU_MILLI"; exec sleep 600'
    m = shell(cluster, app, script, guest={"memory_mb": 64, "gpus": 1})
    try:
        assert m.gpu_ids == [0]
        assert "gpus=0 milli=1000" in logs_with(cluster, app, m, "gpus=")
        assert run_in(cluster, app, m, "echo $SOUQ_GPUS")[1] == "0\n"
    finally:
        destroy(cluster, app, m)


def test_an_update_to_another_image_runs_the_new_images_root(
    cluster: Cluster, tmp_path: Path
) -> None:
    first = busybox_image(cluster, tmp_path / "one", "first image")
    second = busybox_image(cluster, tmp_path / "two", "second image")
    app = app_name()
    cmd = ["sh", "-c", "cat /etc/motd; exec sleep 600"]
    m = started(cluster, app, {"image": first, "cmd": cmd})
    try:
        logs_with(cluster, app, m, "first image")
        with cluster.client() as client:
            config = client.get_machine(app, m.id).config.model_dump(mode="json")
            client.update(app, m.id, {**config, "image": second})
            client.wait(app, m.id, MachineState.STARTED, timeout=60)
        logs_with(cluster, app, m, "second image")
        assert run_in(cluster, app, m, "cat /etc/motd")[1] == "second image\n"
    finally:
        destroy(cluster, app, m)
