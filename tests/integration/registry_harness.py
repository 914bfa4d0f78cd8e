"""What the tests of registries share: Debian's docker-registry (the CNCF distribution server)
on a loopback port, and skopeo copying an OCI layout into it, as a user pushes an image."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx

from souq.images import Image, write_layout
from souq.natsserver import free_port
from souq.procs import terminate
from souq.testing import wait_until


@contextlib.contextmanager
def serve_registry(root: Path) -> Iterator[str]:
    """A registry storing under ``root`` while the block runs: its ``HOST:PORT``."""
    port = free_port()
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    with open(root / "registry.log", "wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
    try:
        url = f"127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"http://{url}/v2/", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, timeout=20, message="the registry to answer")
        yield url
    finally:
        terminate(proc)


def skopeo_push(layout: Path, target: str) -> None:
    """The OCI layout at ``layout`` into a registry as ``target`` (HOST:PORT/REPO:TAG)."""
    push = subprocess.run(
        ["skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}", f"docker://{target}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert push.returncode == 0, push.stderr


def push_image(image: Image, layout: Path, target: str) -> None:
    """``image`` written as an OCI layout at ``layout``, then pushed as ``target``."""
    write_layout(image, layout)
    skopeo_push(layout, target)
