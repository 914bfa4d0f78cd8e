"""The declarations of the operations on one machine (souq.operations) are what the auth
table, the verb registry and the CLI are made from or checked against."""

from __future__ import annotations

import re

import pytest
import typer

from souq.auth.routes import Need, need_of
from souq.auth.tokens import Scope
from souq.client import cli
from souq.operations import OPERATIONS, Operation, operation, resolve
from souq.protocol.verbs import PROTOCOL_MINOR, VERBS


def concrete(op: Operation) -> str:
    path = op.route_path.replace("{app}", "web").replace("{machine_id}", "m1")
    return re.sub(r"\{[^}]+\}", "x1", path)


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_each_route_needs_the_scope_its_operation_declares(op: Operation) -> None:
    assert need_of(op.method, concrete(op)) == Need(Scope(op.scope), "web")


def test_an_exec_needs_as_much_as_the_secrets_it_sees() -> None:
    assert operation("exec").scope == "deploy"
    assert need_of("POST", "/v1/apps/web/machines/m1/exec") == Need(Scope.DEPLOY, "web")


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_each_verb_carries_the_declared_types(op: Operation) -> None:
    verb = VERBS[op.verb]
    assert verb.request is resolve(op.request)
    assert verb.reply == resolve(op.reply)
    assert verb.since == op.since <= PROTOCOL_MINOR


def test_every_declared_cli_verb_is_a_command_of_souq_machine() -> None:
    group = typer.main.get_group(cli.app)
    machine = group.commands["machine"]
    assert isinstance(machine, typer.core.TyperGroup)
    declared = {op.cli for op in OPERATIONS if op.cli is not None}
    assert declared <= set(machine.commands), declared - set(machine.commands)
