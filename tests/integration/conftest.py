from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from souq.images import Image
from souq.natsserver import NatsServer
from tests import rootfs_images

_PREBUILD = "from tests import rootfs_images; rootfs_images.debian_python_layout()"


def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    """Start building the Debian test image at once, beside the tests that run first, when a
    test of this run needs it (the fixture below takes the build's lock, so it waits for this
    build, or finds the image built). Under xdist the first worker starts it."""
    needs = any("debian_python_image" in getattr(i, "fixturenames", ()) for i in items)
    # Every xdist worker collects every test: the first one builds.
    first = os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"
    if needs and first and shutil.which("mmdebstrap") is not None:
        session.config.stash[_BUILDER] = subprocess.Popen(
            [sys.executable, "-c", _PREBUILD],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    builder = session.config.stash.get(_BUILDER, None)
    if builder is not None and builder.poll() is None:
        builder.terminate()  # a build cut short is swept by the next one
        builder.wait()


_BUILDER = pytest.StashKey[subprocess.Popen[bytes]]()


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    """A real nats-server for the tests of one module."""
    with NatsServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def debian_python_image() -> tuple[Image, Path]:
    """The Debian test image (tests/rootfs_images.py) and its OCI layout: built by mmdebstrap
    once, the first time a run asks, and kept for every later run of the same recipe."""
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap is missing (`make test` installs it as root)")
    return rootfs_images.debian_python_image()
