"""Images in a real OCI registry (Debian's docker-registry, the CNCF distribution server) on a
loopback port: `souq image pull` into the cluster's store, and machines whose workers pull the
image from the registry themselves. skopeo pushes the images there first. `make test` installs
both as root; without them these tests skip."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from souq.errors import SouqError
from souq.images import Image, pack_directory
from souq.model.machine import MachineState
from souq.natsserver import free_port
from souq.testing import Cluster, auth_headers, wait_until
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq
from tests.integration.registry_harness import push_image, serve_registry

pytestmark = pytest.mark.skipif(
    shutil.which("docker-registry") is None or shutil.which("skopeo") is None,
    reason="docker-registry and skopeo are not installed (`make test` installs them as root)",
)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_registry(tmp_path_factory.mktemp("registry")) as url:
        yield url


CLUSTER = ClusterSpec("pull", regions={"mad": 1})


def test_pull_by_tag_and_by_digest_keeps_the_reference(
    registry: str, cluster: Cluster, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "app.py").write_text("print('from the registry')\n")
    image = pack_directory(src, cmd=["python3", "app.py"])
    push_image(image, tmp_path / "layout", f"{registry}/team/web:v1")

    run = souq(cluster, "image", "pull", f"{registry}/team/web:v1", "--name", "web", "--json")
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert record["reference"] == image.reference
    assert record["run"]["cmd"] == ["python3", "app.py"]

    by_digest = souq(cluster, "image", "pull", f"{registry}/team/web@{image.reference}")
    assert by_digest.returncode == 0, by_digest.stderr
    assert by_digest.stdout.strip() == image.reference
    listed = httpx.get(
        f"{cluster.api_url}/v1/images/web", timeout=10, headers=auth_headers()
    ).json()
    assert listed["reference"] == image.reference


def test_a_pull_from_a_mirror_keeps_the_upstream_name(
    registry: str, cluster: Cluster, tmp_path: Path
) -> None:
    """A local mirror's copy of Docker Hub's busybox, pulled under Docker Hub's name: a create
    naming it as a Fly client does runs it from the store, not from the mirror or the Hub."""
    image = _greeting(tmp_path, "from the mirror")
    push_image(image, tmp_path / "layout", f"{registry}/library/busybox:mirrored")
    run = souq(
        cluster, "image", "pull", f"{registry}/library/busybox:mirrored",
        "--name", "docker.io/library/busybox:mirrored",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == image.reference
    with cluster.client() as client:
        machine = client.create_machine(
            "mirror",
            "mad",
            {"image": "registry-1.docker.io/library/busybox:mirrored", "restart": {"policy": "no"}},
        )
        done = client.wait("mirror", machine.id, MachineState.STOPPED, timeout=60)
        assert "from the mirror" in client.logs("mirror", machine.id)
        assert client.image("busybox:mirrored").reference == image.reference
    assert done.placement is not None and done.placement.image is not None
    assert done.placement.image.reference == image.reference
    assert done.placement.image.source is None  # the cluster's store


def test_an_unknown_tag_or_registry_is_a_clear_error(registry: str, cluster: Cluster) -> None:
    run = souq(cluster, "image", "pull", f"{registry}/team/web:nope")
    assert run.returncode != 0
    assert "the registry has no manifest 'nope'" in run.stderr
    port = free_port()
    run = souq(cluster, "image", "pull", f"127.0.0.1:{port}/web:v1")
    assert run.returncode != 0
    assert "cannot reach the registry" in run.stderr


def _greeting(tmp_path: Path, greeting: str) -> Image:
    src = tmp_path / "src-greeting"
    src.mkdir()
    (src / "greeting.txt").write_text(greeting + "\n")
    return pack_directory(src, cmd=["cat", "greeting.txt"])


def test_a_machine_runs_an_image_its_worker_pulls_from_the_registry(
    registry: str, cluster: Cluster, tmp_path: Path
) -> None:
    named = f"{registry}/team/direct:v2"
    image = _greeting(tmp_path, "pulled by the worker")
    push_image(image, tmp_path / "layout", named)
    reference = image.reference
    with cluster.client() as client:
        machine = client.create_machine(
            "direct", "mad", {"image": named, "restart": {"policy": "no"}}
        )
        done = client.wait("direct", machine.id, MachineState.STOPPED, timeout=60)
        assert "pulled by the worker" in client.logs("direct", machine.id)
        # The worker pulled it from the registry: the cluster's store never held it.
        with pytest.raises(SouqError) as caught:
            client.image(reference)
        assert caught.value.status == "image_not_found"
    assert done.placement is not None and done.placement.image is not None
    assert done.placement.image.reference == reference
    assert done.placement.image.source == f"http://{registry}/team/direct@{reference}"
    assert done.placement.image.bytes_pulled == done.placement.image.bytes_to_pull > 0
    # An unknown tag is refused before any capacity is claimed.
    with cluster.client() as client, pytest.raises(SouqError) as caught:
        client.create_machine("direct", "mad", {"image": f"{registry}/team/direct:nope"})
    assert caught.value.status == "image_not_found"


class _HeldBlobs:
    """A pass-through in front of the real registry that holds the requests for one blob until
    :attr:`release` is set: a layer's pull that takes as long as the test wants."""

    def __init__(self, upstream: str, digest: str) -> None:
        self.release = threading.Event()
        self.asked = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path.endswith("/blobs/" + digest):
                    outer.asked.set()
                    outer.release.wait(60)
                r = httpx.get(f"http://{upstream}{self.path}", headers=dict(self.headers))
                self.send_response(r.status_code)
                for name in ("content-type", "docker-content-digest"):
                    if name in r.headers:
                        self.send_header(name, r.headers[name])
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


def test_a_stop_calls_off_a_start_that_waits_for_its_image(
    registry: str, cluster: Cluster, tmp_path: Path
) -> None:
    image = _greeting(tmp_path, "never shown")
    push_image(image, tmp_path / "layout", f"{registry}/team/slow:v1")
    held = _HeldBlobs(registry, image.layers[0].digest)
    try:
        with cluster.client() as client:
            machine = client.create_machine(
                "slow", "mad", {"image": f"{held.address}/team/slow:v1"}
            )
            assert machine.state is MachineState.STARTING  # waiting for its image
            assert held.asked.wait(30)
            stopped = client.stop("slow", machine.id)
            assert stopped.state is MachineState.STOPPED
            held.release.set()  # the pull ends; the machine does not start
            wait_until(
                lambda: image.reference in client.workers()[0].images,
                timeout=30,
                message="the pull to end in the cache",
            )
            after = client.get_machine("slow", machine.id)
            assert after.state is MachineState.STOPPED and after.pid is None
            started = client.start("slow", machine.id)  # now it starts, from the cache
            client.wait("slow", started.id, MachineState.STOPPED, timeout=30)
            assert "never shown" in client.logs("slow", machine.id)
    finally:
        held.close()
