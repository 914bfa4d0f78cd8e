"""What the tests of services, the proxy and wake-ups share: a machine config that runs the echo
app (``echo_app.py``: it serves on ``PORT`` and says which machine answered) behind a service."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import httpx
import pytest

from souq.testing import Cluster, ProxyProcess

ECHO = str(Path(__file__).with_name("echo_app.py"))


def app_name(prefix: str = "a") -> str:
    return prefix + uuid.uuid4().hex[:10]


def echo_config(**service: object) -> dict[str, object]:
    """The echo app with one HTTP service on internal port 8080 (``service``: its fields)."""
    return {
        "cmd": [sys.executable, ECHO],
        "guest": {"cpus": 0.1, "memory_mb": 64},
        "services": [{"internal_port": 8080, "autostop": "stop", **service}],
    }


def edge_proxy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> ProxyProcess:
    """A ``souq proxy`` on the cluster's bus that never stops idle machines by itself (the tests
    stop and suspend machines themselves); use it as a context manager."""
    return ProxyProcess(
        nats_url=cluster.nats.url,
        log_path=tmp_path_factory.mktemp("proxy") / "proxy.log",
        extra_args=["--autostop-interval", "3600"],
    )


def fly_client(cluster: Cluster, timeout: float = 60.0) -> httpx.Client:
    """An HTTP client of the cluster's first broker at ``/v1``, sending what Fly's Go client
    sends: its User-Agent and the (admin) token as ``Bearer``."""
    token = cluster.auth.admin() if cluster.auth else ""
    headers = {"User-Agent": "fly-go/0.0.0", "Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=cluster.api_url + "/v1", headers=headers, timeout=timeout)
