"""Volumes on a real cluster, driven as Fly's Go client drives them: a create with fly-go's
exact body, list, get, update, extend, snapshots and destroy in Fly's shapes; a machine that
mounts one lands on the volume's worker (the other rejected, and the record says why), reads
and writes files there, and the files outlive it; a second machine mounting an attached volume
is refused; a destroy of an attached volume is refused; the volume survives a kill -9 of its
agent and the agent's restart."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from souq.agent.volumes.disks import VolumeDisks
from souq.testing import AgentProcess, Cluster, wait_until
from tests.clusters import ClusterSpec
from tests.integration.services_harness import app_name, fly_client

VOLUME_DISKS_MISSING = "a volume's own filesystem needs root, loop devices and mkfs.ext4"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


CLUSTER = ClusterSpec("vols", regions={"mad": 2})


@pytest.fixture
def fly(cluster: Cluster) -> Iterator[httpx.Client]:
    with fly_client(cluster) as c:
        yield c


def create_body(name: str = "data", size_gb: int | None = 1) -> dict[str, Any]:
    """What fly-go's CreateVolumeRequest marshals to: every pointer sent, null when unset."""
    return {
        "name": name,
        "region": "mad",
        "size_gb": size_gb,
        "encrypted": None,
        "require_unique_zone": None,
        "unique_zone_app_wide": None,
        "snapshot_retention": None,
        "auto_backup_enabled": None,
        "fstype": None,
        "snapshot_id": None,
        "source_volume_id": None,
        "compute": None,
    }


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def assert_fly_volume(v: dict[str, Any]) -> None:
    """The JSON types Fly's Volume type decodes."""
    for key in ("id", "name", "state", "region", "zone", "host_dedication_id"):
        assert isinstance(v[key], str), key
    assert is_int(v["size_gb"]) and is_int(v["snapshot_retention"])
    assert isinstance(v["encrypted"], bool) and isinstance(v["auto_backup_enabled"], bool)
    for key in ("attached_machine_id", "attached_alloc_id"):
        assert v[key] is None or isinstance(v[key], str), key
    assert RFC3339.match(v["created_at"]), v["created_at"]
    assert v["id"].startswith("vol_")


def agent_of(cluster: Cluster, worker_id: str) -> AgentProcess:
    return next(a for a in cluster.agents if a.worker_id == worker_id)


def volume_dir(cluster: Cluster, volume: dict[str, Any]) -> Path:
    return agent_of(cluster, volume["worker_id"]).data_dir / "volumes" / volume["id"]


