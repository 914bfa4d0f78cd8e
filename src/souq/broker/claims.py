"""Claims sent to one worker: patient with a busy worker, and the claim of a machine where an
earlier placement of its request made it.

* :meth:`Claims.send` — a claim (a hold, a batch claim) and its answer with the worker's ledger
  version. Unanswered, it is sent again, the same claim, while the worker is heard: a busy
  worker is slow, not gone, and a claim is idempotent (per request id, per quote id), so the
  machine is made once, where it was claimed;
* :meth:`Claims.where_made` — a create whose ``Idempotency-Key`` made its machine on a worker
  already (:mod:`souq.broker.key_turns` says which): claimed there, the worker answers with it.
"""

from __future__ import annotations

import logging
import math
from typing import TypeVar

from pydantic import BaseModel

from souq.broker.config import BrokerConfig
from souq.clock import Clock
from souq.errors import IdempotencyConflict, NoReply, SouqError
from souq.model import ClaimRequest, Machine
from souq.protocol import WorkerClient
from souq.protocol.verbs import CLAIM, Verb
from souq.view.liveness import Liveness

__all__ = ["Claims"]

log = logging.getLogger(__name__)

Q = TypeVar("Q", bound=BaseModel)
R = TypeVar("R")


class Claims:
    def __init__(
        self, workers: WorkerClient, liveness: Liveness, config: BrokerConfig, clock: Clock
    ) -> None:
        self._workers = workers
        self._liveness = liveness
        self._config = config
        self._clock = clock

    async def send(
        self, worker_id: str, verb: Verb[Q, R], body: Q, *, timeout: float | None = None
    ) -> tuple[R, int | None]:
        """Send a claim (a hold, a batch claim) and return the worker's answer and its ledger
        version. One unanswered within ``timeout`` (``claim_timeout_s``) is sent again, the same
        claim, for as long as the worker is heard (a heartbeat, a usage message or an answer
        within the last two such deadlines: one busy with a burst of claims, and starved of CPU
        by the processes they spawn, may be silent for seconds), up to ``claim_patience_s`` in
        all: a busy worker is slow, not gone. A claim is idempotent
        (per request id, per quote id), so the answer to the one sent again names what the first
        made, and the machine is made once, where it was claimed, instead of once there (late,
        unseen) and once more on the next worker. A silent worker is given up: :class:`NoReply`."""
        timeout = timeout or self._config.claim_timeout_s
        clock, liveness = self._clock, self._liveness
        give_up = clock.monotonic() + self._config.claim_patience_s
        sends = max(1, math.ceil(self._config.claim_patience_s / timeout))  # a bound in sends too
        while True:
            sent = clock.monotonic()
            sends -= 1
            try:
                answer = await self._workers.call_with_ledger(
                    worker_id, verb, body, timeout=timeout
                )
            except NoReply:
                now = clock.monotonic()
                if (
                    now >= give_up
                    or sends <= 0
                    or not liveness.heard_since(worker_id, sent - timeout)
                ):
                    raise
                log.info(
                    "claim on %s unanswered for %.1fs; it is heard: sent again",
                    worker_id,
                    now - sent,
                )
                continue
            except SouqError:
                liveness.heard(worker_id)  # a refusal is word from it too
                raise
            liveness.heard(worker_id)
            return answer

    async def where_made(self, order: ClaimRequest, worker_id: str) -> Machine | None:
        """The machine ``order``'s request made on ``worker_id``, claimed there (the order as
        it came: the worker answers a known request id with its machine); None when that
        worker is gone or refuses (it forgot the request): the order is then placed as any
        retry is. Another body is an :class:`IdempotencyConflict`; a worker heard but silent
        raises :class:`NoReply` (it may hold the machine still)."""
        try:
            machine: Machine = (await self.send(worker_id, CLAIM, order))[0]
            return machine
        except IdempotencyConflict:
            raise
        except NoReply:
            if self._liveness.is_live(worker_id):  # busy, not gone
                raise
            log.info("request %s: %s, where it was made, is gone", order.request_id, worker_id)
        except SouqError as exc:
            log.info(
                "request %s: %s, where it was made, answered %s",
                order.request_id,
                worker_id,
                exc.status,
            )
        return None
