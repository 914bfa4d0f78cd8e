"""The volume calls of flaps (``flaps_volumes.go``): ``GetAllVolumes`` and ``GetVolumes``,
``CreateVolume``, ``GetVolume``, ``UpdateVolume``, ``DeleteVolume``, ``ExtendVolume``,
``GetVolumeSnapshots``, ``CreateVolumeSnapshot``, read into fly-go's ``Volume``,
``ExtendVolumeResponse`` and ``VolumeSnapshot``; and a machine that mounts a volume
(``config.mounts``), by id and by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from souq.model.volume import MAX_SIZE_GB, MOUNT_UNSUPPORTED
from souq.testing import wait_until
from tests.fly.conftest import fly_error, ok
from tests.fly.decode import SHAPES, GoDecoder, in_go_order
from tests.fly.flaps import (
    Flaps,
    create_volume_request,
    launch_input,
    machine_config,
    machine_guest,
    machine_init,
    machine_mount,
    update_volume_request,
)

# flaps.destroyedVolumeStates: what GetVolumes drops of GetAllVolumes' answer.
DESTROYED_STATES = {
    "scheduling_destroy",
    "fork_cleanup",
    "waiting_for_detach",
    "pending_destroy",
    "destroying",
}
GIB = 1024**3

Volume = Callable[..., dict[str, Any]]


def path_of(r: Any) -> str:
    return str(r.request.url.raw_path.decode())


@pytest.fixture
def volume(flaps: Flaps, go: GoDecoder, app: str) -> Volume:
    """``CreateVolume`` of a volume in ``mad`` (1 GB unless told), as the client holds it."""

    def create(name: str = "data", size_gb: int = 1, **fields: Any) -> dict[str, Any]:
        body = create_volume_request(name=name, region="mad", size_gb=size_gb, **fields)
        made: dict[str, Any] = go.decode("volume", ok(flaps.create_volume(app, body)))
        return made

    return create


def test_create_volume(flaps: Flaps, go: GoDecoder, app: str) -> None:
    r = ok(flaps.create_volume(app, create_volume_request(name="data", region="mad", size_gb=3)))
    assert (r.request.method, path_of(r)) == ("POST", f"/v1/apps/{app}/volumes")
    assert r.request.content == (
        b'{"name":"data","region":"mad","size_gb":3,"encrypted":null,'
        b'"require_unique_zone":null,"unique_zone_app_wide":null,"snapshot_retention":null,'
        b'"auto_backup_enabled":null,"fstype":null,"snapshot_id":null,'
        b'"source_volume_id":null,"compute":null}'
    )
    v = go.decode("volume", r)
    assert v["id"].startswith("vol_") and v["name"] == "data" and v["state"] == "created"
    assert (v["region"], v["size_gb"], v["snapshot_retention"]) == ("mad", 3, 5)
    assert v["zone"] and v["encrypted"] is False and v["auto_backup_enabled"] is False
    assert v["attached_machine_id"] is None and v["attached_alloc_id"] is None  # !IsAttached()
    assert v["host_status"] == "ok"
    # The other settings Souq honours (encrypted: false, as `--no-encryption` sends); no size:
    # Souq's default, 1 GB.
    flyctl = create_volume_request(
        name="data",
        region="mad",
        encrypted=False,
        require_unique_zone=True,
        snapshot_retention=7,
        fstype="ext4",
    )
    other = go.decode("volume", ok(flaps.create_volume(app, flyctl)))
    assert (other["size_gb"], other["snapshot_retention"]) == (1, 7)
    assert other["zone"] != v["zone"]  # require_unique_zone: the other worker
    # What Souq cannot honour, set, is refused naming the field.
    for field, value in (
        ("encrypted", True),
        ("auto_backup_enabled", True),
        ("fstype", "raw"),
        ("snapshot_id", "vs_1"),
        ("source_volume_id", v["id"]),
        ("compute", machine_guest(cpus=1, memory_mb=256)),
        ("compute_image", "nginx"),
    ):
        refused = create_volume_request(name="data", region="mad", **{field: value})
        fly_error(go, flaps.create_volume(app, refused), 422, "invalid_input", field)
    # No worker with the disk: the code flaps knows.
    huge = create_volume_request(name="data", region="mad", size_gb=MAX_SIZE_GB)
    fly_error(go, flaps.create_volume(app, huge), 409, "insufficient_capacity")


def test_get_all_volumes_and_get_volumes(
    flaps: Flaps, go: GoDecoder, app: str, volume: Volume
) -> None:
    r = ok(flaps.get_all_volumes(app))
    assert (r.request.method, path_of(r)) == ("GET", f"/v1/apps/{app}/volumes")
    assert not r.request.content
    assert go.decode("volumes", r) == []
    first, second = volume("data"), volume("logs")
    listed = go.decode("volumes", ok(flaps.get_all_volumes(app)))
    assert [v["id"] for v in listed] == [first["id"], second["id"]]
    assert listed[0] == first
    ok(flaps.delete_volume(app, first["id"]))
    listed = go.decode("volumes", ok(flaps.get_all_volumes(app)))
    kept = [v for v in listed if v["state"] not in DESTROYED_STATES]  # GetVolumes
    assert [v["id"] for v in listed] == [v["id"] for v in kept] == [second["id"]]


def test_get_volume(flaps: Flaps, go: GoDecoder, app: str, volume: Volume) -> None:
    made = volume()
    r = ok(flaps.get_volume(app, made["id"]))
    assert (r.request.method, path_of(r)) == ("GET", f"/v1/apps/{app}/volumes/{made['id']}")
    assert go.decode("volume", r) == made
    assert r.json()["used_mb"] == 0  # Souq's own field beside Fly's
    fly_error(go, flaps.get_volume(app, "vol_nonsense"), 404, "not_found")
    fly_error(go, flaps.get_volume(app + "-other", made["id"]), 404, "not_found")


def test_update_volume(flaps: Flaps, go: GoDecoder, app: str, volume: Volume) -> None:
    made = volume()
    r = ok(flaps.update_volume(app, made["id"], update_volume_request(snapshot_retention=10)))
    assert (r.request.method, path_of(r)) == ("PUT", f"/v1/apps/{app}/volumes/{made['id']}")
    assert r.request.content == b'{"snapshot_retention":10,"auto_backup_enabled":null}'
    updated = go.decode("volume", r)
    assert updated["snapshot_retention"] == 10 and updated["id"] == made["id"]
    # Nothing set (both null) changes nothing; auto backups off is what a volume is.
    r = ok(flaps.update_volume(app, made["id"], update_volume_request()))
    assert r.request.content == b'{"snapshot_retention":null,"auto_backup_enabled":null}'
    assert go.decode("volume", r)["snapshot_retention"] == 10
    off = update_volume_request(auto_backup_enabled=False)
    assert go.decode("volume", ok(flaps.update_volume(app, made["id"], off)))["id"] == made["id"]
    on = update_volume_request(auto_backup_enabled=True)
    r = flaps.update_volume(app, made["id"], on)
    fly_error(go, r, 422, "invalid_input", "auto_backup_enabled")


def test_delete_volume(flaps: Flaps, go: GoDecoder, app: str, volume: Volume) -> None:
    made = volume()
    r = ok(flaps.delete_volume(app, made["id"]))
    assert (r.request.method, path_of(r)) == ("DELETE", f"/v1/apps/{app}/volumes/{made['id']}")
    assert not r.request.content
    gone = go.decode("volume", r)  # DeleteVolume decodes the answer: a Volume
    assert gone["id"] == made["id"] and gone["state"] == "destroyed"
    assert go.decode("volumes", ok(flaps.get_all_volumes(app))) == []


def test_extend_volume(flaps: Flaps, go: GoDecoder, app: str, volume: Volume) -> None:
    made = volume()
    r = ok(flaps.extend_volume(app, made["id"], 3))
    assert path_of(r) == f"/v1/apps/{app}/volumes/{made['id']}/extend"
    assert (r.request.method, r.request.content) == ("PUT", b'{"size_gb":3}')
    out = go.decode("volume_extend", r)
    assert out["needs_restart"] is False
    assert out["volume"]["id"] == made["id"] and out["volume"]["size_gb"] == 3
    assert go.decode("volume", ok(flaps.get_volume(app, made["id"])))["size_gb"] == 3
    # Volumes only grow.
    for size_gb in (3, 2):
        r = flaps.extend_volume(app, made["id"], size_gb)
        fly_error(go, r, 422, "invalid_input", "size_gb")


def test_create_volume_snapshot(flaps: Flaps, go: GoDecoder, app: str, volume: Volume) -> None:
    made = volume()
    r = ok(flaps.create_volume_snapshot(app, made["id"]))  # 2xx; flaps reads no body
    assert (r.request.method, path_of(r)) == (
        "POST",
        f"/v1/apps/{app}/volumes/{made['id']}/snapshots",
    )
    assert not r.request.content and "Content-Type" not in r.request.headers
    fly_error(go, flaps.create_volume_snapshot(app, "vol_nonsense"), 404, "not_found")


def test_get_volume_snapshots(flaps: Flaps, go: GoDecoder, app: str, volume: Volume) -> None:
    made = volume(size_gb=2, snapshot_retention=7)
    r = ok(flaps.get_volume_snapshots(app, made["id"]))
    assert (r.request.method, path_of(r)) == (
        "GET",
        f"/v1/apps/{app}/volumes/{made['id']}/snapshots",
    )
    assert go.decode("snapshots", r) == []
    ok(flaps.create_volume_snapshot(app, made["id"]))
    ok(flaps.create_volume_snapshot(app, made["id"]))
    snaps = go.decode("snapshots", ok(flaps.get_volume_snapshots(app, made["id"])))
    assert len(snaps) == 2 and snaps[0]["id"] != snaps[1]["id"]
    for s in snaps:
        assert s["size"] > 0 and s["volume_size"] == 2 * GIB
        assert s["digest"].startswith("sha256:") and s["status"] == "created"
        assert s["retention_days"] == 7 and s["created_at"]


def mounting(mount: Any) -> Any:
    config = machine_config(init=machine_init(exec=["sleep", "600"]), mounts=[mount])
    return launch_input(config=config, region="mad")


def test_launch_with_a_volume_mounted(
    flaps: Flaps, go: GoDecoder, app: str, volume: Volume
) -> None:
    made = volume()
    r = ok(flaps.launch(app, mounting(machine_mount(path="/data", volume=made["id"]))))
    assert b'"mounts":[{"path":"/data","volume":"' + made["id"].encode() + b'"}]' in (
        r.request.content or b""
    )
    m = go.decode("machine", r)
    assert m["config"]["mounts"] == [{"path": "/data", "volume": made["id"], "name": "data"}]
    assert r.json()["worker_id"] == made["zone"]  # Souq's field: on the volume's worker
    ok(flaps.wait(app, m["id"], "started", timeout_s=60))
    held = go.decode("volume", ok(flaps.get_volume(app, made["id"])))
    assert held["attached_machine_id"] == m["id"]  # IsAttached()
    # flyctl's read-modify-write sends the mount back as the client read it: the volume stays.
    config = in_go_order(m["config"], SHAPES["machine"]["config"])
    config["env"] = {"UPDATED": "1"}
    updated = go.decode("machine", ok(flaps.update(app, m["id"], launch_input(config=config))))
    assert updated["config"]["mounts"] == m["config"]["mounts"]
    ok(flaps.wait(app, m["id"], "started", version=updated["instance_id"]))
    held = go.decode("volume", ok(flaps.get_volume(app, made["id"])))
    assert held["attached_machine_id"] == m["id"]
    # One machine at a time; an attached volume is not destroyed.
    second = flaps.launch(app, mounting(machine_mount(path="/data", volume=made["id"])))
    fly_error(go, second, 409, "volume_attached", m["id"])
    fly_error(go, flaps.delete_volume(app, made["id"]), 409, "volume_attached", m["id"])
    # The machine goes; the volume is let go, and a machine mounting it by name gets it.
    ok(flaps.destroy(app, m["id"], kill=True))
    ok(flaps.wait(app, m["id"], "destroyed"))
    wait_until(
        lambda: (
            go.decode("volume", ok(flaps.get_volume(app, made["id"])))["attached_machine_id"]
            is None
        ),
        timeout=30,
        message="the volume let go",
    )
    r = ok(flaps.launch(app, mounting(machine_mount(path="/data", name="data"))))
    again = go.decode("machine", r)
    assert again["config"]["mounts"] == [{"path": "/data", "volume": made["id"], "name": "data"}]
    assert r.json()["worker_id"] == made["zone"]
    held = go.decode("volume", ok(flaps.get_volume(app, made["id"])))
    assert held["attached_machine_id"] == again["id"]


MOUNT_SET = {  # each as a Fly client sets it (auto-extension, an encrypted or sized mount)
    "encrypted": True,
    "size_gb": 1,
    "extend_threshold_percent": 80,
    "add_size_gb": 1,
    "size_gb_limit": 10,
}


def test_every_refused_mount_field_is_sent_here() -> None:
    assert sorted(MOUNT_SET) == sorted(MOUNT_UNSUPPORTED)


@pytest.mark.parametrize("field", sorted(MOUNT_SET))
def test_a_mount_field_souq_cannot_honour_is_refused_naming_it(
    flaps: Flaps, go: GoDecoder, app: str, volume: Volume, field: str
) -> None:
    made = volume()
    mount = machine_mount(path="/data", volume=made["id"], **{field: MOUNT_SET[field]})
    r = flaps.launch(app, mounting(mount))
    fly_error(go, r, 422, "invalid_input", field, "not supported by Souq")
