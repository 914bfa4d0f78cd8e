"""Volumes: a named directory of a given size on one worker, attached to one machine at a time.

The shapes are Fly's Machines API's (``/v1/apps/{app}/volumes``, docs/fly-compat.md section 2):
what fly-go's ``CreateVolumeRequest`` sends and its ``Volume``, ``ExtendVolumeResponse`` and
``VolumeSnapshot`` decode. A machine uses one through ``config.mounts`` (:class:`MachineMount`).
The life cycle is a table (:data:`TRANSITIONS`, :func:`transition`); whether a volume is
attached is a field of its own (``attached_machine_id``), not a state, as on Fly.

Pure: no I/O. See docs/volumes.md.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from souq.errors import IllegalTransition
from souq.ids import new_id_on, worker_in_id
from souq.model.base import Input, Record
from souq.model.fly_fields import FlyInput

__all__ = [
    "GB_MB",
    "MAX_SIZE_GB",
    "MOUNT_UNSUPPORTED",
    "TRANSITIONS",
    "VOLUME_CREATE_UNSUPPORTED",
    "VOLUME_NAME",
    "VOLUME_PREFIX",
    "CreateVolumeRequest",
    "ExtendVolumeRequest",
    "ExtendVolumeResponse",
    "MachineMount",
    "UpdateVolumeRequest",
    "Volume",
    "VolumeCreateCommand",
    "VolumeEvent",
    "VolumeExtendCommand",
    "VolumeListCommand",
    "VolumeRef",
    "VolumeSnapshot",
    "VolumeState",
    "VolumeUpdateCommand",
    "new_volume_id",
    "transition",
    "volume_worker",
]

VOLUME_NAME = re.compile(r"^[a-z0-9_]{1,30}$")  # Fly's rule: lowercase, digits, underscores
MAX_SIZE_GB = 16_384  # Fly's largest volume: 500 GB; Souq is bounded by the worker's disk
VOLUME_PREFIX = "vol"  # a volume id is vol_<worker>_<hex> (new_id_on)
GB_MB = 1024  # a volume's size_gb counts against a worker's disk_mb in MiB per GiB

MOUNT_UNSUPPORTED = {
    "encrypted": "a volume is a plain directory on its worker's disk, not encrypted",
    "size_gb": "a mount's size is its volume's: extend the volume instead",
    "extend_threshold_percent": "volumes are not extended automatically; extend them with the API",
    "add_size_gb": "volumes are not extended automatically; extend them with the API",
    "size_gb_limit": "volumes are not extended automatically; extend them with the API",
}
VOLUME_CREATE_UNSUPPORTED = {
    "encrypted": "a volume is a plain directory on its worker's disk, not encrypted "
    "(send encrypted: false, e.g. `fly volumes create --no-encryption`)",
    "auto_backup_enabled": "volumes are not backed up on a schedule; take snapshots instead",
    "snapshot_id": "a volume cannot be restored from a snapshot yet",
    "source_volume_id": "a volume cannot be forked from another yet",
    "compute": "volumes are placed by disk alone; the machine that mounts it follows",
    "compute_image": "volumes are placed by disk alone; the machine that mounts it follows",
    "host_dedication_id": "dedicated hosts are not supported",
}


def new_volume_id(worker_id: str) -> str:
    """``vol_<worker>_<hex>``: a volume id names the worker that holds it (as a quote id does),
    so that any broker routes its verbs without asking around."""
    return new_id_on(VOLUME_PREFIX, worker_id)


def volume_worker(volume_id: str) -> str | None:
    """The worker named in a volume id, or None when it is not one Souq made."""
    return worker_in_id(volume_id, VOLUME_PREFIX)


class VolumeState(StrEnum):
    CREATED = "created"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"


class VolumeEvent(StrEnum):
    ATTACH = "attach"
    DETACH = "detach"
    EXTEND = "extend"
    UPDATE = "update"
    SNAPSHOT = "snapshot"
    DESTROY = "destroy"  # its row marked, its directory about to go
    REMOVED = "removed"  # its directory is gone


S, E = VolumeState, VolumeEvent
TRANSITIONS: dict[tuple[VolumeState, VolumeEvent], VolumeState] = {
    (S.CREATED, E.ATTACH): S.CREATED,
    (S.CREATED, E.DETACH): S.CREATED,
    (S.CREATED, E.EXTEND): S.CREATED,
    (S.CREATED, E.UPDATE): S.CREATED,
    (S.CREATED, E.SNAPSHOT): S.CREATED,
    (S.CREATED, E.DESTROY): S.DESTROYING,
    (S.DESTROYING, E.DETACH): S.DESTROYING,  # a machine destroyed meanwhile lets go
    (S.DESTROYING, E.DESTROY): S.DESTROYING,  # a retried destroy (e.g. after a crash)
    (S.DESTROYING, E.REMOVED): S.DESTROYED,
}


def transition(state: VolumeState, event: VolumeEvent, *, volume_id: str = "") -> VolumeState:
    """The next state, or :class:`IllegalTransition` naming what cannot happen."""
    after = TRANSITIONS.get((state, event))
    if after is None:
        what = f"volume {volume_id}" if volume_id else "the volume"
        raise IllegalTransition(
            f"{what} is {state}: it cannot {event}",
            hint="create a new volume" if state is not S.CREATED else "",
        )
    return after


class MachineMount(FlyInput):
    """One volume a machine mounts (Fly's ``MachineMount``): by id, or by name (an unattached
    volume of that name in the app and the machine's region), at an absolute ``path``."""

    unsupported = MOUNT_UNSUPPORTED

    volume: str | None = Field(default=None, min_length=1, max_length=80, pattern=r"^vol_\S+$")
    path: str = Field(min_length=1, max_length=255, description="where the machine sees it")
    name: str | None = Field(default=None, description="the volume's name (Fly's)")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        parts = v.split("/")
        if not v.startswith("/") or v == "/" or any(p in (".", "..") for p in parts[1:]):
            raise ValueError(f"must be an absolute path below /: {v!r} is not")
        if any(not p for p in parts[1:-1]) or "\x00" in v:
            raise ValueError(f"{v!r} has an empty component")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _names_a_volume(self) -> MachineMount:
        if self.volume is None and self.name is None:
            raise ValueError("give the volume's id (`volume`) or its `name`")
        return self


class CreateVolumeRequest(FlyInput):
    """fly-go's ``CreateVolumeRequest``: every pointer is sent, ``null`` when unset."""

    unsupported = VOLUME_CREATE_UNSUPPORTED

    name: str = Field(description="lowercase letters, digits and underscores, at most 30")
    region: str = Field(min_length=1, max_length=63)
    size_gb: int | None = Field(default=None, ge=1, le=MAX_SIZE_GB, description="default 1")
    require_unique_zone: bool | None = Field(
        default=None,
        description="true: not on a worker that holds another volume of this name in the app",
    )
    unique_zone_app_wide: bool | None = Field(
        default=None, description="true: not on a worker that holds any volume of the app"
    )
    snapshot_retention: int | None = Field(default=None, ge=1, le=60)
    fstype: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not VOLUME_NAME.match(v):
            raise ValueError(
                f"name must be 1-30 lowercase letters, digits and underscores: {v!r} is not"
            )
        return v

    @field_validator("fstype")
    @classmethod
    def _fstype(cls, v: str | None) -> str | None:
        if v not in (None, "ext4"):
            raise ValueError(f"fstype {v!r}: a volume is a directory; only ext4 (the default)")
        return v


class UpdateVolumeRequest(FlyInput):
    """Fly's ``UpdateVolumeRequest``."""

    unsupported = {"auto_backup_enabled": VOLUME_CREATE_UNSUPPORTED["auto_backup_enabled"]}

    snapshot_retention: int | None = Field(default=None, ge=1, le=60)


class ExtendVolumeRequest(Input):
    size_gb: int = Field(ge=1, le=MAX_SIZE_GB, description="the new size, larger than now")


class Volume(Record):
    """A volume as Fly's ``Volume`` reads it, with Souq's ``app`` and ``worker_id``."""

    id: str
    name: str
    app: str = ""
    state: VolumeState = VolumeState.CREATED
    size_gb: int
    region: str
    zone: str = Field(default="", description="the worker that holds it (Fly's host zone)")
    worker_id: str = ""
    encrypted: bool = False
    attached_machine_id: str | None = None
    attached_alloc_id: str | None = None
    created_at: str = Field(description="RFC 3339")
    host_dedication_id: str = ""
    snapshot_retention: int = 5
    auto_backup_enabled: bool = False
    host_status: str = "ok"
    fstype: str = "ext4"
    used_mb: int | None = Field(
        default=None, description="what its files used at the worker's last count (MiB)"
    )

    @property
    def attached(self) -> bool:
        return self.attached_machine_id is not None


class ExtendVolumeResponse(Record):
    volume: Volume
    needs_restart: bool = False


class VolumeSnapshot(Record):
    """Fly's ``VolumeSnapshot``: ``size`` the archive's bytes, ``volume_size`` the volume's."""

    id: str
    size: int
    volume_size: int
    digest: str
    created_at: str
    status: str = "created"
    retention_days: int | None = None


# -- the bus protocol: what a broker asks a worker of its volumes -------------------------------


class VolumeCreateCommand(Input):
    """Make a volume on this worker: its disk reserved and its directory made, atomically."""

    app: str
    region: str
    name: str
    size_gb: int = Field(ge=1, le=MAX_SIZE_GB)
    snapshot_retention: int = 5
    request_id: str = Field(description="a retried create answers the volume it made")


class VolumeRef(Input):
    app: str
    volume_id: str


class VolumeListCommand(Input):
    """The volumes of ``app`` (every app: None) this worker holds; destroyed ones too when
    asked."""

    app: str | None = None
    include_destroyed: bool = False


class VolumeUpdateCommand(Input):
    app: str
    volume_id: str
    snapshot_retention: int | None = None


class VolumeExtendCommand(Input):
    app: str
    volume_id: str
    size_gb: int = Field(ge=1, le=MAX_SIZE_GB)
