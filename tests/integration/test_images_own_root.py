"""A machine of an image runs the image's own programs from the image's own root file system:
real images made here from Debian's packages (never fetched from a hub), pushed by skopeo to a
loopback registry (Debian's docker-registry), `souq image pull`ed through the CLI, and run under
the worker's default driver (the sandbox, on a root agent that keeps its own defaults) behind
the edge proxy. Every answer is read through the proxy, from the image's own server."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from souq.drivers import sandbox
from souq.images import Image
from souq.model.machine import Machine, MachineState
from souq.testing import Cluster, ProxyProcess, wait_until
from tests.clusters import isolated
from tests.integration.images_harness import souq
from tests.integration.registry_harness import push_image, serve_registry, skopeo_push
from tests.isolated import isolated_cluster, processes_of
from tests.rootfs_images import BUSYBOX_MARKER, DEBIAN_MARKER, busybox_image

BUSYBOX = shutil.which("busybox")
# Paths the host has and no image does: the checkout, and the interpreter running these tests.
HOST_ONLY = ("/work", str(Path(__file__).resolve().parents[2]), sys.executable)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="isolation needs a root agent"),
    pytest.mark.skipif(
        BUSYBOX is None, reason="busybox-static is missing (`make test` installs it)"
    ),
    pytest.mark.skipif(
        shutil.which("docker-registry") is None or shutil.which("skopeo") is None,
        reason="docker-registry and skopeo are missing (`make test` installs them as root)",
    ),
    pytest.mark.skipif(not sandbox.available(), reason=f"{sandbox.unavailable()}"),
]


CLUSTER = isolated("own-root")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_registry(tmp_path_factory.mktemp("registry")) as url:
        yield url


@pytest.fixture(scope="module")
def proxy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with ProxyProcess(
        nats_url=cluster.nats.url,
        log_path=tmp_path_factory.mktemp("proxy") / "proxy.log",
        extra_args=["--autostop-interval", "3600"],
    ) as p:
        yield p


def pull(cluster: Cluster, source: str, name: str) -> str:
    """``souq image pull SOURCE --name NAME``, as a user runs it: the image's reference."""
    run = souq(cluster, "image", "pull", source, "--name", name)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def serving(cluster: Cluster, app: str, image: str) -> Machine:
    """A machine of ``image`` with the image's own command, behind an HTTP service."""
    config = {
        "image": image,
        "guest": {"cpus": 0.1, "memory_mb": 128},
        "services": [{"internal_port": 8080, "autostop": "off"}],
    }
    with cluster.client() as client:
        machine = client.create_machine(app, "mad", config)
        return client.wait(app, machine.id, MachineState.STARTED, timeout=120)


def through(proxy: ProxyProcess, app: str, path: str = "/") -> httpx.Response:
    """The answer through the edge proxy, once the machine's server answers there."""
    last: list[httpx.Response | Exception] = []

    def answered() -> httpx.Response | None:
        try:
            r = httpx.get(proxy.url + path, headers={"Host": f"{app}.localhost"}, timeout=15)
        except httpx.HTTPError as exc:
            last[:] = [exc]
            return None
        last[:] = [r]
        return r if r.status_code == 200 else None

    try:
        found = wait_until(answered, timeout=60, message=f"{path} of {app} through the proxy")
    except TimeoutError as exc:
        seen = last[0] if last else None
        detail = f"{seen.status_code} {seen.text!r}" if isinstance(seen, httpx.Response) else seen
        raise AssertionError(f"{exc}; last: {detail}") from exc
    assert found is not None
    return found


def destroy(cluster: Cluster, app: str, machine: Machine) -> None:
    with cluster.client() as client:
        client.destroy(app, machine.id, force=True)


def test_a_busybox_image_serves_http_from_its_own_root(
    cluster: Cluster, registry: str, proxy: ProxyProcess, tmp_path: Path
) -> None:
    image = busybox_image(tmp_path / "rootfs", BUSYBOX or "")
    push_image(image, tmp_path / "layout", f"{registry}/souq-test/busybox-www:v1")
    reference = pull(cluster, f"{registry}/souq-test/busybox-www:v1", "busybox-www:v1")
    assert reference == image.reference
    app = "bbwww"
    machine = serving(cluster, app, "busybox-www:v1")
    try:
        assert machine.config.driver == "sandbox"  # the worker's default, and it says so
        assert machine.placement is not None and machine.placement.image is not None
        assert machine.placement.image.reference == reference
        page = through(proxy, app)
        assert BUSYBOX_MARKER in page.text  # the image's /www/index.html, by its httpd
        # Its CGI, run by the image's /bin/sh: the root it sees is the image's, nothing more.
        listing = through(proxy, app, "/cgi-bin/root?/www/index.html")
        names = set(listing.text.split())
        assert {"bin", "www", "done", "visible=/www/index.html"} <= names, listing.text
        # On the private network its /etc holds the worker's resolv.conf, and only that.
        private = machine.address is not None and bool(machine.address.private_ip)
        hidden = {"usr", "etc", "home", "root", "work", "var"} - ({"etc"} if private else set())
        assert not names & hidden, listing.text
        if private:
            seen = through(proxy, app, "/cgi-bin/root?/etc/resolv.conf").text
            assert "visible=/etc/resolv.conf" in seen, seen
            seen = through(proxy, app, "/cgi-bin/root?/etc/passwd").text
            assert "done" in seen and "visible=" not in seen, seen
        for path in HOST_ONLY:
            assert os.path.exists(path), path  # the probe is real: the host has it
            seen = through(proxy, app, f"/cgi-bin/root?{path}").text
            assert "done" in seen and "visible=" not in seen, (path, seen)
    finally:
        destroy(cluster, app, machine)


