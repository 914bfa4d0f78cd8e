"""Machines of the private network started warm (souq.agent.machines.network_slots): after a
machine of an image starts (or is re-adopted) on an agent of the default config (a network
namespace per machine), the next machine of its network and image has its namespace, address
and sandbox made before its claim; the machine that takes it is a machine like a cold one
(reaches and is reached, its name once it runs and not before, its address kept across a
restart), and what a slot holds is swept by the next agent after a kill -9 and removed by one
that leaves. Real agent, bubblewrap, namespaces, ip6tables."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest

from souq.images import layout_tar, pack_directory
from souq.model.machine import Machine, MachineState
from souq.network import links
from souq.testing import Cluster, wait_until
from tests import isolated
from tests.isolated import PRIVATE_NETWORK, busybox_tree, private_network_fixtures

BUSYBOX = shutil.which("busybox")
APPLETS = ("sh", "cat", "echo", "printf", "mkdir", "sleep", "httpd", "nc", "nslookup", "ip")
STUB = b"/proc/self/fd/4\0stub\0"
SERVE = (
    "mkdir -p /www; echo $SOUQ_MACHINE_ID > /www/index.html; echo up; exec httpd -f -p 8080 -h /www"
)

pytestmark = [
    *PRIVATE_NETWORK,
    pytest.mark.skipif(BUSYBOX is None, reason="busybox-static is missing (`make test` has it)"),
]


root, cluster = private_network_fixtures("souq-netslot-")


@pytest.fixture(scope="module")
def image(cluster: Cluster, root: Path) -> str:
    """A busybox image with a web server and a client."""
    files = busybox_tree(root / "image", APPLETS)
    with cluster.client() as client:
        return client.push_image(layout_tar(pack_directory(files, cmd=["sh"]))).reference


def _app(cluster: Cluster) -> str:
    name = "ns" + uuid.uuid4().hex[:10]
    with cluster.client() as client:
        client.create_app(name, network="web")
    return name


def _tag(cluster: Cluster) -> str:
    return links.WorkerNetwork(cluster.agents[0].worker_id or "", Path("/nonexistent")).tag


def _namespaces(cluster: Cluster) -> dict[str, int]:
    """The worker's machine namespaces: machine id -> the namespace's inode."""
    prefix = f"souq-{_tag(cluster)}-"
    found = {}
    for name in os.listdir(links.NETNS_DIR):
        if name.startswith(prefix):
            try:
                found[name.removeprefix(prefix)] = os.stat(links.NETNS_DIR / name).st_ino
            except FileNotFoundError:
                continue
    return found


def _stub_namespaces() -> set[int]:
    """The network namespaces of the stubs waiting in sandboxes made ahead."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes() == STUB:
                found.add(os.stat(f"/proc/{entry}/ns/net").st_ino)
        except OSError:
            continue
    return found


def _stubs_in(netns_inode: int) -> set[tuple[int, float]]:
    """The stubs in the network namespace of that inode now, each as its pid and start time
    (a namespace's inode is free again once it is gone: the next one made may have it)."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            if (
                entry.isdigit()
                and Path(f"/proc/{entry}/cmdline").read_bytes() == STUB
                and os.stat(f"/proc/{entry}/ns/net").st_ino == netns_inode
            ):
                found.add((int(entry), psutil.Process(int(entry)).create_time()))
        except (OSError, psutil.Error):
            continue
    return found


def _alive(stubs: set[tuple[int, float]]) -> bool:
    """Any of ``stubs`` still running (the same process: its pid and start time)."""
    for pid, started in stubs:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).create_time() == started:
                return True
    return False


def _slots(cluster: Cluster, machines: list[Machine]) -> list[str]:
    """Machine ids whose namespace holds a stub and no machine: slots made ahead."""
    known = {m.id for m in machines}
    stubs = _stub_namespaces()
    return sorted(m for m, ino in _namespaces(cluster).items() if m not in known and ino in stubs)


def _bwrap_command(cluster: Cluster, machine_id: str) -> list[str]:
    """What follows ``--`` on the command line of the machine's bwrap."""
    data = cluster.agents[0].data_dir / "machines"
    pid = int((data / ".agent" / machine_id / "pid").read_text().split()[0])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    return argv[argv.index("--") + 1 :]


def _started(cluster: Cluster, app: str, image: str) -> Machine:
    config = {"image": image, "guest": {"memory_mb": 64}, "cmd": ["sh", "-c", SERVE]}
    m = isolated.started(cluster, config, app)
    isolated.output(cluster, m, "up", app)
    return m


def _fetch(cluster: Cluster, app: str, m: Machine, address: str) -> str:
    """The body ``m`` gets from the web server at ``address`` ("" when it cannot)."""
    get = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {address} 8080"
    with cluster.client() as client:
        reply = client.exec(app, m.id, ["sh", "-c", get], stdin=None, timeout_s=30)
    return reply.stdout.split("\r\n\r\n", 1)[-1].strip() if "200 OK" in reply.stdout else ""


