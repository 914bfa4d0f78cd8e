"""Creating a machine must not reveal the app's secrets to a token that may not read them, tried
as a hostile holder of a ``write`` token would, on a real cluster (NATS with JetStream and auth,
a broker, an agent).

Exec needs ``deploy`` because it sees the secrets; before this, a ``write`` token created a
machine that printed a secret in base64 (past the logs' redaction) for a ``read`` token to read.
Now a machine made, or last updated, by a token that may not read the app's secrets starts
without them, at that start and every later one, whoever starts it: ``skip_secrets`` is kept
in its record (Fly's field, which any token may also ask for)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import pytest

from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec

APP = "alpha"
SECRET = "alpha-db-pw-7c1e93"  # what the write token is after
LEAKED = base64.b64encode(SECRET.encode()).decode()


def _printing(mark: str) -> dict[str, Any]:
    """A machine that writes its env to ``seen-MARK`` in its directory and prints the secret
    in base64, as the attack did."""
    script = (
        f"env > seen.tmp && mv seen.tmp seen-{mark}; "
        'echo "leak=$(printf %s "$ALPHA_DB_PASSWORD" | base64)"; sleep 600'
    )
    return {"region": "mad", "config": {"cmd": ["sh", "-c", script]}}


def _app_secret_set(c: Cluster) -> None:
    with c.client() as admin:
        admin.set_secrets(APP, {"ALPHA_DB_PASSWORD": SECRET})


CLUSTER = ClusterSpec("machine-secrets", regions={"mad": 1}, ready=_app_secret_set)


@pytest.fixture(scope="module")
def tokens(cluster: Cluster) -> dict[str, str]:
    made = {}
    with cluster.client() as admin:
        for scope in ("read", "write", "deploy"):
            info = admin.create_token(app=APP, scope=scope, name=f"{APP} {scope}")
            assert info.token
            made[scope] = info.token
    return made


def _http(cluster: Cluster, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=cluster.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def _seen(cluster: Cluster, machine_id: str, mark: str) -> dict[str, str]:
    path = cluster.agents[0].data_dir / "machines" / machine_id / f"seen-{mark}"
    wait_until(path.exists, timeout=30, message=f"the machine to write seen-{mark}")
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _logs(cluster: Cluster, token: str, machine_id: str) -> str:
    with _http(cluster, token) as reader:

        def printed() -> str | None:
            r = reader.get(f"/v1/apps/{APP}/machines/{machine_id}/logs")
            return r.text if r.status_code == 200 and "leak=" in r.text else None

        return wait_until(printed, timeout=30, message="the machine's output")


def _create(cluster: Cluster, token: str, body: dict[str, Any]) -> dict[str, Any]:
    with _http(cluster, token) as http:
        r = http.post(f"/v1/apps/{APP}/machines", json=body)
    assert r.status_code == 201, r.text
    machine: dict[str, Any] = r.json()
    return machine


def test_a_write_tokens_machine_gets_no_secrets_at_any_start(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    # Asking for them does not help: without deploy there are none to give.
    machine = _create(cluster, tokens["write"], {**_printing("w1"), "skip_secrets": False})
    mid = machine["id"]
    shown = _logs(cluster, tokens["read"], mid)
    assert LEAKED not in shown and SECRET not in shown
    assert "ALPHA_DB_PASSWORD" not in _seen(cluster, mid, "w1")
    assert machine["skip_secrets"] is True
    # Started again by someone who may read the secrets (and by its restart policy): still
    # none, as the token that made it could.
    with cluster.client() as admin:
        path = Path(cluster.agents[0].data_dir / "machines" / mid / "seen-w1")
        path.unlink()
        admin.restart(APP, mid)
        again = admin.get_machine(APP, mid)
    assert again.skip_secrets is True
    assert "ALPHA_DB_PASSWORD" not in _seen(cluster, mid, "w1")


def test_a_deploy_tokens_machine_gets_them_until_a_write_token_updates_it(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    machine = _create(cluster, tokens["deploy"], _printing("d1"))
    mid = machine["id"]
    assert machine["skip_secrets"] is False
    assert _seen(cluster, mid, "d1")["ALPHA_DB_PASSWORD"] == SECRET  # the deployer's own program
    with _http(cluster, tokens["write"]) as writer:
        r = writer.post(f"/v1/apps/{APP}/machines/{mid}", json=_printing("w2"))
        assert r.status_code == 200, r.text
        assert r.json()["skip_secrets"] is True
    assert "ALPHA_DB_PASSWORD" not in _seen(cluster, mid, "w2")
    # A deploy token's update gives them back.
    with _http(cluster, tokens["deploy"]) as deployer:
        r = deployer.post(f"/v1/apps/{APP}/machines/{mid}", json=_printing("d2"))
        assert r.status_code == 200 and r.json()["skip_secrets"] is False, r.text
    assert _seen(cluster, mid, "d2")["ALPHA_DB_PASSWORD"] == SECRET


def test_a_write_tokens_batch_gets_no_secrets(cluster: Cluster, tokens: dict[str, str]) -> None:
    with _http(cluster, tokens["write"]) as writer:
        body = {"region": "mad", "count": 2, "config": _printing("b")["config"]}
        r = writer.post(f"/v1/apps/{APP}/machines/batch", json=body)
    assert r.status_code == 201, r.text
    machines = r.json()["machines"]
    for m in machines:
        assert LEAKED not in _logs(cluster, tokens["read"], m["id"])
        assert "ALPHA_DB_PASSWORD" not in _seen(cluster, m["id"], "b")
    assert [m["skip_secrets"] for m in machines] == [True, True]