# The first run on a host builds the image (a minute or two from a Debian mirror), in its setup.
@pytest.mark.timeout(900)
def test_a_debian_image_serves_from_its_own_python3(
    cluster: Cluster,
    registry: str,
    proxy: ProxyProcess,
    debian_python_image: tuple[Image, Path],
) -> None:
    image, layout = debian_python_image
    skopeo_push(layout, f"{registry}/souq-test/debian-python:v1")
    reference = pull(cluster, f"{registry}/souq-test/debian-python:v1", "debian-python:v1")
    assert reference == image.reference
    app = "debpy"
    machine = serving(cluster, app, "debian-python:v1")
    try:
        assert machine.config.driver == "sandbox"
        answer = dict(
            line.split("=", 1) for line in through(proxy, app).text.splitlines() if "=" in line
        )
        assert answer["executable"] == "/usr/bin/python3", answer  # the image's, by its path
        assert answer["marker"] == DEBIAN_MARKER  # a file only the image has
        # The host's full standard library (http.server), its checkout and the interpreter
        # running these tests: all on the host, none where the machine runs.
        host_stdlib = f"/usr/lib/python{answer['version'].rsplit('.', 1)[0]}/http/server.py"
        probes = [*HOST_ONLY, *([host_stdlib] if os.path.exists(host_stdlib) else [])]
        for path in probes:
            assert os.path.exists(path), path  # the probe is real: the host has it
            seen = through(proxy, app, f"/?{path}").text
            assert "exists=False" in seen, (path, seen)
        # Seen from the host: the serving process runs an interpreter file of the image's root,
        # not the host's /usr/bin/python3 (another file), in a root that is not the host's.
        pids = wait_until(
            lambda: [p for p in processes_of(machine.id) if _runs_python(p)],
            timeout=10,
            message="the machine's python3 process",
        )
        assert not os.path.exists("/etc/souq-test-image")
        host_root = os.stat("/")
        for pid in pids:
            root = Path(f"/proc/{pid}/root")
            assert (root / "etc" / "souq-test-image").read_text().strip() == DEBIAN_MARKER
            assert (root.stat().st_dev, root.stat().st_ino) != (host_root.st_dev, host_root.st_ino)
            if os.path.exists("/usr/bin/python3"):
                host = os.stat("/usr/bin/python3")
                mine = os.stat(f"/proc/{pid}/exe")
                assert (mine.st_dev, mine.st_ino) != (host.st_dev, host.st_ino)
    finally:
        destroy(cluster, app, machine)


def _runs_python(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python3")
    except OSError:
        return False


def mounts_under(directory: Path) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split(" ")[4]
        if point.startswith(str(directory.resolve()) + "/"):
            points.append(point)
    return points


def test_an_agent_leaving_for_good_takes_its_machines_roots_out_of_the_mount_table(
    registry: str, tmp_path: Path
) -> None:
    """An agent that stops its machines on exit (``souq dev``, the tests) detaches their roots
    too: nothing of it stays in the host's mount table, which every later start pays for."""
    image = busybox_image(tmp_path / "rootfs", BUSYBOX or "")
    push_image(image, tmp_path / "layout", f"{registry}/souq-test/busybox-gone:v1")
    with isolated_cluster("souq-unmount-") as leaving:
        pull(leaving, f"{registry}/souq-test/busybox-gone:v1", "busybox-gone:v1")
        machine = serving(leaving, "bbgone", "busybox-gone:v1")
        data_dir = leaving.agents[0].data_dir
        assert any(machine.id in p for p in mounts_under(data_dir))  # its root is mounted
        agent = leaving.agents[0]
        code = agent.stop()
        assert (code, mounts_under(data_dir)) == (0, []), agent.log_tail()
