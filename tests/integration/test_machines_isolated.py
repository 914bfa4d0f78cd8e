"""Machines as machines, on a real cluster whose agent keeps its own defaults (a root agent, no
``--machine-user``, no ``--default-driver``): a machine that names no driver is isolated under
bubblewrap, in a user namespace whose root is a host uid of the machine's own; a machine of an
image runs in the image's root file system under a writable layer of its own (overlayfs on an
idmapped mount of the shared image). Assertions read /proc and the files, never timings."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest

from souq.drivers import sandbox
from souq.drivers.identity import BASE, COUNT
from souq.images import layout_tar, pack_directory
from souq.testing import AgentProcess, Cluster, auth_headers, wait_until
from tests.clusters import isolated
from tests.isolated import APP, destroy, output, processes_of, started

BUSYBOX = shutil.which("busybox")
APPLETS = ("sh", "id", "ls", "cat", "echo", "sleep", "test", "hostname", "kill", "true", "grep")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="isolation needs a root agent"),
    pytest.mark.skipif(
        BUSYBOX is None, reason="busybox-static is missing (`make test` installs it)"
    ),
    pytest.mark.skipif(not sandbox.available(), reason=f"{sandbox.unavailable()}"),
]


def busybox_root(root: Path) -> Path:
    """A whole root file system of busybox alone: /bin/busybox and its applets."""
    (root / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX or "", root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc").mkdir()
    (root / "etc" / "motd").write_text("the image's own\n")
    return root


CLUSTER = isolated("isolated")


@pytest.fixture(scope="module")
def image(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    built = pack_directory(busybox_root(tmp_path_factory.mktemp("bb") / "rootfs"), cmd=["sh"])
    with cluster.client() as client:
        return client.push_image(layout_tar(built)).reference


def agent(cluster: Cluster) -> AgentProcess:
    return cluster.agents[0]


def host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def test_the_worker_says_it_isolates_by_default(cluster: Cluster) -> None:
    with cluster.client() as client:
        (worker,) = client.workers()
    fp = worker.fingerprint
    assert fp is not None
    assert "sandbox" in fp.drivers
    assert fp.isolation["default_driver"] == "sandbox"
    assert "user" in fp.isolation["namespaces"]
    assert "a uid of each machine's own" in fp.machine_user


def test_a_machine_of_an_image_runs_in_its_root_as_root_of_a_uid_of_its_own(
    cluster: Cluster, image: str
) -> None:
    script = "id -u; hostname; cat /etc/motd; ls /proc | grep -c '^[0-9]'; echo ready; sleep 600"
    one = started(cluster, {"image": image, "cmd": ["sh", "-c", script]})
    two = started(cluster, {"image": image, "cmd": ["sh", "-c", script]})
    try:
        assert one.config.driver == "sandbox"  # the worker chose, and says so
        assert one.placement is not None and one.placement.driver == "sandbox"
        assert one.placement.isolation is None
        text = output(cluster, one, "ready")
        lines = text.split()
        assert lines[0] == "0"  # root inside
        assert lines[1] == "sandbox"
        assert "the image's own" in text  # the image's /etc, not the host's
        assert int(lines[-2]) <= 4  # its own pid namespace: bwrap, sh, sleep (and ls)
        uids = set()
        for machine in (one, two):
            pids = wait_until(lambda m=machine: processes_of(m.id), timeout=10, message="pids")
            owners = {host_uid(pid) for pid in pids}
            assert len(owners) == 1, owners  # all of its processes: one uid
            (uid,) = owners
            assert BASE <= uid < BASE + COUNT
            uids.add(uid)
        assert len(uids) == 2  # each machine its own
    finally:
        destroy(cluster, one, two)


def test_writes_go_to_the_machine_own_layer_and_start_afresh_unless_kept(
    cluster: Cluster, image: str
) -> None:
    script = (
        "test -e /etc/mine && echo FOUND-OLD || echo FRESH; echo $SOUQ_MACHINE_ID > /etc/mine; "
        "echo written; sleep 600"
    )
    config = {"image": image, "cmd": ["sh", "-c", script]}
    one = started(cluster, config)
    two = started(cluster, config)
    kept = started(cluster, {**config, "rootfs": {"persist": "always"}})
    try:
        for machine in (one, two, kept):
            assert "FRESH" in output(cluster, machine, "written")  # never another's write
        images = agent(cluster).data_dir / "images"
        assert not list(images.glob("images/*/rootfs/etc/mine"))  # the image is unchanged
        with cluster.client() as client:
            for machine in (one, kept):
                client.restart(APP, machine.id)
        assert "FRESH" in output(cluster, one, "written\nFRESH")  # a restart: from the image
        assert "FOUND-OLD" in output(cluster, kept, "FOUND-OLD")  # rootfs.persist = always
    finally:
        destroy(cluster, one, two, kept)
    rootfs = agent(cluster).data_dir / "machines" / ".rootfs"
    machines = [one.id, two.id, kept.id]  # (the slot made for the next machine keeps its own)
    wait_until(
        lambda: not any((rootfs / mid).exists() for mid in machines),
        timeout=20,
        message="the machines' layers removed with them",
    )
    mounts = Path("/proc/self/mountinfo").read_text()
    assert not any(f"{rootfs / mid}/" in mounts for mid in machines)


def refused(cluster: Cluster, config: dict[str, object]) -> dict[str, object]:
    """The body of a create of ``config`` refused as ``422 command_not_runnable``."""
    response = httpx.post(
        f"{cluster.api_url}/v1/apps/{APP}/machines",
        json={"region": "mad", "config": config},
        headers=auth_headers(),
        timeout=30,
    )
    assert response.status_code == 422, response.text
    body: dict[str, object] = response.json()
    assert body["status"] == "command_not_runnable"
    return body


def test_a_program_its_user_cannot_run_fails_the_create_at_once(cluster: Cluster) -> None:
    hidden = Path("/root/.souq-test-hidden")
    hidden.mkdir(mode=0o700, exist_ok=True)
    program = hidden / "tool"
    program.write_text("#!/bin/sh\necho hi\n")
    program.chmod(0o755)
    try:
        body = refused(cluster, {"cmd": [str(program)]})
        assert str(program) in body["error"] and "a machine's own uid" in body["error"]
        assert body["path"] == str(program) and body["program"] == str(program)
    finally:
        shutil.rmtree(hidden)


def test_a_program_under_tmp_fails_a_sandboxed_create_and_runs_as_exec(cluster: Cluster) -> None:
    """A sandbox's /tmp is its own: a host program there, which the machine's user could run
    as a plain process, is out of a sandboxed machine's sight, so its create fails at once."""
    home = Path(tempfile.mkdtemp(prefix="souq-test-tool-", dir="/tmp"))
    home.chmod(0o755)
    program = home / "tool"
    program.write_text("#!/bin/sh\necho hi; sleep 600\n")
    program.chmod(0o755)
    try:
        body = refused(cluster, {"cmd": [str(program)], "driver": "sandbox"})
        assert "under /tmp" in body["error"] and body["path"] == str(program)
        machine = started(cluster, {"driver": "exec", "cmd": [str(program)]})
        assert machine.state.value == "started"  # as a plain process it is in sight
        destroy(cluster, machine)
    finally:
        shutil.rmtree(home)


def test_a_program_on_root_only_path_entries_is_found_where_its_user_can_run_it(
    cluster: Cluster,
) -> None:
    """The agent's PATH starts with directories only root may enter (here, /root/...): the
    machine's `sh` is found past them, as execvp would."""
    machine = started(cluster, {"driver": "exec", "cmd": ["sh", "-c", "echo found; sleep 600"]})
    try:
        output(cluster, machine, "found")
    finally:
        destroy(cluster, machine)


def test_python3_is_the_one_its_user_can_run_not_roots_shim(cluster: Cluster) -> None:
    """As root on this kind of machine, `python3` on root's PATH is a shim under /root (0700);
    the machine's user runs the system's, under the default driver and under exec."""
    for driver in (None, "exec"):
        config: dict[str, object] = {"cmd": ["python3", "-c", "import sys; print(sys.executable)"]}
        if driver:
            config["driver"] = driver
        with cluster.client() as client:
            machine = client.create_machine(APP, "mad", {**config, "restart": {"policy": "no"}})
        try:
            text = output(cluster, machine, "python3")
            assert "/root/" not in text and "Permission denied" not in text, text
        finally:
            destroy(cluster, machine)
