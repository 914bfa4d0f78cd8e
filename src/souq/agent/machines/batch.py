"""The ``claim_batch`` verb: several machines of one config in one claim.

The broker's batch create assigns ``k`` machines to this worker and sends them in one message
instead of ``k`` claims. The worker decides for the whole batch at once:

* an item whose request id it knows is answered with the machine it already made (and the
  whole batch is an ``idempotency_conflict`` if that machine was made from another body);
* the new items must fit **together** beside what is reserved and held, or the whole batch is
  refused (``claim_refused`` with the shortfall's reason) and nothing is made;
* then each new item goes through the ordinary claim (:meth:`Commands.claim`): its own
  transaction, events and start.

Nothing awaits between the check and the last claim, so no other request interleaves on this
worker: the batch is atomic with respect to every other claim. It is *not* one transaction: an
agent that crashes half-way leaves the first items made, and a retry of the same batch (same
item request ids) returns those and makes the rest.
"""

from __future__ import annotations

from souq.agent.machines.commands import Commands
from souq.agent.machines.executor import Executor
from souq.drivers.base import prepares_spawns
from souq.errors import IdempotencyConflict
from souq.model.base import copy_fields
from souq.model.batch import BatchClaimReply, BatchClaimRequest
from souq.model.machine import Machine
from souq.model.protocol import ClaimRequest

__all__ = ["claim_batch"]


def claim_batch(
    executor: Executor, commands: Commands, req: BatchClaimRequest, *, now_ms: int
) -> BatchClaimReply:
    """Make every item of ``req`` or none (see the module)."""
    new = 0
    for request_id in req.request_ids:
        known = executor.machine_for_request(request_id)
        if known is None:
            new += 1
        elif executor.row_by_id(known).body_hash != req.body_hash:
            raise IdempotencyConflict.other_body(request_id, known)
    executor.admission.check_batch(req.region, req.config.guest.resources(), new, now_ms)
    if not req.skip_launch and prepares_spawns(executor.driver):
        executor.driver.prepare_spawns(new)
    machines: list[Machine] = []
    for request_id in req.request_ids:
        claim = copy_fields(ClaimRequest, req, request_id=request_id)
        machines.append(commands.claim(claim, durable=False, admitted=True))
    executor.store.sync()  # one fsync for the whole batch, before it is answered
    return BatchClaimReply(machines=machines)
