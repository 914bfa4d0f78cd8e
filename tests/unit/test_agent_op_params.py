"""An operation's parameters: typed, those its kind takes, kept in the op log as they were."""

from __future__ import annotations

import json

import pytest

from souq.agent.state.events import Event
from souq.agent.state.operations import TABLES, Action, OpKind, OpState
from souq.agent.state.records import OP_PARAMS, Op, OpParams, OpStep, checked_params
from souq.model.choices import EventType

St = OpState
pytestmark = pytest.mark.anyio

# What each action reads of its operation's parameters.
READS = {
    Action.SEND_SIGNAL: "signal",
    Action.ARM_KILL_TIMER: "timeout_s",
    Action.ARM_DRAIN_TIMER: "drain_s",
}


@pytest.mark.parametrize("kind", list(OpKind))
def test_every_kind_takes_what_its_actions_read(kind: OpKind) -> None:
    actions = {a for step in TABLES[kind].values() for a in step.actions}
    assert {READS[a] for a in actions if a in READS} <= OP_PARAMS[kind]
    assert "source" in OP_PARAMS[kind]
    spawns = {Action.SPAWN, Action.ADOPT_OR_SPAWN} & actions
    assert ("type" in OP_PARAMS[kind]) is bool(spawns)  # what its spawn is published as


def test_a_kind_refuses_what_it_does_not_take() -> None:
    stop: OpParams = {"source": "user", "signal": "SIGINT", "timeout_s": 5.0, "drain_s": 0.0}
    assert checked_params(OpKind.STOP, stop) is stop
    with pytest.raises(ValueError, match="a signal operation takes no drain_s, timeout_s"):
        checked_params(OpKind.SIGNAL, stop)
    with pytest.raises(ValueError, match=r"a start operation takes no signal$"):
        checked_params(OpKind.START, {"source": "agent", "signal": "SIGINT"})


async def test_the_op_log_keeps_them_as_the_agent_always_wrote_them() -> None:
    made: OpParams = {"source": "agent", "type": EventType.RESTART}
    assert json.dumps(made) == '{"source": "agent", "type": "restart"}'
    stored = json.loads(json.dumps(made))  # as the store reads them back
    last = OpStep("op-1", "m1", OpKind.START, OpState.SPAWNING, Event.BEGIN, 1, stored)
    op = Op.resumed(last)
    assert (op.id, op.kind, op.machine_id, op.state) == ("op-1", OpKind.START, "m1", St.SPAWNING)
    assert op.params == {"source": "agent", "type": "restart"}
    assert (op.source, op.spawn_type) == ("agent", EventType.RESTART)


async def test_a_create_spawns_as_a_start_unless_told() -> None:
    last = OpStep("op-2", "m2", OpKind.CREATE, OpState.SPAWNING, Event.BEGIN, 1, {})
    op = Op.resumed(last)
    assert (op.source, op.spawn_type) == ("user", EventType.START)
