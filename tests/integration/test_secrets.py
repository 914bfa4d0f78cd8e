"""App secrets with real NATS (JetStream), a real broker and real agents: set, seen by a machine
in its env, listed by name only, kept sealed (not in the state file, the bucket, an answer or a
log), redacted from served logs, unset at the next start; a wrong key and a missing auth
directory give clear errors."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import nats
import pytest

from souq.auth.bus import add_agent, worker_id_for
from souq.errors import SouqError
from souq.model import MachineState
from souq.secrets.store import BUCKET
from souq.testing import AgentProcess, Cluster, wait_until
from tests.clusters import ClusterSpec

S = MachineState
APP = "vault"
VALUE = "s3cr3t-Value-4e1b9d77"  # what must never show
OTHER = "second-secret-0a9c"


CLUSTER = ClusterSpec("secrets", regions={"mad": 1})


def seen_file(cluster: Cluster, machine_id: str) -> Path:
    (agent,) = (a for a in cluster.agents if a.region == "mad")
    return agent.data_dir / "machines" / machine_id / "seen"


# What the machine saw, written where the test (not the API) reads it: `env` in its directory.
SHOW = ["sh", "-c", 'env > seen.tmp && mv seen.tmp seen; echo "pw=$DB_PASSWORD shared=$SHARED"; '
        "echo END; sleep 60"]  # fmt: skip


def env_seen(cluster: Cluster, machine_id: str) -> dict[str, str]:
    path = seen_file(cluster, machine_id)
    wait_until(path.exists, message="the machine to write its env")
    text = path.read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


async def _raw_bucket(cluster: Cluster) -> list[bytes]:
    nc = await nats.connect(cluster.nats.url, **cluster.nats_options("broker"))
    try:
        kv = await nc.jetstream().key_value(BUCKET)
        return [(await kv.get(k)).value or b"" for k in await kv.keys()]
    finally:
        await nc.close()


def test_set_list_inject_redact_unset(cluster: Cluster) -> None:
    client = cluster.client()
    kept = client.set_secrets(APP, {"DB_PASSWORD": VALUE, "SHARED": OTHER})
    assert [i.name for i in kept] == ["DB_PASSWORD", "SHARED"]
    listed = client.secrets(APP)
    assert [i.name for i in listed] == ["DB_PASSWORD", "SHARED"]
    assert all(len(i.digest) == 12 and i.set_at for i in listed)
    raw_list = httpx.get(
        f"{cluster.api_url}/v1/apps/{APP}/secrets",
        headers={"Authorization": f"Bearer {cluster.auth.admin()}"} if cluster.auth else {},
    ).text
    assert VALUE not in raw_list and OTHER not in raw_list

    m = client.create_machine(
        APP, "mad", {"cmd": SHOW, "env": {"SHARED": "from-config", "PLAIN": "yes"}}
    )
    env = env_seen(cluster, m.id)
    assert env["DB_PASSWORD"] == VALUE
    assert env["SHARED"] == OTHER  # a secret wins over config.env
    assert env["PLAIN"] == "yes"

    logs = wait_until(lambda: (t := client.logs(APP, m.id)) and "END" in t and t)
    assert "pw=[redacted] shared=[redacted]" in logs
    assert VALUE not in logs and OTHER not in logs

    # Names only, everywhere: the machine's record, lists, events; the state file; the bucket.
    answers = [
        client.get_machine(APP, m.id).model_dump_json(),
        *(x.model_dump_json() for x in client.list_machines(APP)),
        *(e.model_dump_json() for e in client.events(APP, m.id)),
        *(w.model_dump_json() for w in client.workers()),
    ]
    assert not any(VALUE in a or OTHER in a for a in answers)
    (agent,) = cluster.agents
    for name in ("state.db", "state.db-wal"):
        path = agent.data_dir / name
        if path.exists():
            assert VALUE.encode() not in path.read_bytes()
    sealed = asyncio.run(_raw_bucket(cluster))
    assert len(sealed) >= 2 and not any(VALUE.encode() in v or OTHER.encode() in v for v in sealed)
    for file in (cluster.root / "nats").rglob("*"):
        if file.is_file():
            assert VALUE.encode() not in file.read_bytes(), file

    # Unset: the running machine keeps it (and its logs stay redacted); the next start has not.
    client.unset_secret(APP, "DB_PASSWORD")
    assert [i.name for i in client.secrets(APP)] == ["SHARED"]
    assert VALUE not in client.logs(APP, m.id)
    seen_file(cluster, m.id).unlink()
    client.restart(APP, m.id)
    env = wait_until(
        lambda: "DB_PASSWORD" not in (e := env_seen(cluster, m.id)) and e,
        message="the restarted machine's env",
    )
    assert env["SHARED"] == OTHER
    client.destroy(APP, m.id, force=True)

    for log in (agent.log_path, *(b.log_path for b in cluster.brokers)):
        assert VALUE not in log.read_text(errors="replace"), log


def test_a_create_waits_for_the_secrets_version_and_a_retry_stays_one_request(
    cluster: Cluster,
) -> None:
    """A create names at least the secrets version its broker last wrote (so the machine has
    the secret just set); the retry of its Idempotency-Key after another secret was set is the
    same request, answered with the same machine, not an idempotency conflict."""
    client = cluster.client()
    app = "vault-versions"
    client.set_secrets(app, {"FIRST": "one-value"})
    headers = {"Idempotency-Key": "versions-1"}
    if cluster.auth:
        headers["Authorization"] = f"Bearer {cluster.auth.admin()}"
    body = {"region": "mad", "config": {"cmd": SHOW}}
    made = httpx.post(
        f"{cluster.api_url}/v1/apps/{app}/machines", json=body, headers=headers, timeout=60
    )
    assert made.status_code == 201, made.text
    assert env_seen(cluster, made.json()["id"])["FIRST"] == "one-value"
    client.set_secrets(app, {"SECOND": "two-value"})  # the broker's version moves on
    again = httpx.post(
        f"{cluster.api_url}/v1/apps/{app}/machines", json=body, headers=headers, timeout=60
    )
    assert again.status_code in (200, 201), again.text
    assert again.json()["id"] == made.json()["id"]
    ahead = httpx.post(
        f"{cluster.api_url}/v1/apps/{app}/machines",
        json={**body, "min_secrets_version": 10**9},  # a version no worker will read
        headers={k: v for k, v in headers.items() if k != "Idempotency-Key"},
        timeout=60,
    )
    # The worker would not take it before reading that far: the claim refused, saying so.
    assert ahead.status_code == 409 and "claim refused (unavailable)" in ahead.text, ahead.text
    assert client.list_machines(app) and len(client.list_machines(app)) == 1


def test_bad_names_and_unknown_secrets_are_refused(cluster: Cluster) -> None:
    client = cluster.client()
    for bad in ({"1ABC": "x"}, {"A-B": "x"}, {"SOUQ_APP": "x"}, {}, {"BIG": "x" * 70_000}):
        with pytest.raises(SouqError) as err:
            client.set_secrets(APP, bad)
        assert err.value.status == "invalid_input", bad
    with pytest.raises(SouqError) as missing:
        client.unset_secret(APP, "NEVER_SET")
    assert missing.value.status == "not_found"


def test_the_cli_sets_from_stdin_and_never_prints_a_value(cluster: Cluster) -> None:
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    souq = [sys.executable, "-m", "souq", "secrets"]
    done = subprocess.run(
        [*souq, "set", "--app", "cli", "TOKEN=-", "PLAIN=abc"],
        input=VALUE + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = subprocess.run(
        [*souq, "list", "--app", "cli", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert VALUE not in done.stdout + listed.stdout
    assert '"TOKEN"' in listed.stdout and '"PLAIN"' in listed.stdout
    client = cluster.client()
    m = client.create_machine("cli", "mad", {"cmd": ["sh", "-c", 'printf %s "$TOKEN" > seen']})
    wait_until(lambda: seen_file(cluster, m.id).exists() and seen_file(cluster, m.id).read_text())
    assert seen_file(cluster, m.id).read_text() == VALUE  # stdin's value, its newline dropped
    subprocess.run(
        [*souq, "unset", "--app", "cli", "TOKEN", "PLAIN"], env=env, timeout=60, check=True
    )
    assert client.secrets("cli") == []
    client.destroy("cli", m.id, force=True)


def test_an_agent_with_another_key_fails_the_machine_clearly(cluster: Cluster) -> None:
    assert cluster.auth is not None
    data_dir = cluster.root / "workers" / "syd-other"
    add_agent(cluster.auth, worker_id_for(data_dir))  # its credential on the bus
    other = cluster.root / "other-auth"  # the cluster's auth directory, another secrets.key
    shutil.copytree(cluster.auth.path, other)
    (other / "secrets.key").write_text(secrets.token_hex(32) + "\n")
    agent = AgentProcess(region="syd", nats_url=cluster.nats.url, data_dir=data_dir, auth_dir=other)
    agent.start()
    try:
        cluster.agents.append(agent)
        cluster.wait_for_workers()
        client = cluster.client()
        client.set_secrets("keyed", {"API_KEY": VALUE})
        m = client.create_machine("keyed", "syd", {"cmd": ["sleep", "60"]})
        failed = client.wait("keyed", m.id, S.FAILED, timeout=20)
        message = " ".join(e.message or "" for e in failed.events)
        assert "does not open with this secrets key" in message, message
        assert VALUE not in failed.model_dump_json()
        client.destroy("keyed", m.id, force=True)
    finally:
        cluster.agents.remove(agent)
        agent.stop()


def test_a_broker_without_an_auth_directory_says_what_is_missing(tmp_path: Path) -> None:
    """An open cluster (no auth directory anywhere): the secrets routes say what is missing."""
    saved = {k: os.environ.pop(k) for k in ("SOUQ_AUTH_DIR", "SOUQ_TOKEN") if k in os.environ}
    try:
        _ask_open_cluster(tmp_path)
    finally:
        os.environ.update(saved)


def _ask_open_cluster(tmp_path: Path) -> None:
    with Cluster(tmp_path / "open", regions={"mad": 0}, auth=False) as open_cluster:
        url = open_cluster.api_url
        answer = httpx.post(f"{url}/v1/apps/{APP}/secrets", json={"A": "b"}, headers={})
        assert answer.status_code == 503
        body = answer.json()
        assert body["status"] == "secrets_unavailable"
        assert "auth directory" in body["error"] and "--auth-dir" in body["hint"]
        assert httpx.get(f"{url}/v1/apps/{APP}/secrets").status_code == 503
