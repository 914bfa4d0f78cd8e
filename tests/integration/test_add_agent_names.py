"""A worker added with `souq cluster add-agent` answers ``.internal`` names with what that
command gave it alone: its host holds ``nats/agent-ID.nk`` and ``nats/names-ID.nk`` (and the
secrets key), never the ``view``'s seed, and its names read the cluster view as ``names-ID``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import dns.exception
import dns.message
import dns.query

from souq.auth.bus import worker_id_for
from souq.auth.files import AuthDir
from souq.natsserver import free_port
from souq.network.name_feed import private_address
from souq.testing import AgentProcess, Cluster, wait_until

CONFIG = {"cmd": ["sleep", "600"], "services": [{"internal_port": 8080}]}


def _addresses(where: tuple[str, int], name: str) -> set[str]:
    try:
        got = dns.query.udp(
            dns.message.make_query(name, "AAAA"), where[0], port=where[1], timeout=1
        )
    except dns.exception.Timeout:
        return set()
    return {rd.to_text() for rrset in got.answer for rd in rrset}


def test_an_added_agent_answers_names_with_its_own_credentials(tmp_path: Path) -> None:
    with Cluster(tmp_path / "c", regions={}) as cluster:
        assert cluster.auth is not None
        data_dir = cluster.root / "workers" / "added"
        worker = worker_id_for(data_dir)
        command = ["cluster", "add-agent", str(cluster.auth.path), "--name", worker]
        added = subprocess.run(
            [sys.executable, "-m", "souq", *command],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert added.stdout.strip() == worker
        assert f"names-{worker}.nk" in added.stderr and "reloaded" in added.stderr
        # The host gets what the command says to copy, and nothing else.
        host = AuthDir.create(tmp_path / "host")
        host.nats_dir.mkdir(mode=0o700, exist_ok=True)
        for seed in (f"agent-{worker}.nk", f"names-{worker}.nk"):
            shutil.copy2(cluster.auth.nats_dir / seed, host.nats_dir / seed)
        shutil.copy2(cluster.auth.secrets_key, host.secrets_key)
        assert not (host.nats_dir / "view.nk").exists()

        listen = ("127.0.0.1", free_port())
        agent = AgentProcess(
            region="mad",
            nats_url=cluster.nats.url,
            data_dir=data_dir,
            auth_dir=host.path,
            extra_args=["--advertise", "fdaa:0:0:7::1", "--dns", f"{listen[0]}:{listen[1]}"],
        )
        agent.start()
        cluster.agents.append(agent)
        cluster.wait_for_workers()
        client = cluster.client()
        app = "n" + uuid.uuid4().hex[:8]
        made = client.create_machine(app, "mad", CONFIG)
        want = private_address(client.wait(app, made.id, "started").private_ip)
        assert want is not None
        wait_until(
            lambda: _addresses(listen, f"{app}.internal") == {want},
            timeout=20,
            message="the app's name answered by the added agent",
        )
        log = agent.log_path.read_text()
        assert "holds no names credential" not in log
        client.stop(app, made.id)
        wait_until(
            lambda: _addresses(listen, f"{app}.internal") == set(),
            timeout=20,
            message="the stopped machine gone from the answer",
        )
