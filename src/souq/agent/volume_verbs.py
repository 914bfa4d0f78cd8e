"""The agent's answer to each volume verb (``volume_*``, :mod:`souq.protocol.verbs`): the
handlers :meth:`souq.agent.verbs.WorkerVerbs.dispatcher` routes to :mod:`souq.agent.volumes`.
A change of what the worker has promised (a create, an extend, a destroy) is announced at once,
so that the brokers' books count the disk it took or gave back."""

from __future__ import annotations

from collections.abc import Callable

from souq.agent.volumes import AgentVolumes
from souq.model import volume as model
from souq.protocol import verbs as v
from souq.protocol.dispatch import Dispatcher

__all__ = ["route_volumes"]


def route_volumes(d: Dispatcher, volumes: AgentVolumes, announce: Callable[[], None]) -> None:
    async def create(cmd: model.VolumeCreateCommand) -> model.Volume:
        volume = volumes.create(cmd)
        announce()
        return volume

    async def get(ref: model.VolumeRef) -> model.Volume:
        return volumes.get(ref.app, ref.volume_id)

    async def listing(cmd: model.VolumeListCommand) -> list[model.Volume]:
        return volumes.list_volumes(cmd.app, include_destroyed=cmd.include_destroyed)

    async def update(cmd: model.VolumeUpdateCommand) -> model.Volume:
        return volumes.update(cmd.app, cmd.volume_id, cmd.snapshot_retention)

    async def extend(cmd: model.VolumeExtendCommand) -> model.ExtendVolumeResponse:
        extended = volumes.extend(cmd.app, cmd.volume_id, cmd.size_gb)
        announce()
        return extended

    async def destroy(ref: model.VolumeRef) -> model.Volume:
        volume = volumes.destroy(ref.app, ref.volume_id)
        announce()
        return volume

    async def snapshot(ref: model.VolumeRef) -> model.VolumeSnapshot:
        return await volumes.snapshot(ref.app, ref.volume_id)

    async def snapshots(ref: model.VolumeRef) -> list[model.VolumeSnapshot]:
        return volumes.snapshots(ref.app, ref.volume_id)

    d.route(v.VOLUME_CREATE, create)
    d.route(v.VOLUME_GET, get)
    d.route(v.VOLUME_LIST, listing)
    d.route(v.VOLUME_UPDATE, update)
    d.route(v.VOLUME_EXTEND, extend)
    d.route(v.VOLUME_DESTROY, destroy)
    d.route(v.VOLUME_SNAPSHOT, snapshot)
    d.route(v.VOLUME_SNAPSHOTS, snapshots)
