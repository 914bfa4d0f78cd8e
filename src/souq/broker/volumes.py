"""The broker's volume use cases: place a volume, route every other volume verb to the worker
that holds it, and resolve a machine's ``mounts`` before it is placed.

A volume id names its worker (``vol_<worker>_<hex>``, :func:`souq.model.volume.new_volume_id`),
so a get, an extend or a destroy goes straight there, from any broker, without a directory of
volumes. A list asks every worker (``souq.all.volume_list``), as a machine list does without
the cluster view. A create is a placement (:meth:`souq.broker.market.Market.place_volume`): the
region's workers ranked by their free disk through the same pipeline as a machine (a volume
with a unique zone skips the workers of its siblings, ``volume_zone_taken``), then
``volume_create`` claimed on the best; the worker re-checks its disk and reserves it, or
refuses and the next is tried.

A machine that mounts a volume is placed only on the volume's worker: :meth:`mount_of` names
that worker to the market, whose :class:`~souq.placement.filters.VolumeFilter` rejects every
other (``volume_elsewhere``, counted in the placement record); the worker attaches the volume
in the claim, or refuses it (``volume_attached``) when another machine holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from souq.broker.volume_listing import worker_of
from souq.errors import InvalidInput, NotFound, VolumeAttached
from souq.ids import new_request_id
from souq.model import ClaimRequest
from souq.model.machine import MachineConfig
from souq.model.volume import (
    CreateVolumeRequest,
    ExtendVolumeResponse,
    UpdateVolumeRequest,
    Volume,
    VolumeCreateCommand,
    VolumeExtendCommand,
    VolumeRef,
    VolumeSnapshot,
    VolumeUpdateCommand,
)
from souq.placement.request import for_volume
from souq.protocol import verbs as v
from souq.protocol.verbs import Verb

if TYPE_CHECKING:
    from souq.broker.config import BrokerConfig
    from souq.broker.market import Market
    from souq.broker.quotas import Quotas
    from souq.broker.volume_listing import VolumeListing
    from souq.broker.worker_calls import WorkerCalls
    from souq.protocol import WorkerClient

__all__ = ["BrokerVolumes"]

Q = TypeVar("Q", bound=BaseModel)
A = TypeVar("A")

DEFAULT_SIZE_GB = 1  # Fly's default


@dataclass(frozen=True)
class BrokerVolumes:
    """The volume use cases, given what they stand on: the workers (``client``, ``calls``),
    the market that places a volume, the quotas a volume counts against, the cluster's
    listing of volumes."""

    client: WorkerClient
    config: BrokerConfig
    market: Market
    calls: WorkerCalls
    quotas: Quotas
    listing: VolumeListing
    require_bus: Callable[[], None]

    # -- create and list -------------------------------------------------------------------

    async def create(self, app: str, body: CreateVolumeRequest) -> Volume:
        """Place the volume on a worker of ``body.region`` with the disk for it."""
        self.require_bus()
        avoid: frozenset[str] = frozenset()
        if body.require_unique_zone or body.unique_zone_app_wide:
            siblings = await self.list_volumes(app)
            avoid = frozenset(
                vol.worker_id
                for vol in siblings
                if body.unique_zone_app_wide or vol.name == body.name
            )
        size = body.size_gb or DEFAULT_SIZE_GB
        request_id = new_request_id()
        cmd = VolumeCreateCommand(
            app=app,
            region=body.region,
            name=body.name,
            size_gb=size,
            snapshot_retention=body.snapshot_retention or 5,
            request_id=request_id,
        )

        async def claim(worker_id: str) -> Volume:
            return await self.client.call(
                worker_id, v.VOLUME_CREATE, cmd, timeout=self.config.claim_timeout_s
            )

        request = for_volume(request_id, app, body.region, size, avoid)
        async with self.quotas.counting_volume(app, size) as made:  # 403 past a quota
            volume, _record = await self.market.place_volume(request, claim)
            assert isinstance(volume, Volume)
            made.append(volume)
        return volume

    async def list_volumes(self, app: str) -> list[Volume]:
        """Every worker's live volumes of ``app``, oldest first."""
        return (await self.listing.listing(app))[0]

    # -- one volume, on its worker ---------------------------------------------------------

    async def get(self, app: str, volume_id: str) -> Volume:
        return await self._ask(volume_id, v.VOLUME_GET, VolumeRef(app=app, volume_id=volume_id))

    async def update(self, app: str, volume_id: str, body: UpdateVolumeRequest) -> Volume:
        cmd = VolumeUpdateCommand(
            app=app, volume_id=volume_id, snapshot_retention=body.snapshot_retention
        )
        return await self._ask(volume_id, v.VOLUME_UPDATE, cmd)

    async def extend(self, app: str, volume_id: str, size_gb: int) -> ExtendVolumeResponse:
        cmd = VolumeExtendCommand(app=app, volume_id=volume_id, size_gb=size_gb)
        quotas = self.quotas
        if not quotas.may_count(app):
            return await self._ask(volume_id, v.VOLUME_EXTEND, cmd)
        before = (await self.get(app, volume_id)).size_gb
        async with quotas.extending(app, volume_id, before, size_gb):  # 403 past a quota
            return await self._ask(volume_id, v.VOLUME_EXTEND, cmd)

    async def destroy(self, app: str, volume_id: str) -> Volume:
        ref = VolumeRef(app=app, volume_id=volume_id)
        destroyed = await self._ask(volume_id, v.VOLUME_DESTROY, ref)
        await self.quotas.release(app, [volume_id])  # its size given back
        return destroyed

    async def snapshot(self, app: str, volume_id: str) -> VolumeSnapshot:
        ref = VolumeRef(app=app, volume_id=volume_id)
        return await self._ask(volume_id, v.VOLUME_SNAPSHOT, ref)

    async def snapshots(self, app: str, volume_id: str) -> list[VolumeSnapshot]:
        ref = VolumeRef(app=app, volume_id=volume_id)
        return await self._ask(volume_id, v.VOLUME_SNAPSHOTS, ref)

    async def _ask(self, volume_id: str, verb: Verb[Q, A], body: Q) -> A:
        worker_id = worker_of(volume_id)
        return await self.calls.worker(worker_id, verb, body, what=f"volume {volume_id}")

    # -- machines that mount one -----------------------------------------------------------

    async def mount_of(self, order: ClaimRequest) -> tuple[ClaimRequest, tuple[str, str] | None]:
        """``order`` with its mount naming the volume by id (a mount by ``name`` takes a free
        volume of that name in the machine's region), and (the volume, its worker): None when
        the machine mounts nothing."""
        if not order.config.mounts:
            return order, None
        mount = order.config.mounts[0]
        if mount.volume is not None:
            volume = await self.get(order.app, mount.volume)
            if volume.region != order.region:
                raise InvalidInput(
                    f"mounts[0].volume: volume {volume.id} is in region {volume.region}, "
                    f"not {order.region}",
                    hint=f"create the machine in region {volume.region}",
                )
        else:
            volume = await self._free_named(order.app, order.region, str(mount.name))
        if volume.attached_machine_id is not None:
            raise _attached(volume)
        # The mount as Fly reads it back: the volume's id and name.
        mounts = [mount.model_copy(update={"volume": volume.id, "name": volume.name})]
        config = order.config.model_copy(update={"mounts": mounts})
        return order.model_copy(update={"config": config}), (volume.id, volume.worker_id)

    async def named_for(self, app: str, machine_id: str, config: MachineConfig) -> MachineConfig:
        """An update's ``config`` with a mount by name given its volume's id: the volume of that
        name the machine has attached, else a free one (its worker checks it holds it)."""
        if not config.mounts or config.mounts[0].volume is not None:
            return config
        mount = config.mounts[0]
        named = [vol for vol in await self.list_volumes(app) if vol.name == mount.name]
        mine = [vol for vol in named if vol.attached_machine_id == machine_id]
        free = [vol for vol in named if vol.attached_machine_id is None]
        if not (mine or free):
            raise NotFound(
                f"mounts[0].name: app {app} has no free volume named {mount.name!r}",
                hint="create one with `souq volume create`, on the machine's worker's region",
            )
        volume = (mine or free)[0]
        mounts = [mount.model_copy(update={"volume": volume.id})]
        return config.model_copy(update={"mounts": mounts})

    async def _free_named(self, app: str, region: str, name: str) -> Volume:
        named = [
            vol for vol in await self.list_volumes(app) if vol.name == name and vol.region == region
        ]
        free = [vol for vol in named if vol.attached_machine_id is None]
        if free:
            return free[0]
        if named:
            raise _attached(named[0])
        raise NotFound(
            f"mounts[0].name: app {app} has no volume named {name!r} in region {region}",
            hint=f"create one: `souq volume create {name} --app {app} --region {region}`",
        )

    @staticmethod
    def refuse_mounts(config: MachineConfig, what: str) -> None:
        """Batches and quotes place machines without looking at volumes."""
        if config.mounts:
            raise InvalidInput(
                f"mounts: {what} cannot mount a volume",
                hint="create each machine that mounts a volume on its own",
            )


def _attached(volume: Volume) -> VolumeAttached:
    details: dict[str, Any] = {"machine_id": volume.attached_machine_id, "volume_id": volume.id}
    return VolumeAttached(
        f"volume {volume.id} ({volume.name}) is attached to machine {volume.attached_machine_id}",
        hint="a volume is mounted by one machine at a time: destroy that machine, or create "
        "another volume",
        details=details,
    )
