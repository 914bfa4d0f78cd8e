"""Which worker owns which machine: a cache filled by creates, listings and machine events (the
cluster view passes each event it decodes), with ``souq.all.locate`` as the fallback on a miss.
Machines never move, so a cached route stays true until the machine's worker is gone for good."""

from __future__ import annotations

from collections import OrderedDict

from souq.errors import NotFound
from souq.model import LocateCommand
from souq.protocol import WorkerClient
from souq.protocol.verbs import LOCATE

__all__ = ["Directory"]


class Directory:
    def __init__(self, workers: WorkerClient, *, max_entries: int = 100_000) -> None:
        self._workers = workers
        self._routes: OrderedDict[str, str] = OrderedDict()
        self._max = max_entries

    def remember(self, machine_id: str, worker_id: str) -> None:
        self._routes[machine_id] = worker_id
        self._routes.move_to_end(machine_id)
        while len(self._routes) > self._max:
            self._routes.popitem(last=False)

    def cached(self, machine_id: str) -> str | None:
        return self._routes.get(machine_id)

    async def owner(self, machine_id: str, *, expect: int, timeout: float) -> str:
        """The worker holding ``machine_id``; asks every worker on a cache miss."""
        worker_id = self._routes.get(machine_id)
        if worker_id is not None:
            return worker_id
        replies = await self._workers.ask_all(
            LOCATE, LocateCommand(machine_id=machine_id), expect=expect or None, timeout=timeout
        )
        for reply in replies:
            if reply.found:
                self.remember(machine_id, reply.worker_id)
                return reply.worker_id
        raise NotFound(
            f"machine {machine_id} not found",
            hint="list the app's machines with `souq machine list --app APP`",
        )
