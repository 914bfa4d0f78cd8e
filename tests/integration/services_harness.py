"""What the tests of services, the proxy and wake-ups share: a machine config that runs the echo
app (``echo_app.py``: it serves on ``PORT`` and says which machine answered) behind a service."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from souq.testing import Cluster, ProxyProcess

ECHO = str(Path(__file__).with_name("echo_app.py"))


def app_name(prefix: str = "a") -> str:
    return prefix + uuid.uuid4().hex[:10]


# Debian's interpreter, which a sandboxed machine sees wherever the checkout is: a sandbox's /tmp
# and /run are its own, so a checkout under /tmp (its venv, its scripts) is out of its sight.
HOST_PYTHON = "/usr/bin/python3"


def visible_echo() -> list[str]:
    """The echo app's command for a sandboxed machine: the app copied once under /var/tmp
    (readable by every machine's uid) and run by :data:`HOST_PYTHON`."""
    home = Path("/var/tmp") / f"souq-test-echo-{os.getuid()}"
    home.mkdir(mode=0o755, exist_ok=True)
    home.chmod(0o755)
    copy = home / "echo_app.py"
    text = Path(ECHO).read_text()
    if not copy.exists() or copy.read_text() != text:
        staged = home / f".echo_app.{os.getpid()}"
        staged.write_text(text)
        staged.chmod(0o644)
        staged.replace(copy)  # whole, for the other test processes reading it
    return [HOST_PYTHON, str(copy)]


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
