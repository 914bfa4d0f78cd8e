"""The agent's answer to each volume verb (``volume_*``, :mod:`souq.protocol.verbs`): the handlers
:meth:`souq.agent.verbs.WorkerVerbs.dispatcher` routes to :mod:`souq.agent.volumes.worker_volumes`.
A change of what the worker has promised (a create, an extend, a destroy) is announced at once, so
that the brokers' books count the disk it took or gave back."""

from __future__ import annotations

from collections.abc import Callable

from souq.agent.volumes.worker_volumes import AgentVolumes
from souq.model import volume as vol
from souq.protocol import verbs as v
from souq.protocol.dispatch import Dispatcher

__all__ = ["route_volumes"]


def route_volumes(d: Dispatcher, volumes: AgentVolumes, announce: Callable[[], None]) -> None:
    async def create(cmd: vol.VolumeCreateCommand) -> vol.Volume:
        volume = volumes.create(cmd)
        announce()
        return volume

    async def get(ref: vol.VolumeRef) -> vol.Volume:
        return volumes.get(ref.app, ref.volume_id)

    async def listing(cmd: vol.VolumeListCommand) -> list[vol.Volume]:
        return volumes.list_volumes(cmd.app, include_destroyed=cmd.include_destroyed)

    async def update(cmd: vol.VolumeUpdateCommand) -> vol.Volume:
        return volumes.update(cmd.app, cmd.volume_id, cmd.snapshot_retention)

    async def extend(cmd: vol.VolumeExtendCommand) -> vol.ExtendVolumeResponse:
        extended = volumes.extend(cmd.app, cmd.volume_id, cmd.size_gb)
        announce()
        return extended

    async def destroy(ref: vol.VolumeRef) -> vol.Volume:
        volume = volumes.destroy(ref.app, ref.volume_id)
        announce()
        return volume

    async def snapshot(ref: vol.VolumeRef) -> vol.VolumeSnapshot:
        return await volumes.snapshot(ref.app, ref.volume_id)

    async def snapshots(ref: vol.VolumeRef) -> list[vol.VolumeSnapshot]:
        return volumes.snapshots(ref.app, ref.volume_id)

    d.route(v.VOLUME_CREATE, create)
    d.route(v.VOLUME_GET, get)
    d.route(v.VOLUME_LIST, listing)
    d.route(v.VOLUME_UPDATE, update)
    d.route(v.VOLUME_EXTEND, extend)
    d.route(v.VOLUME_DESTROY, destroy)
    d.route(v.VOLUME_SNAPSHOT, snapshot)
    d.route(v.VOLUME_SNAPSHOTS, snapshots)
