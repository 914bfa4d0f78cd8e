"""Under `souq dev`, an agent is given its own credential, not the cluster's auth directory: a
worker taken over holds no token key, no admin token, no other daemon's nkey."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import nats
import nats.errors
import psutil
import pytest

from souq.auth.bus import credential
from souq.auth.files import AuthDir
from souq.natsserver import free_port
from souq.testing import wait_until


def _auth_dirs(dev: subprocess.Popen[bytes]) -> dict[str, Path]:
    """The ``--auth-dir`` of each `souq agent` that `souq dev` runs, by worker id."""
    found: dict[str, Path] = {}
    for proc in psutil.Process(dev.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = proc.cmdline()
            if "agent" in cmd and "--auth-dir" in cmd and "--worker-id" in cmd:
                found[cmd[cmd.index("--worker-id") + 1]] = Path(cmd[cmd.index("--auth-dir") + 1])
    return found


def test_each_agent_is_given_only_its_own_credential(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    port, nats_port, proxy_port = free_port(), free_port(), free_port()
    data = Path(tempfile.mkdtemp(prefix="souq-dev-tenancy-", dir="/tmp"))
    data.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(data, ignore_errors=True))
    out = tmp_path / "dev.out"
    with open(out, "wb") as sink:
        dev = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "souq",
                "dev",
                "--port",
                str(port),
                "--nats-port",
                str(nats_port),
                "--proxy-port",
                str(proxy_port),
                "--regions",
                "mad",
                "--workers-per-region",
                "2",
                "--data-dir",
                str(data),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_until(
            lambda: f"NATS: nats://127.0.0.1:{nats_port}" in out.read_text(),
            timeout=60,
            message="the ready banner",
        )
        dirs = wait_until(
            lambda: (d := _auth_dirs(dev)) and len(d) == 2 and d, message="both agents"
        )
        cluster = AuthDir(data)
        for worker_id, path in dirs.items():
            held = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
            assert held == [f"nats/agent-{worker_id}.nk", "secrets.key"], held
            assert path.stat().st_mode & 0o777 == 0o700
            assert not (path / "token.key").exists() and not (path / "admin.token").exists()
            # Its own seed, the one the cluster's nats.conf knows it by.
            own = credential(AuthDir(path), f"agent-{worker_id}")
            assert own.seed == credential(cluster, f"agent-{worker_id}").seed

            async def signs_in(options: dict[str, object]) -> None:
                nc = await nats.connect(f"nats://127.0.0.1:{nats_port}", **options)
                await nc.close()

            asyncio.run(signs_in(own.options()))
    finally:
        if dev.poll() is None:
            os.kill(dev.pid, signal.SIGTERM)
            try:
                dev.wait(timeout=60)
            except subprocess.TimeoutExpired:
                for proc in psutil.Process(dev.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        proc.kill()
                dev.kill()
                dev.wait()
