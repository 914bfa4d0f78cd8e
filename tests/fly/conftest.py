"""One real cluster (NATS with JetStream, a broker, two agents in ``mad``) for the whole Fly
conformance suite, a flaps client pointed at it, and the decoder of its answers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec, running
from tests.fly.decode import GoDecoder
from tests.fly.flaps import Flaps, launch_input, machine_config, machine_init
from tests.integration.services_harness import app_name

__all__ = ["fly_error", "ok"]


# One cluster for the whole Fly suite (tests/conftest.py runs the package in one process).
FLY = ClusterSpec("fly", regions={"mad": 2}, cpus=16)


@pytest.fixture(scope="package")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    with running(FLY, request) as c:
        yield c


@pytest.fixture(scope="package")
def flaps(cluster: Cluster) -> Iterator[Flaps]:
    client = Flaps(cluster.api_url, cluster.auth.admin() if cluster.auth else "")
    yield client
    client.close()


@pytest.fixture(scope="package")
def go(tmp_path_factory: pytest.TempPathFactory) -> GoDecoder:
    return GoDecoder(tmp_path_factory.mktemp("go"))


@pytest.fixture
def go_only(go: GoDecoder) -> GoDecoder:
    """For a check that only Go's decoder can make."""
    if go.binary is None:
        pytest.skip(go.skip_reason)
    return go


@pytest.fixture
def app(flaps: Flaps) -> Iterator[str]:
    """A fresh app name; its machines destroyed afterwards, then its volumes (each once its
    machine has let go of it), so that their disk is free for the next test."""
    name = app_name("fly")
    yield name
    listed = flaps.list(name)
    for machine in listed.json() if listed.status_code == 200 else []:
        if machine["state"] not in ("destroyed", "destroying"):
            flaps.destroy(name, machine["id"], kill=True)
    volumes = flaps.get_all_volumes(name)
    for volume in volumes.json() if volumes.status_code == 200 else []:
        destroy_volume(flaps, name, volume["id"])


def destroy_volume(flaps: Flaps, app: str, volume_id: str) -> None:
    """``DeleteVolume``, retried while a machine that is going still holds the volume."""

    def destroyed() -> bool:
        return flaps.delete_volume(app, volume_id).status_code != 409

    wait_until(destroyed, timeout=30, interval=0.1, message=f"volume {volume_id} destroyed")


def ok(r: httpx.Response) -> httpx.Response:
    """flaps' test of success: any status up to 299 (above is a FlapsError)."""
    assert r.status_code <= 299, f"{r.request.method} {r.request.url}: {r.status_code} {r.text}"
    return r


def fly_error(go: GoDecoder, r: httpx.Response, http_status: int, code: str, *words: str) -> str:
    """An error answer as flaps reads it: the message of its FlapsError (``message``, else
    ``error``) and the status code ``GetErrorStatusCode`` gives; the message is returned."""
    assert r.status_code == http_status, f"{r.status_code} {r.text}"
    read = go.decode("flaps_error", r)
    message = read.get("message") or read.get("error")
    assert message, r.text
    assert go.decode("error_status", r).get("status") == code, r.text
    for word in words:
        assert word in message, message
    return str(message)


SLEEPER = machine_config(init=machine_init(exec=["sleep", "600"]))


@pytest.fixture
def started(flaps: Flaps, go: GoDecoder, app: str) -> Callable[..., dict[str, Any]]:
    """Launch a machine as flaps does (``Launch``, then ``Wait`` for ``started``); the
    machine as the client holds it."""

    def launch(config: Any = SLEEPER, **fields: Any) -> dict[str, Any]:
        r = ok(flaps.launch(app, launch_input(config=config, region="mad", **fields)))
        machine: dict[str, Any] = go.decode("machine", r)
        ok(flaps.wait(app, machine["id"], "started", timeout_s=60))
        return machine

    return launch