def written(path: Path) -> str | None:
    """What a machine wrote to `path`, or None while it is not there yet (a file exists from
    its open, before its write, so waiting on exists() races the writer)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def machine_body(volume: str | None, script: str, *, name: str | None = None) -> dict[str, Any]:
    mount: dict[str, Any] = {"path": "/data"}
    if volume is not None:
        mount["volume"] = volume
    if name is not None:
        mount["name"] = name
    return {
        "region": "mad",
        "config": {
            "init": {"cmd": ["python3", "-c", script]},
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 64},
            "mounts": [mount],
            "restart": {"policy": "no"},
        },
    }


WRITE = (
    "import os, time\n"
    "with open(os.path.join(os.environ['SOUQ_VOLUME_DATA'], 'hello.txt'), 'w') as f:\n"
    "    f.write('hello from ' + os.environ['SOUQ_MACHINE_ID'])\n"
    "with open(os.path.join(os.environ['HOME'], 'data', 'via-link.txt'), 'w') as f:\n"
    "    f.write('linked')\n"
    "time.sleep(600)\n"
)
COPY = (
    "import os, shutil, time\n"
    "d = os.environ['SOUQ_VOLUME_DATA']\n"
    "shutil.copy(os.path.join(d, 'hello.txt'), os.path.join(d, 'read-back.txt'))\n"
    "time.sleep(600)\n"
)


def test_a_volume_in_flys_shapes(fly: httpx.Client) -> None:
    app = app_name("v")
    r = fly.post(f"/apps/{app}/volumes", json=create_body())
    assert r.status_code == 200, r.text
    vol = r.json()
    assert_fly_volume(vol)
    assert vol["state"] == "created" and vol["size_gb"] == 1 and vol["name"] == "data"
    assert vol["attached_machine_id"] is None and vol["encrypted"] is False
    listed = fly.get(f"/apps/{app}/volumes").json()
    assert [v["id"] for v in listed] == [vol["id"]]
    got = fly.get(f"/apps/{app}/volumes/{vol['id']}").json()
    assert_fly_volume(got)
    assert got["used_mb"] == 0
    updated = fly.put(f"/apps/{app}/volumes/{vol['id']}", json={"snapshot_retention": 10})
    assert updated.status_code == 200, updated.text
    assert updated.json()["snapshot_retention"] == 10
    ext = fly.put(f"/apps/{app}/volumes/{vol['id']}/extend", json={"size_gb": 3})
    assert ext.status_code == 200, ext.text
    assert ext.json()["needs_restart"] is False and ext.json()["volume"]["size_gb"] == 3
    assert_fly_volume(ext.json()["volume"])
    smaller = fly.put(f"/apps/{app}/volumes/{vol['id']}/extend", json={"size_gb": 2})
    assert smaller.status_code == 422 and "size_gb" in smaller.json()["error"]
    snap = fly.post(f"/apps/{app}/volumes/{vol['id']}/snapshots")
    assert snap.status_code == 200, snap.text
    snaps = fly.get(f"/apps/{app}/volumes/{vol['id']}/snapshots").json()
    assert [s["id"] for s in snaps] == [snap.json()["id"]]
    assert is_int(snaps[0]["size"]) and snaps[0]["digest"].startswith("sha256:")
    gone = fly.delete(f"/apps/{app}/volumes/{vol['id']}")
    assert gone.status_code == 200, gone.text
    assert gone.json()["state"] == "destroyed"
    assert fly.get(f"/apps/{app}/volumes").json() == []
    # Another app sees nothing of it.
    other = fly.get(f"/apps/{app_name('o')}/volumes/{vol['id']}")
    assert other.status_code == 404 and other.json()["status"] == "not_found"


def test_refusals_name_the_field(fly: httpx.Client) -> None:
    app = app_name("r")
    for patch, words in (
        ({"encrypted": True}, "encrypted: not supported"),
        ({"snapshot_id": "vs_1"}, "snapshot_id: not supported"),
        ({"name": "Data-1"}, "lowercase letters, digits and underscores"),
        ({"fstype": "raw"}, "fstype"),
        ({"size_gb": 0}, "size_gb"),
    ):
        r = fly.post(f"/apps/{app}/volumes", json={**create_body(), **patch})
        assert r.status_code == 422, (patch, r.text)
        assert words in r.json()["error"], (patch, r.json())
    r = fly.get(f"/apps/{app}/volumes/vol_nonsense")
    assert r.status_code == 404 and r.json()["status"] == "not_found"
    assert "vol_nonsense not found: it is not a volume id" in r.json()["error"], r.json()
    huge = fly.post(f"/apps/{app}/volumes", json=create_body(size_gb=16_000))
    assert huge.status_code == 409 and huge.json()["status"] == "insufficient_capacity"


def test_a_machine_mounts_its_volume_on_the_volumes_worker(
    fly: httpx.Client, cluster: Cluster
) -> None:
    app = app_name("m")
    vol = fly.post(f"/apps/{app}/volumes", json=create_body()).json()
    home = volume_dir(cluster, vol)
    r = fly.post(f"/apps/{app}/machines", json=machine_body(vol["id"], WRITE))
    assert r.status_code == 201, r.text
    m = r.json()
    assert m["worker_id"] == vol["worker_id"]
    assert m["config"]["mounts"] == [{"volume": vol["id"], "path": "/data", "name": "data"}]
    # The other worker was asked and skipped, and the record says why.
    assert m["placement"]["rejections"] == {"volume_elsewhere": 1}, m["placement"]
    wait_until(
        lambda: written(home / "hello.txt") == f"hello from {m['id']}",
        timeout=30,
        message="the machine's file",
    )
    wait_until((home / "via-link.txt").exists, timeout=30, message="a file by the link")
    attached = fly.get(f"/apps/{app}/volumes/{vol['id']}").json()
    assert attached["attached_machine_id"] == m["id"]
    # A Fly client's read-modify-write sends the mount back as it read it: the volume stays.
    read = fly.get(f"/apps/{app}/machines/{m['id']}").json()
    config = {k: read["config"][k] for k in ("init", "guest", "mounts", "restart")}
    config["env"] = {"UPDATED": "1"}
    updated = fly.post(f"/apps/{app}/machines/{m['id']}", json={"config": config})
    assert updated.status_code == 200, updated.text
    assert fly.get(f"/apps/{app}/volumes/{vol['id']}").json()["attached_machine_id"] == m["id"]
    # One machine at a time; and an attached volume is not destroyed.
    second = fly.post(f"/apps/{app}/machines", json=machine_body(vol["id"], COPY))
    assert second.status_code == 409, second.text
    assert second.json()["status"] == "volume_attached" and m["id"] in second.json()["error"]
    refused = fly.delete(f"/apps/{app}/volumes/{vol['id']}")
    assert refused.status_code == 409 and refused.json()["status"] == "volume_attached"
    # A dry run explains the same.
    dry = fly.post(
        f"/apps/{app}/machines", params={"dry_run": "true"}, json=machine_body(vol["id"], COPY)
    )
    assert dry.status_code == 409 and dry.json()["status"] == "volume_attached"
    # The machine goes, its volume and files stay; a new machine mounts it by name.
    assert (
        fly.delete(f"/apps/{app}/machines/{m['id']}", params={"force": "true"}).status_code == 200
    )
    wait_until(
        lambda: fly.get(f"/apps/{app}/volumes/{vol['id']}").json()["attached_machine_id"] is None,
        timeout=30,
        message="the volume to be detached",
    )
    again = fly.post(f"/apps/{app}/machines", json=machine_body(None, COPY, name="data"))
    assert again.status_code == 201, again.text
    m2 = again.json()
    assert m2["worker_id"] == vol["worker_id"]
    assert m2["config"]["mounts"][0]["volume"] == vol["id"]
    wait_until(
        lambda: written(home / "read-back.txt") == f"hello from {m['id']}",
        timeout=30,
        message="the copy",
    )
    fly.delete(f"/apps/{app}/machines/{m2['id']}", params={"force": "true"})


def test_a_mount_of_an_unknown_volume_is_refused(fly: httpx.Client) -> None:
    app = app_name("u")
    r = fly.post(f"/apps/{app}/machines", json=machine_body(None, COPY, name="nothing"))
    assert r.status_code == 404 and "no volume named 'nothing'" in r.json()["error"]
    r = fly.post(f"/apps/{app}/machines", json=machine_body("vol_wnope_abc123", COPY))
    assert r.status_code in (404, 503), r.text


def test_unique_zones_spread_a_volumes_siblings(fly: httpx.Client) -> None:
    app = app_name("z")
    body = {**create_body("db"), "require_unique_zone": True}
    first = fly.post(f"/apps/{app}/volumes", json=body).json()
    second = fly.post(f"/apps/{app}/volumes", json=body)
    assert second.status_code == 200, second.text
    assert second.json()["worker_id"] != first["worker_id"]
    third = fly.post(f"/apps/{app}/volumes", json=body)
    assert third.status_code == 409 and "volume_zone_taken" in third.text
    for vol in (first, second.json()):
        fly.delete(f"/apps/{app}/volumes/{vol['id']}")


def test_a_volume_outlives_a_kill_of_its_agent(fly: httpx.Client, cluster: Cluster) -> None:
    app = app_name("k")
    vol = fly.post(f"/apps/{app}/volumes", json=create_body()).json()
    m = fly.post(f"/apps/{app}/machines", json=machine_body(vol["id"], WRITE)).json()
    home = volume_dir(cluster, vol)
    wait_until(
        lambda: written(home / "hello.txt") == f"hello from {m['id']}",
        timeout=30,
        message="the machine's file",
    )
    agent = agent_of(cluster, vol["worker_id"])
    agent.kill()
    agent.start()
    cluster.wait_for_workers()
    after = fly.get(f"/apps/{app}/volumes/{vol['id']}")
    assert after.status_code == 200, after.text
    assert after.json()["attached_machine_id"] == m["id"]
    assert after.json()["size_gb"] == 1
    assert (home / "hello.txt").read_text() == f"hello from {m['id']}"
    # Its disk is still counted: the worker's allocation includes the volume.
    workers = {w["id"]: w for w in fly.get("/workers").json()}
    assert workers[vol["worker_id"]]["allocated"]["disk_mb"] >= 1024
    fly.delete(f"/apps/{app}/machines/{m['id']}", params={"force": "true"})
    wait_until(
        lambda: fly.delete(f"/apps/{app}/volumes/{vol['id']}").status_code == 200,
        timeout=30,
        message="the volume destroyed once detached",
    )
    assert not home.exists()


def souq(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    return subprocess.run(
        [sys.executable, "-m", "souq", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_the_volume_commands(cluster: Cluster) -> None:
    app = app_name("c")
    made = souq(
        cluster, "volume", "create", "logs", "-a", app, "-r", "mad", "--size", "2", "--json"
    )
    assert made.returncode == 0, made.stderr
    vol = json.loads(made.stdout)
    assert vol["size_gb"] == 2 and vol["name"] == "logs"
    listed = souq(cluster, "volume", "list", "-a", app)
    assert listed.returncode == 0 and vol["id"] in listed.stdout and "2 GB" in listed.stdout
    shown = souq(cluster, "volume", "show", vol["id"], "-a", app)
    assert shown.returncode == 0 and "used" in shown.stdout and vol["worker_id"] in shown.stdout
    grown = souq(cluster, "volume", "extend", vol["id"], "-a", app, "--size", "3", "--json")
    assert grown.returncode == 0 and json.loads(grown.stdout)["size_gb"] == 3
    less = souq(cluster, "volume", "extend", vol["id"], "-a", app, "--size", "1")
    assert less.returncode == 1 and "size_gb" in less.stderr
    gone = souq(cluster, "volume", "destroy", vol["id"], "-a", app)
    assert gone.returncode == 0 and "destroyed" in gone.stdout


SLEEP = "import time\ntime.sleep(600)\n"


@pytest.mark.skipif(not VolumeDisks.available(), reason=VOLUME_DISKS_MISSING)
def test_a_volume_holds_its_size_and_no_more_until_extended(
    fly: httpx.Client, cluster: Cluster
) -> None:
    app = app_name("z")
    vol = fly.post(f"/apps/{app}/volumes", json=create_body(size_gb=1)).json()
    m = fly.post(f"/apps/{app}/machines", json=machine_body(vol["id"], SLEEP)).json()
    assert os.path.ismount(volume_dir(cluster, vol))  # a filesystem of its own

    def fill(megabytes: int) -> dict[str, Any]:
        name = f"data/f{megabytes}"  # its volume, as linked in its directory
        script = f"fallocate -l {megabytes}M {name} || {{ rm -f {name}; exit 1; }}"
        r = fly.post(f"/apps/{app}/machines/{m['id']}/exec", json={"cmd": f"sh -c '{script}'"})
        assert r.status_code == 200, r.text
        return dict(r.json())

    too_big = fill(1200)  # as the machine's own user, in its own context
    assert too_big["exit_code"] != 0 and "No space left" in too_big["stderr"], too_big
    assert fill(800)["exit_code"] == 0
    grown = fly.put(f"/apps/{app}/volumes/{vol['id']}/extend", json={"size_gb": 3})
    assert grown.status_code == 200, grown.text
    if grown.json()["needs_restart"]:  # the kernel cannot grow it mounted: at the next start
        assert fill(1200)["exit_code"] != 0
        path = f"/apps/{app}/machines/{m['id']}"
        restarted = fly.post(f"{path}/restart", params={"force_stop": "false"})
        assert restarted.status_code == 200, restarted.text
        r = fly.get(f"{path}/wait", params={"state": "started", "timeout": "60"})
        assert r.status_code == 200, r.text
    assert fill(1200)["exit_code"] == 0  # room now
    fly.delete(f"/apps/{app}/machines/{m['id']}", params={"kill": "true"})
    wait_until(
        lambda: fly.delete(f"/apps/{app}/volumes/{vol['id']}").status_code == 200,
        timeout=30,
        message="the volume destroyed once detached",
    )
    assert not volume_dir(cluster, vol).exists()
