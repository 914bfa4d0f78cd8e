"""Deploys under traffic through a real `souq proxy`: neither a rolling deploy that succeeds, nor
one that fails and is rolled back, nor a blue-green deploy loses a request."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from souq.testing import Cluster, ProxyProcess
from tests.integration.images_harness import souq
from tests.integration.services_harness import edge_proxy
from tests.integration.test_deploy import APP, SERVER, toml


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("deploy-traffic")
    with Cluster(root, regions={"mad": 2}, cpus=4, memory_mb=2048) as c:
        yield c


@pytest.fixture(scope="module")
def proxy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with edge_proxy(cluster, tmp_path_factory) as p:
        yield p


class Traffic:
    """Requests through the proxy, one after another on each of a few threads, until stopped;
    every answer that is not a 200 (or no answer) is kept."""

    def __init__(self, proxy: ProxyProcess, threads: int = 3) -> None:
        self._url = proxy.url
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
            while not self._stop.is_set():
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
