"""Volumes' pure parts: the state table, ids that name their worker, Fly's shapes and what is
refused naming the field, the placement stage that pins a mount to its volume's worker (and
spreads unique zones) with the reasons the record counts; and a worker's volume ledger on a
real state file: disk reserved and given back, one machine at a time, repaired at a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from souq.agent.capacity.admission import Admission
from souq.agent.machines.launch import volume_env
from souq.agent.state.store import Store
from souq.agent.volumes.worker_volumes import AgentVolumes
from souq.clock import VirtualClock
from souq.drivers.host import link_volumes
from souq.drivers.sandbox import Image, bwrap_argv, mount_points_to_open
from souq.errors import IllegalTransition, InsufficientCapacity, NotFound, VolumeAttached
from souq.model import MachineConfig, Offer, Resources, WorkerInfo
from souq.model.volume import (
    CreateVolumeRequest,
    MachineMount,
    Volume,
    VolumeCreateCommand,
    VolumeEvent,
    VolumeState,
    new_volume_id,
    transition,
    volume_worker,
)
from souq.placement import PlacementRequest, default_pipeline
from souq.placement.request import for_volume

FLY_CREATE = (
    '{"name":"data","region":"mad","size_gb":1,"encrypted":null,"require_unique_zone":null,'
    '"unique_zone_app_wide":null,"snapshot_retention":null,"auto_backup_enabled":null,'
    '"fstype":null,"snapshot_id":null,"source_volume_id":null,"compute":null}'
)


# -- the state table ---------------------------------------------------------------------------


def test_the_state_table() -> None:
    assert transition(VolumeState.CREATED, VolumeEvent.ATTACH) is VolumeState.CREATED
    assert transition(VolumeState.CREATED, VolumeEvent.DESTROY) is VolumeState.DESTROYING
    assert transition(VolumeState.DESTROYING, VolumeEvent.REMOVED) is VolumeState.DESTROYED
    assert (
        transition(VolumeState.DESTROYING, VolumeEvent.DESTROY) is VolumeState.DESTROYING
    )  # a retry after a crash
    for event in (VolumeEvent.ATTACH, VolumeEvent.EXTEND, VolumeEvent.DESTROY):
        with pytest.raises(IllegalTransition, match="vol_x is destroyed"):
            transition(VolumeState.DESTROYED, event, volume_id="vol_x")
    with pytest.raises(IllegalTransition):
        transition(VolumeState.DESTROYING, VolumeEvent.EXTEND)


def test_a_volume_id_names_its_worker() -> None:
    vid = new_volume_id("w0123456789ab")
    assert vid.startswith("vol_") and volume_worker(vid) == "w0123456789ab"
    assert volume_worker("vol_w_1_2_abc") == "w_1_2"
    for bad in ("vol_", "vol_abc", "v_w1_ab", "vol__ab", "nonsense"):
        assert volume_worker(bad) is None, bad


# -- shapes ------------------------------------------------------------------------------------


def test_flys_create_body_reads() -> None:
    body = CreateVolumeRequest.model_validate_json(FLY_CREATE)
    assert (body.name, body.region, body.size_gb) == ("data", "mad", 1)
    # Fly's false and null are "unset"; what Souq cannot honour names its field and why.
    assert CreateVolumeRequest.model_validate_json(
        FLY_CREATE.replace('"encrypted":null', '"encrypted":false')
    )
    for field, value in (("encrypted", "true"), ("auto_backup_enabled", "true"), ("compute", "{}")):
        text = FLY_CREATE.replace(f'"{field}":null', f'"{field}":{value}')
        if value == "{}":
            text = FLY_CREATE.replace('"compute":null', '"compute":{"cpus":1}')
        with pytest.raises(ValidationError, match=f"{field}: not supported by Souq"):
            CreateVolumeRequest.model_validate_json(text)


def test_a_volume_reads_as_fly_decodes_it() -> None:
    v = Volume(
        id="vol_w1_ab", name="data", size_gb=1, region="mad", created_at="2026-01-01T00:00:00.000Z"
    )
    data = v.model_dump(mode="json")
    assert data["attached_machine_id"] is None and data["attached_alloc_id"] is None
    assert isinstance(data["size_gb"], int) and data["encrypted"] is False
    assert data["state"] == "created" and data["host_status"] == "ok"


def test_a_mount() -> None:
    m = MachineMount.model_validate({"volume": "vol_w1_ab", "path": "/data/"})
    assert m.path == "/data"
    assert (
        MachineMount.model_validate({"name": "data", "path": "/d", "size_gb": None}).name == "data"
    )
    for bad, words in (
        ({"path": "/d"}, "give the volume's id"),
        ({"name": "x", "path": "d"}, "absolute path"),
        ({"name": "x", "path": "/"}, "absolute path"),
        ({"name": "x", "path": "/a/../b"}, "absolute path"),
        ({"name": "x", "path": "/d", "encrypted": True}, "encrypted: not supported"),
        ({"name": "x", "path": "/d", "size_gb_limit": 9}, "size_gb_limit: not supported"),
    ):
        with pytest.raises(ValidationError, match=words):
            MachineMount.model_validate(bad)


# -- placement ---------------------------------------------------------------------------------


def offer(worker_id: str, disk_mb: int = 10_240, used_mb: int = 0) -> Offer:
    return Offer(
        worker=WorkerInfo(
            id=worker_id,
            region="mad",
            capacity=Resources(cpus=4, memory_mb=4096, disk_mb=disk_mb),
            allocated=Resources(cpus=0, memory_mb=0, disk_mb=used_mb),
        ),
        eligible=True,
    )


def test_a_mount_is_placed_on_its_volumes_worker_only() -> None:
    request = PlacementRequest(
        request_id="r1",
        app="web",
        region="mad",
        resources=Resources(cpus=1, memory_mb=256),
        volume_worker="w2",
        volume_id="vol_w2_ab",
    )
    ranking = default_pipeline().rank(request, [offer("w1"), offer("w2"), offer("w3")])
    assert ranking.winner == "w2" and ranking.runner_up is None
    assert ranking.rejections == {"volume_elsewhere": 2}
    assert ranking.unmet == {"volume_elsewhere": ["worker w2 (volume vol_w2_ab)"]}
    skipped = [o for o in ranking.outcomes if o.rejected]
    assert all("vol_w2_ab" in (o.detail or "") for o in skipped)


def test_a_volume_is_placed_by_disk_and_away_from_its_siblings() -> None:
    request = for_volume("r1", "web", "mad", size_gb=2, avoid=frozenset({"w1"}))
    ranking = default_pipeline().rank(
        request, [offer("w1"), offer("w2", disk_mb=1024), offer("w3")]
    )
    assert ranking.winner == "w3"
    assert ranking.rejections == {"volume_zone_taken": 1, "insufficient_disk": 1}


# -- a worker's volumes ------------------------------------------------------------------------


@pytest.fixture
def volumes(tmp_path: Path) -> AgentVolumes:
    store = Store(tmp_path / "agent")
    admission = Admission(
        worker_id="w1", region="mad", capacity=Resources(cpus=4, memory_mb=4096, disk_mb=4096)
    )
    return AgentVolumes(
        store, tmp_path / "agent" / "volumes", admission, VirtualClock(), worker_id="w1"
    )


def create(volumes: AgentVolumes, size_gb: int = 1, request_id: str = "r1") -> Volume:
    return volumes.create(
        VolumeCreateCommand(
            app="web", region="mad", name="data", size_gb=size_gb, request_id=request_id
        )
    )


def mounting(volume_id: str) -> MachineConfig:
    return MachineConfig.model_validate(
        {"cmd": ["true"], "mounts": [{"volume": volume_id, "path": "/data"}]}
    )


def test_disk_is_reserved_from_create_to_destroy(volumes: AgentVolumes) -> None:
    admission = volumes._admission
    vol = create(volumes, 2)
    assert vol.worker_id == "w1" and volume_worker(vol.id) == "w1"
    assert create(volumes, 2).id == vol.id  # the same request: the same volume
    assert admission.reserved.disk_mb == 2048 and (volumes.root / vol.id).is_dir()
    with pytest.raises(InsufficientCapacity, match="cannot grow to 5 GB"):
        volumes.extend("web", vol.id, 5)
    assert volumes.extend("web", vol.id, 3).volume.size_gb == 3
    assert admission.reserved.disk_mb == 3072
    assert volumes.rows.get(vol.id) is not None
    assert volumes._admission.shortfall(Resources(cpus=0, memory_mb=0, disk_mb=2048), 0)
    gone = volumes.destroy("web", vol.id)
    assert gone.state is VolumeState.DESTROYED and admission.reserved.disk_mb == 0
    assert not (volumes.root / vol.id).exists()
    assert volumes.list_volumes("web") == []
    with pytest.raises(NotFound):
        volumes.get("other", vol.id)


def test_one_machine_at_a_time(volumes: AgentVolumes) -> None:
    vol = create(volumes)
    volumes.check_mounts("web", mounting(vol.id))
    volumes.attach("m1", mounting(vol.id))
    volumes.check_mounts("web", mounting(vol.id), "m1")  # its own: an update keeps it
    with pytest.raises(VolumeAttached, match="attached to machine m1"):
        volumes.check_mounts("web", mounting(vol.id), "m2")
    with pytest.raises(VolumeAttached):
        volumes.destroy("web", vol.id)
    with pytest.raises(NotFound):
        volumes.check_mounts("other", mounting(vol.id))
    volumes.detach("m1")
    assert volumes.get("web", vol.id).attached_machine_id is None
    ((host, path, name),) = volumes.host_mounts(mounting(vol.id))
    assert (Path(host).name, path, name) == (vol.id, "/data", "data")


def test_a_restart_counts_the_volumes_disk(tmp_path: Path, volumes: AgentVolumes) -> None:
    vol = create(volumes, 3)
    store = volumes.rows._store
    store.close()
    again = Store(tmp_path / "agent")
    assert again.allocated().disk_mb == 3 * 1024
    assert volume_worker(vol.id) == "w1"


# -- what a machine sees -----------------------------------------------------------------------


def test_a_sandbox_binds_its_volume_at_the_path_and_hides_the_others(tmp_path: Path) -> None:
    volume = tmp_path / "volumes" / "vol_w1_ab"
    argv = bwrap_argv(
        tmp_path / "machines" / "m1",
        network=True,
        machines_root=tmp_path / "machines",
        mounts=((str(volume), "/data"),),
    )
    hide = argv.index(str(tmp_path / "volumes"))
    bind = argv.index(str(volume))
    assert argv[hide - 1] == "--tmpfs" and argv[bind - 1 : bind + 2] == [
        "--bind",
        str(volume),
        "/data",
    ]
    assert hide < bind  # hidden first, then the machine's own bound over it


def test_a_plain_process_finds_its_volume_by_env_and_by_a_link(tmp_path: Path) -> None:
    volume = tmp_path / "volumes" / "vol_w1_ab"
    volume.mkdir(parents=True)
    home = tmp_path / "machines" / "m1"
    link_volumes(home, ((str(volume), "/var/data"),))
    assert (home / "data").resolve() == volume.resolve()
    link_volumes(home, ((str(volume), "/var/data"),))  # again at the next start: replaced
    (home / "own").write_text("mine")
    link_volumes(home, ((str(volume), "/own"),))  # the machine's own file stays
    assert (home / "own").read_text() == "mine"
    assert volume_env("my-data") == "SOUQ_VOLUME_MY_DATA"


def test_a_sandbox_opens_the_read_only_directory_a_volumes_path_is_missing_from(
    tmp_path: Path,
) -> None:
    """bwrap cannot make a mount point in a read-only root: the deepest directory the root has
    on the path becomes a tmpfs that holds the root's entries again, and the point."""
    root = tmp_path / "root"
    (root / "srv" / "kept").mkdir(parents=True)
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "hidden").mkdir()
    (root / "bin").symlink_to("usr/bin")
    paths = ["/data", "/srv/deep/d", "/usr", "/tmp/t", "/hidden/x/y"]
    opened = mount_points_to_open(root, paths, hidden=["/hidden"])
    assert opened == {"/": ["/data"], "/srv": ["/srv/deep/d"]}  # /usr is there, /tmp private
    argv = bwrap_argv(
        tmp_path / "machines" / "m1",
        network=True,
        machines_root=tmp_path / "machines",
        image=Image(root),
        mounts=((str(tmp_path / "v1"), "/data"), (str(tmp_path / "v2"), "/srv/deep/d")),
    )
    assert ("--ro-bind", str(root), "/") not in list(zip(argv, argv[1:], argv[2:], strict=False))
    assert argv[argv.index("usr/bin") - 1 : argv.index("usr/bin") + 2] == [
        "--symlink",
        "usr/bin",
        "/bin",
    ]
    srv = argv.index("/srv", argv.index("--tmpfs"))
    assert argv[srv - 1] == "--tmpfs"
    kept = argv.index(str(root / "srv" / "kept"))
    ro = [i for i, a in enumerate(argv) if a == "--remount-ro"]
    binds = [i for i, a in enumerate(argv) if a == "--bind"]
    assert srv < kept < max(ro) < min(binds)  # made read-only before the volumes go in
