"""The agent's hot JSON (souq.agent.wire) and the store's memo of what it serialised: a claim's
config and placement are encoded once, and the machine records built with them say exactly what
``model_dump_json`` says."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from souq.agent.state.events import Event
from souq.agent.state.operations import OpKind, OpState
from souq.agent.state.records import MachineRow, OpStep
from souq.agent.state.store import Store
from souq.agent.wire import event_json, machine_json
from souq.errors import IdempotencyConflict
from souq.fleet.store import memory_store
from souq.model import Machine, MachineConfig, MachineEvent, MachineEventMessage, MachineState
from souq.model.placement import ClaimAttempt, ImagePull, OfferOutcome, Placement, Sampling
from souq.model.services import MachineAddress

S = MachineState

CONFIG = MachineConfig.model_validate(
    {
        "cmd": ["sleep", "1"],
        "env": {"A": "b"},
        "guest": {"cpus": 0.5, "memory_mb": 64},
        "metadata": {"team": "x"},
        "image": "sha256:" + "ab" * 32,
    }
)
PLACEMENT = Placement(
    request_id="r1",
    region="mad",
    weights={"best-fit": 1.0},
    offers=[OfferOutcome(worker_id="w1", scores={"best-fit": 0.5}, score=0.5)],
    winner="w1",
    claims=[ClaimAttempt(worker_id="w1", ok=True)],
    sampled=Sampling(asked=8, of=100, seed="r1"),
    cached=False,
    image=ImagePull(reference="sha256:" + "ab" * 32, layers=3, layers_cached=1, bytes_to_pull=4096),
    source="book",
)
EVENTS = [
    MachineEvent(type="start", status=S.STARTED, source="user", timestamp=2, message="hi"),
    MachineEvent(type="launch", status=S.CREATED, source="user", timestamp=1),
]


def a_machine(placement: Placement | None) -> Machine:
    return Machine(
        id="m1",
        name="one",
        app="web",
        region="mad",
        worker_id="w1",
        state=S.STARTED,
        config=CONFIG,
        created_at="2026-01-01T00:00:00.001Z",
        updated_at="2026-01-01T00:00:00.002Z",
        events=EVENTS,
        placement=placement,
        restarts=2,
        pid=42,
        exit_code=None,
    )


def test_a_machine_record_is_the_json_pydantic_makes() -> None:
    for placement in (PLACEMENT, None):
        machine = a_machine(placement)
        assert json.loads(machine_json(machine)) == json.loads(machine.model_dump_json())
        assert Machine.model_validate_json(machine_json(machine)) == machine


def test_an_event_message_is_the_json_pydantic_makes() -> None:
    for machine in (a_machine(PLACEMENT), None):
        msg = MachineEventMessage(
            machine_id="m1",
            app="web",
            worker_id="w1",
            region="mad",
            state=S.STARTED,
            event=EVENTS[0],
            machine=machine,
        )
        assert json.loads(event_json(msg)) == json.loads(msg.model_dump_json())


def a_row(request_id: str = "r1", body_hash: str = "h") -> MachineRow:
    return MachineRow(
        id="m1",
        app="web",
        name="one",
        region="mad",
        request_id=request_id,
        body_hash=body_hash,
        state=S.STARTING,
        config=CONFIG,
        placement=PLACEMENT,
        created_at=1,
        updated_at=1,
        events=tuple(EVENTS),
    )


STEP = OpStep("op1", "m1", OpKind.CREATE, OpState.SPAWNING, Event.BEGIN, 1, {"a": "b"})


def test_a_claim_serialises_its_config_and_placement_once(tmp_path: Path) -> None:
    """The store records the claim's config and placement as JSON and remembers that text for
    the same objects: the reply and the launch event embed it, not encoded again."""
    store = Store(tmp_path)
    row = a_row()
    assert store.claim(row, [STEP]) is None
    stored = store._db.execute("SELECT config, placement FROM machines").fetchone()
    config, placement = store.json_of(CONFIG), store.json_of(PLACEMENT)
    assert stored == (config, placement)
    assert store.json_of(CONFIG) is config  # remembered, not made again
    reply = machine_json(row.to_machine("w1"), store.json_of)
    assert f'"config":{config},"placement":{placement}'.encode() in reply
    copy = MachineConfig.model_validate_json(config)
    assert store.json_of(copy) == config  # an equal object gets its own (equal) text
    for n in range(20):  # the memo is bounded, and right whatever it forgot
        store.json_of({"n": n})
    assert store.json_of(CONFIG) == config
    store.close()


def test_a_known_request_returns_its_machine_or_conflicts(tmp_path: Path) -> None:
    store = Store(tmp_path)
    assert store.claim(a_row(), [STEP]) is None
    assert store.claim(a_row(), [STEP]) == "m1"  # the same request: its machine
    with pytest.raises(IdempotencyConflict):
        store.claim(a_row(body_hash="other"), [STEP])
    count = store._db.execute("SELECT COUNT(*) FROM reservations").fetchone()
    assert count == (1,) and len(store.events("m1")) == 2 and len(store.op_log("m1")) == 1
    store.close()


def test_a_memory_store_writes_only_what_the_agent_reads_back() -> None:
    """A hollow worker's store is never reopened: no machine rows, no reservations; the events
    and op steps that the events and ops verbs read are written as ever."""
    store = memory_store()
    row = a_row()
    assert store.claim(row, [STEP]) is None
    started = MachineEvent(type="start", status=S.STARTED, source="user", timestamp=3)
    done = OpStep("op1", "m1", OpKind.CREATE, OpState.DONE, Event.SPAWNED, 3, STEP.detail)
    store.commit(replace(row, state=S.STARTED), [started], [done])
    tables = {
        name: store._db.execute(f"SELECT COUNT(*) FROM {name}").fetchone()[0]
        for name in ("machines", "reservations", "events", "ops")
    }
    assert tables == {"machines": 0, "reservations": 0, "events": 3, "ops": 2}
    assert [e.type for e in store.events("m1")] == ["start", "start", "launch"]
    assert [s.state for s in store.op_log("m1")] == [OpState.SPAWNING, OpState.DONE]
    store.close()


def test_every_field_of_a_machine_row_is_kept_by_its_columns(tmp_path: Path) -> None:
    """The table is made from the record (souq.agent.state.machine_columns): a row whose every
    field differs from its default reads back equal, through the claim's insert and through
    the updates of its run and of its spec."""
    store = Store(tmp_path)
    row = replace(
        a_row(),
        pid=4242,
        pid_start_time=12.5,
        restarts=3,
        exit_code=137,
        address=MachineAddress(host="127.0.0.1", ports={8080: 20001}),
        instance_id="i1",
        gpu_ids=(0, 3),
        cordoned=True,
        skip_secrets=True,
    )
    assert store.claim(row, [STEP]) is None
    [read] = store.load_machines()
    assert read == row
    changed = replace(
        row,
        state=S.STOPPED,
        pid=None,
        exit_code=0,
        restarts=4,
        updated_at=9,
        instance_id="i2",
        cordoned=False,
        config=CONFIG.model_copy(update={"metadata": {"k": "v"}}),
    )
    store.commit(changed, [], spec=True)
    [read] = store.load_machines()
    assert read == replace(changed, events=row.events)  # the new events: none
    store.commit(replace(changed, instance_id="i3", restarts=5), [])  # not the spec: kept
    [read] = store.load_machines()
    assert (read.instance_id, read.restarts) == ("i2", 5)
    store.close()
