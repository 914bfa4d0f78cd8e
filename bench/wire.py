"""The bus's part of one create, in one process: each message a create sends, encoded and
decoded as the broker and the worker do it, timed apart from everything else.

Suite ``wire`` (``python -m bench wire``). A create's messages: the claim (its config and a
placement record of eight offers) encoded by the broker and decoded by the worker; the claim's
answer (the machine record without its placement) and the launch event (with its whole record)
encoded by the worker; the answer unwrapped by the broker; the launch event decoded and applied
by the broker's cluster view, which holds the machine already (it applied the answer first).
Each step is timed in CPU time (the process's, so that other work on a shared machine does not
count) as the best of ``WIRE_REPEATS`` (default 5) rounds of ``WIRE_N`` (default 2,000) calls,
in µs a call.

The CPU benchmarks (``creates``) are the figure; this one isolates the steps that changed, and
it runs against any tree of the project (``PYTHONPATH=<tree>/src python -m bench.wire``), so
that two trees can be compared on one machine minutes apart.
"""

from __future__ import annotations

import json
import os
import time
import timeit
from collections.abc import Callable
from typing import Any

from bench.stats import machine_line
from souq.agent.wire import event_json, machine_json
from souq.bus.codec import Encoded, ok_reply, unwrap_with_ledger
from souq.model import (
    ClaimRequest,
    Machine,
    MachineConfig,
    MachineEvent,
    MachineEventMessage,
    MachineState,
)
from souq.model.placement import ClaimAttempt, OfferOutcome, Placement, Sampling
from souq.protocol.verbs import CLAIM
from souq.view.store import ViewStore

CONFIG = {"cmd": ["sleep", "3600"], "guest": {"cpus": 0.01, "memory_mb": 1}}
SCORES = {"best-fit": 0.5, "spread": 0.25, "image": 0.0, "price": 0.1}


def _create() -> tuple[ClaimRequest, Machine, MachineEventMessage]:
    config = MachineConfig.model_validate(CONFIG)
    offers = [OfferOutcome(worker_id=f"w{i}", scores=SCORES, score=0.5) for i in range(8)]
    placement = Placement(
        request_id="r1",
        region="bench",
        weights={"best-fit": 1.0, "spread": 0.5},
        offers=offers,
        winner="w1",
        claims=[ClaimAttempt(worker_id="w1", ok=True)],
        sampled=Sampling(asked=8, of=1000, seed="r1"),
        source="book",
    )
    claim = ClaimRequest(
        request_id="r1", body_hash="h", app="bench", region="bench", config=config
    ).model_copy(update={"placement": placement})
    launch = MachineEvent(type="launch", status=MachineState.CREATED, source="user", timestamp=1)
    where: dict[str, Any] = {"app": "bench", "region": "bench", "worker_id": "w1"}
    made = "2026-12-04T00:00:00.001Z"
    machine = Machine.model_validate(
        {"id": "m1", "name": "m1", "state": "created", "created_at": made, "updated_at": made}
        | {"config": config, "events": [launch], "placement": placement}
        | where
    )
    event = MachineEventMessage(
        machine_id="m1", state=machine.state, event=launch, machine=machine, **where
    )
    return claim, machine, event


def _view_intake() -> Callable[[bytes, ViewStore], Any]:
    """How this tree's cluster view takes an event message off the bus."""
    try:
        from souq.model.wire import decode_notes
    except ImportError:  # a tree from before the structs: one pydantic validation
        from souq.bus.codec import decode_one_or_many

        return lambda data, store: store.apply_events(decode_one_or_many(data, MachineEventMessage))
    return lambda data, store: store.apply_events(decode_notes(data))


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def steps() -> dict[str, Callable[[], Any]]:
    claim, machine, event = _create()
    answer = machine.model_copy(update={"placement": None})
    claim_bytes = claim.model_dump_json().encode()
    reply = ok_reply(Encoded(_as_bytes(machine_json(answer))), ledger=3)
    event_bytes = _as_bytes(event_json(event))
    store = ViewStore()
    store.apply_machine(machine)
    intake = _view_intake()
    return {
        "broker: encode the claim": lambda: claim.model_dump_json().encode(),
        "worker: decode the claim": lambda: CLAIM.decode_request(claim_bytes),
        "worker: encode the answer": lambda: ok_reply(
            Encoded(_as_bytes(machine_json(answer))), ledger=3
        ),
        "worker: encode the launch event": lambda: event_json(event),
        "broker: unwrap the answer": lambda: unwrap_with_ledger(reply, Machine),
        "broker's view: take the launch event": lambda: intake(event_bytes, store),
    }


def wire() -> dict[str, float]:
    n = int(os.environ.get("WIRE_N", "2000"))
    repeats = int(os.environ.get("WIRE_REPEATS", "5"))
    out: dict[str, float] = {}
    for name, step in steps().items():
        # CPU time, not wall time: a shared machine's other work does not count.
        best = min(timeit.repeat(step, number=n, repeat=repeats, timer=time.process_time)) / n
        out[name] = round(best * 1e6, 1)
    out["total"] = round(sum(out.values()), 1)
    return out


def main() -> None:
    print(f"# wire benchmark — one create's messages — {machine_line()}", flush=True)
    result = wire()
    for name, us in result.items():
        print(f"{us:8.1f} µs  {name}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
