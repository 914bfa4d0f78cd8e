"""What the tests of several hosts read: the agents' own records, the broker's list."""

from __future__ import annotations

import os
import sqlite3
import uuid
from typing import Any

import httpx

from souq.multihost import Host, Hosts
from souq.testing import wait_until

SMALL = {"cpus": 0.05, "memory_mb": 16}


def agent_rows(host: Host, app: str | None = None) -> dict[str, tuple[str, int | None]]:
    """The agent's own record of its machines (of ``app``): id -> (state, pid), read-only from
    its state file."""
    path = host.agent.data_dir / "state.db"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute("SELECT id, app, state, pid FROM machines").fetchall()
    finally:
        db.close()
    return {mid: (state, pid) for mid, of, state, pid in rows if app in (None, of)}


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def create(
    http: httpx.Client, app: str, region: str, *, key: str | None = None, keyed: bool = True
) -> httpx.Response:
    """``POST`` a small machine, with ``key`` (else a new one) as its ``Idempotency-Key``
    (``keyed=False``: none at all)."""
    body = {"region": region, "config": {"cmd": ["sleep", "600"], "guest": SMALL}}
    headers = {"Idempotency-Key": key or uuid.uuid4().hex} if keyed else {}
    return http.post(f"/v1/apps/{app}/machines", json=body, headers=headers)


def created(http: httpx.Client, app: str, region: str) -> dict[str, Any]:
    r = create(http, app, region)
    assert r.status_code == 201, r.text
    machine: dict[str, Any] = r.json()
    return machine


def listed(http: httpx.Client, app: str) -> tuple[list[dict[str, Any]], str]:
    """The app's machines, and where the broker took them from (``view`` or ``workers``)."""
    r = http.get(f"/v1/apps/{app}/machines")
    assert r.status_code == 200, r.text
    return r.json(), r.headers.get("X-Souq-View", "")


def wait_view_complete(http: httpx.Client, timeout: float = 20.0) -> None:
    """Until lists come from the cluster view (every live worker synced with it)."""
    wait_until(
        lambda: listed(http, "probe")[1] == "view",
        timeout=timeout,
        interval=0.05,
        message="the cluster view to be complete",
    )


def truth(hosts: Hosts, app: str) -> dict[str, list[tuple[str, str]]]:
    """Every machine of ``app`` the agents hold (not destroyed): id -> [(worker, state)], one
    entry per agent that holds it (more than one would be a duplicate)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for host in hosts.hosts:
        for mid, (state, _) in agent_rows(host, app).items():
            if state != "destroyed":
                found.setdefault(mid, []).append((host.worker_id, state))
    return found


def converged(hosts: Hosts, http: httpx.Client, app: str) -> bool:
    """The broker lists every machine of ``app`` the agents hold exactly once, on the one
    worker that holds it, in the state that worker records, and nothing else."""
    machines, _ = listed(http, app)
    mine = {m["id"]: (m["worker_id"], m["state"]) for m in machines}
    held = truth(hosts, app)
    return (
        len(mine) == len(machines)
        and set(mine) == set(held)
        and all(held[mid] == [seen] for mid, seen in mine.items())
    )
