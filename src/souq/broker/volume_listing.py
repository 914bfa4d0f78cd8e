"""Which volumes the cluster holds: every live worker asked (``souq.all.volume_list``), and
whether the answer is whole. The volume use cases (:mod:`souq.broker.volumes`) and the quotas'
reconciliation (:mod:`souq.broker.quotas`) both stand on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from souq.broker.orders import worker_named_by
from souq.errors import SouqError
from souq.model.volume import VOLUME_PREFIX, Volume, VolumeListCommand
from souq.protocol import WorkerClient
from souq.protocol import verbs as v
from souq.view.liveness import Liveness

__all__ = ["VolumeListing", "worker_of"]


def worker_of(volume_id: str) -> str:
    """The worker a volume id names (``vol_<worker>_<hex>``); 422 for an id of no such form."""
    return worker_named_by(volume_id, "volume", VOLUME_PREFIX, "list them with GET .../volumes")


@dataclass(frozen=True)
class VolumeListing:
    client: WorkerClient
    liveness: Liveness
    gather_timeout_s: float
    require_bus: Callable[[], None]

    async def listing(self, app: str) -> tuple[list[Volume], bool]:
        """Every worker's live volumes of ``app``, oldest first, and whether every live worker
        answered."""
        self.require_bus()
        live = self.liveness.live_count()
        replies = await self.client.ask_all(
            v.VOLUME_LIST,
            VolumeListCommand(app=app),
            expect=live or None,
            timeout=self.gather_timeout_s,
        )
        found = {vol.id: vol for batch in replies for vol in batch}
        listed = sorted(found.values(), key=lambda vol: (vol.created_at, vol.id))
        return listed, len(replies) >= live

    def listed_for(self, complete: bool) -> Callable[[str], bool]:
        """Whether a listing (:meth:`listing`) shows all there is of a volume id: every live
        worker answered, and the volume's worker is one of them (a worker down keeps its
        volumes: not listed, not gone)."""

        def listed(volume_id: str) -> bool:
            if not complete:
                return False
            try:
                return self.liveness.is_live(worker_of(volume_id))
            except SouqError:
                return False

        return listed
