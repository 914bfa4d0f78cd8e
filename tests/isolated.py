"""A cluster whose agent runs as root with its own defaults (a uid per machine, the sandbox
where the host can), kept under /var/tmp mode 0711: not under pytest's base (0700, root's),
since each machine's uid must reach its directory, as under `souq dev`'s /var/lib/souq/dev."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from souq.drivers import rootfs, sandbox
from souq.model.machine import Machine, MachineState
from souq.network import links
from souq.testing import Cluster, wait_until

APP = "iso"
PYTHON = "/usr/bin/python3"  # the host's, which a machine's own uid can run

# What a test of the private network needs of the host (a module's ``pytestmark``): a root
# agent, the sandbox, the network's tools and a Python for the machines' programs.
PRIVATE_NETWORK = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a private network needs a root agent"),
    pytest.mark.skipif(not sandbox.available(), reason=f"{sandbox.unavailable()}"),
    pytest.mark.skipif(links.unavailable() is not None, reason=f"{links.unavailable()}"),
    pytest.mark.skipif(not os.access(PYTHON, os.X_OK), reason=f"no {PYTHON}"),
]


@contextmanager
def machines_root(prefix: str) -> Iterator[Path]:
    """A directory under /var/tmp, mode 0711 (each machine's uid reaches its own directory),
    removed afterwards with whatever its agents left mounted in it taken down first (an agent
    that leaves its machines be keeps their volumes and roots mounted)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    root.chmod(0o711)
    try:
        yield root
    finally:
        rootfs.unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def isolated_cluster(prefix: str) -> Iterator[Cluster]:
    with machines_root(prefix) as root, Cluster(root, regions={}) as c:
        c.add_agent("mad", machine_user=None, default_driver=None)
        c.wait_for_workers()
        yield c


@contextmanager
def private_network_cluster(root: Path, flycast_port: int | None = None) -> Iterator[Cluster]:
    """A cluster of one root agent in ``mad`` with its private network on (its machines left
    running when it stops, as a restart would), the worker's rules taken down afterwards."""
    extra = ["--private-network", "on"]
    extra += ["--flycast-port", str(flycast_port)] if flycast_port is not None else []
    with Cluster(root, regions={}) as c:
        c.add_agent(
            "mad",
            machine_user=None,
            default_driver=None,
            stop_machines_on_exit=False,
            extra_args=extra,
        )
        c.wait_for_workers()
        yield c
        worker = c.agents[0].worker_id or ""
    port = links.FLYCAST_PORT if flycast_port is None else flycast_port
    links.WorkerNetwork(worker, root / "unused", flycast_port=port).stop_rules()


def private_network_fixtures(prefix: str, flycast_port: int | None = None) -> tuple[Any, Any]:
    """A module's ``root`` and ``cluster`` fixtures: a machines root named ``prefix`` and a
    :func:`private_network_cluster` on it (``root, cluster = private_network_fixtures(...)``)."""

    @pytest.fixture(scope="module")
    def root() -> Iterator[Path]:
        with machines_root(prefix) as path:
            yield path

    @pytest.fixture(scope="module")
    def cluster(root: Path) -> Iterator[Cluster]:
        with private_network_cluster(root, flycast_port) as c:
            yield c

    return root, cluster


def busybox_tree(files: Path, applets: Iterable[str]) -> Path:
    """A whole root file system of busybox alone at ``files``: /bin/busybox with ``applets``
    linked to it, and empty /etc, /proc, /dev and /tmp."""
    for d in ("bin", "etc", "proc", "dev", "tmp"):
        (files / d).mkdir(parents=True)
    shutil.copy(shutil.which("busybox") or "", files / "bin" / "busybox")
    for applet in applets:
        (files / "bin" / applet).symlink_to("busybox")
    return files


def started(cluster: Cluster, config: dict[str, object], app: str = APP) -> Machine:
    with cluster.client() as client:
        machine = client.create_machine(app, "mad", config)
        return client.wait(app, machine.id, MachineState.STARTED, timeout=60)


def output(cluster: Cluster, machine: Machine, contains: str, app: str = APP) -> str:
    last = [""]

    def seen() -> str | None:
        with cluster.client() as client:
            last[0] = client.logs(app, machine.id)
        return last[0] if contains in last[0] else None

    try:
        return wait_until(seen, timeout=30, message=f"{contains!r} in the machine's output")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; it printed: {last[0]!r}") from exc


def processes_of(machine_id: str) -> list[int]:
    """Host pids of the processes whose environment names the machine (its command; bwrap
    itself, which the agent watches, has it too)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if f"SOUQ_MACHINE_ID={machine_id}".encode() in environ.split(b"\0"):
            found.append(int(entry))
    return found


def destroy(cluster: Cluster, *machines: Machine, app: str = APP) -> None:
    with cluster.client() as client:
        for machine in machines:
            client.destroy(app, machine.id, force=True)
