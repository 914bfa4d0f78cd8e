"""A broker's requests to one worker: to a worker by its id (its cordon and drain too), or to
the worker that holds a machine (found through the broker's
:class:`~souq.broker.directory.Directory`). A worker that does not
answer while the bus is up is :class:`~souq.errors.Unavailable`, naming what was asked, why, and
what to check; a change to a machine that went unanswered says it may have been applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TypeVar

from pydantic import BaseModel

from souq.broker.config import BrokerConfig
from souq.broker.directory import Directory
from souq.bus import Transport
from souq.errors import NotFound, Unavailable
from souq.model import WorkerInfo
from souq.model.protocol import CordonCommand, DrainCommand
from souq.protocol import Verb, WorkerClient
from souq.protocol import verbs as v
from souq.view.liveness import Liveness

__all__ = ["WorkerCalls"]

Q = TypeVar("Q", bound=BaseModel)
A = TypeVar("A")

# The verbs a worker may have carried out although its answer was lost.
_CHANGES_A_MACHINE = frozenset(
    verb.name for verb in (v.START, v.STOP, v.SUSPEND, v.RESTART, v.UPDATE, v.SIGNAL, v.DESTROY)
)


@dataclass(frozen=True)
class WorkerCalls:
    client: WorkerClient
    transport: Transport
    directory: Directory
    liveness: Liveness
    config: BrokerConfig
    _: KW_ONLY
    require_bus: Callable[[], None]  # 503 at once while the bus is down (BrokerService)

    async def worker(self, worker_id: str, verb: Verb[Q, A], body: Q, *, what: str) -> A:
        """``verb`` on worker ``worker_id``; ``what`` names the thing asked about (a quote, a
        volume, the worker) in the error when it does not answer."""
        self.require_bus()
        return await self._call(
            worker_id,
            verb,
            body,
            timeout=self.config.command_timeout_s,
            unanswered=f"worker {worker_id} did not answer ({verb.name} of {what})",
            hint="check `souq workers`; is the worker up?",
        )

    async def owner(self, machine_id: str, verb: Verb[Q, A], body: Q, *, extra_s: float = 0.0) -> A:
        """``verb`` on the worker that holds machine ``machine_id``, allowed ``extra_s`` past
        the command timeout (a wait, an exec)."""
        self.require_bus()
        worker_id = await self.directory.owner(
            machine_id,
            expect=self.liveness.live_count(),
            timeout=self.config.gather_timeout_s,
        )
        unanswered = f"worker {worker_id}, which holds machine {machine_id}, did not answer"
        hint = "check `souq workers`; the machine is back when its worker is"
        if verb.name in _CHANGES_A_MACHINE:  # the worker may have done it, and then gone
            unanswered += f"; the {verb.name} may have been applied"
            hint = "check the machine's state (GET the machine) before retrying; " + hint
        return await self._call(
            worker_id,
            verb,
            body,
            timeout=self.config.command_timeout_s + extra_s,
            unanswered=unanswered,
            hint=hint,
        )

    async def _call(
        self,
        worker_id: str,
        verb: Verb[Q, A],
        body: Q,
        *,
        timeout: float,
        unanswered: str,
        hint: str,
    ) -> A:
        try:
            return await self.client.call(worker_id, verb, body, timeout=timeout)
        except Unavailable as exc:
            if not self.transport.connected:
                raise
            raise Unavailable(f"{unanswered}: {exc.message}", hint=hint) from exc

    # -- a worker itself -------------------------------------------------------------------

    async def cordon(self, worker_id: str, *, cordoned: bool) -> WorkerInfo:
        """Cordon (or uncordon) a worker: it makes no offers; its machines keep running."""
        self._known_worker(worker_id)
        cmd = CordonCommand(cordoned=cordoned)
        return await self.worker(worker_id, v.CORDON, cmd, what="the worker")

    async def drain(self, worker_id: str) -> WorkerInfo:
        """Drain a worker: cordon it and stop its machines gracefully (each with its stop
        config). Answers once the stops are sent; the worker reports ``draining`` meanwhile."""
        self._known_worker(worker_id)
        return await self.worker(worker_id, v.DRAIN, DrainCommand(), what="the worker")

    def _known_worker(self, worker_id: str) -> None:
        if self.liveness.state_of(worker_id) is None:
            raise NotFound(
                f"worker {worker_id} not found",
                hint="list the workers with `souq workers`",
            )
