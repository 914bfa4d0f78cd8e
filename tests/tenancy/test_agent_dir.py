"""What one agent is given of the cluster's auth directory (souq.auth.bus.agent_dir): its own
seed and the secrets key, and nothing more, even where an earlier Souq left more there."""

from __future__ import annotations

from pathlib import Path

from souq.auth.bus import add_agent, agent_dir, credential, init_bus
from souq.auth.files import AuthDir


def test_an_agents_directory_holds_its_own_seed_and_nothing_another_left(tmp_path: Path) -> None:
    cluster = AuthDir.create(tmp_path / "cluster")
    init_bus(cluster)
    worker = add_agent(cluster, "w0123456789ab")
    dest = tmp_path / "agent-auth" / "mad-1"
    (dest / "nats").mkdir(parents=True)
    stale = dest / "nats" / "view.nk"  # given by an earlier Souq beside the agent's own
    stale.write_text(credential(cluster, "view").seed + "\n")

    own = agent_dir(cluster, worker, dest)

    held = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert held == [f"nats/agent-{worker}.nk", "secrets.key"], held
    assert credential(own, f"agent-{worker}").seed == credential(cluster, f"agent-{worker}").seed
    assert dest.stat().st_mode & 0o777 == 0o700
