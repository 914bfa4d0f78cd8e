"""Deploys under traffic through a real `souq proxy`: neither a rolling deploy that succeeds, nor
one that fails and is rolled back, nor a blue-green deploy loses a request."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from souq.model.machine import MachineState
from souq.testing import Cluster, ProxyProcess, wait_until
from tests.clusters import ClusterSpec
from tests.integration.images_harness import souq
from tests.integration.services_harness import edge_proxy
from tests.integration.test_deploy import APP, SERVER, toml

CLUSTER = ClusterSpec("deploy-traffic", regions={"mad": 2}, cpus=4, memory_mb=2048)


@pytest.fixture(scope="module")
def proxy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with edge_proxy(cluster, tmp_path_factory) as p:
        yield p


class Traffic:
    """Requests through the proxy, one after another on each of a few threads, until stopped;
    every answer that is not a 200 (or no answer) is kept.

    Each thread sends one request every ``every_s`` at most (100 a second from three): closer
    together than any moment the app could be without a machine that serves (a machine's stop,
    start or update takes longer), without the thousands a second back-to-back requests cost the
    test, the proxy and the machines in CPU."""

    def __init__(self, proxy: ProxyProcess, threads: int = 3, every_s: float = 0.03) -> None:
        self._url = proxy.url
        self._every_s = every_s
        self._stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _run(self) -> None:
        headers = {"Host": f"{APP}.localhost"}
        with httpx.Client(base_url=self._url, headers=headers, timeout=15) as http:
            while not self._stop.wait(self._every_s):
                try:
                    r = http.get("/")
                    problem = None if r.status_code == 200 else f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    if problem is None:
                        self.ok += 1
                    else:
                        self.failures.append(problem)


def deploy(cluster: Cluster, source: Path, text: str) -> int:
    (source / "souq.toml").write_text(
        text.replace("[regions]\nmad = 2\nsyd = 1\n", "[regions]\nmad = 2\n")
    )
    return souq(cluster, "deploy", "--config", str(source / "souq.toml"), "--json").returncode


def test_rolling_deploys_lose_no_request(
    cluster: Cluster, proxy: ProxyProcess, tmp_path: Path
) -> None:
    (tmp_path / "server.py").write_text(SERVER)
    assert deploy(cluster, tmp_path, toml("one")) == 0
    with Traffic(proxy) as traffic:
        assert deploy(cluster, tmp_path, toml("two")) == 0
        assert deploy(cluster, tmp_path, toml("three", status=500, wait="2s")) != 0
        assert deploy(cluster, tmp_path, toml("green", strategy="bluegreen")) == 0
    assert traffic.failures == []
    assert traffic.ok > 0


def test_a_scale_under_traffic_only_adds_and_removes_machines(
    cluster: Cluster, proxy: ProxyProcess, tmp_path: Path
) -> None:
    (tmp_path / "server.py").write_text(SERVER)
    assert deploy(cluster, tmp_path, toml("scaled")) == 0

    def running() -> dict[str, str]:
        with cluster.client() as client:
            return {
                m.id: m.instance_id
                for m in client.list_machines(APP)
                if m.state is MachineState.STARTED
            }

    before = running()
    assert len(before) == 2
    with Traffic(proxy) as traffic:
        up = souq(cluster, "scale", "count", "3", "--app", APP, "--region", "mad", "--json")
        assert up.returncode == 0, up.stderr
        after = running()
        # The two that stay are the same processes (no update, no restart); one is new.
        assert len(after) == 3 and {m: after[m] for m in before} == before
        assert "to update" not in up.stdout
        # To the count it has: nothing changes, not even a release.
        with cluster.client() as client:
            versions = len(client.releases(APP))
        same = souq(cluster, "scale", "count", "3", "--app", APP, "--region", "mad")
        assert same.returncode == 0, same.stderr
        assert "nothing changed" in same.stdout
        assert running() == after
        with cluster.client() as client:
            assert len(client.releases(APP)) == versions
        # Down to one: two go (gracefully: out of rotation first); the one left is untouched.
        down = souq(cluster, "scale", "count", "1", "--app", APP, "--region", "mad")
        assert down.returncode == 0, down.stderr
        wait_until(lambda: len(running()) == 1, timeout=60, message="two machines gone")
        ((kept, instance),) = running().items()
        assert after[kept] == instance
    assert traffic.failures == []
    assert traffic.ok > 0