def _resolve(cluster: Cluster, app: str, m: Machine, name: str) -> str:
    with cluster.client() as client:
        reply = client.exec(app, m.id, ["nslookup", name], stdin=None, timeout_s=30)
    return reply.stdout


def _fast_path(cluster: Cluster) -> str:
    done = subprocess.run(
        ["nft", "list", "table", "netdev", f"souq-{_tag(cluster)}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout


def _address_in(cluster: Cluster, machine_id: str) -> str:
    ns = f"souq-{_tag(cluster)}-{machine_id}"
    return subprocess.run(
        ["ip", "-n", ns, "-6", "addr", "show", "dev", "eth0", "scope", "global"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def test_the_next_machine_of_a_network_takes_a_slot_and_is_a_machine_like_a_cold_one(
    cluster: Cluster, image: str
) -> None:
    app = _app(cluster)
    a = _started(cluster, app, image)
    machines = [a]
    try:
        assert _bwrap_command(cluster, a.id)[0] != "/proc/self/fd/4"  # the first starts cold
        (slot,) = wait_until(
            lambda: _slots(cluster, machines), timeout=30, message="a slot made ahead"
        )
        # Made ahead, it is nobody's name yet, and the app's name is its machine's alone.
        assert a.private_ip in _resolve(cluster, app, a, f"{app}.internal")
        assert "can't find" in _resolve(cluster, app, a, f"{slot}.vm.{app}.internal")
        b = _started(cluster, app, image)
        machines.append(b)
        assert b.id == slot  # the slot's machine id, namespace and sandbox
        assert _bwrap_command(cluster, b.id) == ["/proc/self/fd/4", "stub"]
        with cluster.client() as client:
            shown = client.get_machine(app, b.id)
        assert shown.private_ip == b.private_ip and b.private_ip != a.private_ip
        assert f"{b.private_ip}/128" in _address_in(cluster, b.id)
        # It reaches and is reached as a cold one, and is a name once it runs.
        assert _fetch(cluster, app, b, a.private_ip) == a.id
        assert _fetch(cluster, app, a, b.private_ip) == b.id
        assert wait_until(
            lambda: b.private_ip in _resolve(cluster, app, a, f"{b.id}.vm.{app}.internal"),
            timeout=30, message="the warm machine's name",
        )  # fmt: skip
        with cluster.client() as client:
            reply = client.exec(app, b.id, ["cat", "/etc/resolv.conf"], stdin=None, timeout_s=30)
        assert "nameserver fdaa::3" in reply.stdout
        if a.private_ip in _fast_path(cluster):  # a host with the fast path: its entry too
            wait_until(
                lambda: b.private_ip in _fast_path(cluster), timeout=30,
                message="the warm machine's fast path entry, added once it runs",
            )  # fmt: skip
        # The next slot is made for the next machine; a restart keeps the address.
        wait_until(lambda: _slots(cluster, machines), timeout=30, message="the next slot")
        with cluster.client() as client:
            client.restart(app, b.id)
            again = client.wait(app, b.id, MachineState.STARTED, timeout=60)
        assert again.private_ip == b.private_ip
        isolated.output(cluster, again, "up", app)
        assert wait_until(
            lambda: _fetch(cluster, app, a, b.private_ip) == b.id,
            timeout=20, message="b to answer again after its restart",
        )  # fmt: skip
    finally:
        isolated.destroy(cluster, *machines, app=app)


def test_a_killed_agents_slots_are_swept_made_again_and_removed_by_a_leaving_one(
    cluster: Cluster, image: str
) -> None:
    app = _app(cluster)
    a = _started(cluster, app, image)
    agent = cluster.agents[0]
    try:
        (slot,) = wait_until(lambda: _slots(cluster, [a]), timeout=30, message="a slot made")
        stubs = _stubs_in(_namespaces(cluster)[slot])
        assert stubs
        agent.kill()
        agent.start()
        cluster.wait_for_workers()

        def swept() -> bool:
            return slot not in _namespaces(cluster) and not _alive(stubs)

        wait_until(swept, timeout=30, message="the killed agent's slot swept")
        with cluster.client() as client:
            assert client.get_machine(app, a.id).state is MachineState.STARTED
        # The machine it re-adopted has the next one's slot made again, of another id.
        (again,) = wait_until(lambda: _slots(cluster, [a]), timeout=30, message="a new slot")
        assert again != slot
        b = _started(cluster, app, image)
        assert b.id == again and _bwrap_command(cluster, b.id) == ["/proc/self/fd/4", "stub"]
        assert b.private_ip != a.private_ip
        assert _fetch(cluster, app, b, a.private_ip) == a.id
        assert _fetch(cluster, app, a, b.private_ip) == b.id
        (left,) = wait_until(lambda: _slots(cluster, [a, b]), timeout=30, message="a slot")
        isolated.destroy(cluster, a, b, app=app)
        agent.stop(signal.SIGTERM)
        assert left not in _namespaces(cluster)
        assert not _stub_namespaces() & set(_namespaces(cluster).values())
    finally:
        if agent.process is None:
            agent.start()
            cluster.wait_for_workers()
        with cluster.client() as client:
            for m in client.list_machines(app):
                client.destroy(app, m.id, force=True)
