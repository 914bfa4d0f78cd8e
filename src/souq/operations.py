"""Every operation on one machine, declared once: its HTTP route and method, the scope a token
needs for it, the bus verb its broker sends to the machine's worker with the verb's request and
reply types, the body it takes, whether a lease's nonce goes with it, and its CLI verb.

From this table the rest is made or checked, so that adding an operation touches its
declaration, the agent's handler and their tests:

* the **verb** (:mod:`souq.protocol.verbs`): made from the declaration when the registry does
  not define it, checked against it when it does;
* the **route** (:mod:`souq.broker.op_routes`): made, for an operation whose route is ``made``;
  an ``own`` route is written by hand (Fly's extras: a start's ``previous_state``, a wait's
  query) and a test checks that it is there, and that the broker has no machine route the
  table lacks;
* the **auth table** (:func:`souq.auth.routes.need_of`): the scope of every route under
  ``/v1/apps/{app}/machines/{id}`` is the declaration's;
* the **client** (:meth:`souq.client.api.SouqClient.operate`) and the **CLI**
  (``souq machine <cli>``, :mod:`souq.client.op_cli`) of a made operation;
* the **agent's dispatch**: a test checks that the worker answers every declared verb.

Pure and light: names, not types (the CLI reads this table without loading the models).
A verb's type is named by its module under :mod:`souq.model` and its name
(``"protocol.MachineRef"``; ``list[...]`` and ``dict[str, str]`` as written); a body's, by its
module under :mod:`souq` (``"broker.schemas.SignalRequest"``). :func:`resolve` imports them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["MACHINE", "OPERATIONS", "Operation", "body_type", "operation", "resolve"]

MACHINE = "/v1/apps/{app}/machines/{machine_id}"  # the path every operation here is under

Method = Literal["GET", "POST", "PUT", "DELETE"]
Scope = Literal["read", "write", "deploy", "admin"]


@dataclass(frozen=True)
class Operation:
    """One operation on one machine."""

    name: str  # the client's name for it: ``client.operate(name, app, machine_id)``
    method: Method
    path: str  # under MACHINE: "" (the machine itself), "/suspend", "/metadata/{key}"
    scope: Scope  # what a token needs (souq.auth.tokens.Scope), of the machine's app
    verb: str  # the bus verb the machine's worker answers
    request: str  # the verb's request type
    reply: str  # the verb's reply type (and the route's answer, unless ``answer``)
    doc: str
    since: int = 0  # the protocol's minor version that brought the verb in
    body: str | None = None  # the route's JSON body type; its fields go into the request
    fixed: Mapping[str, object] = field(default_factory=dict)  # request fields the route sets
    leased: bool = False  # takes the lease's nonce (`souq-lease-nonce`), as `lease_nonce`
    route: Literal["made", "own"] = "made"
    status_code: int = 200
    cli: str | None = None  # ``souq machine <cli> ID --app APP`` (made operations)
    render: str | None = None  # the CLI's renderer under souq.client ("render.ops"), else JSON
    answer: str | None = None  # the route's answer where it is not the verb's reply

    @property
    def route_path(self) -> str:
        return MACHINE + self.path

    @property
    def summary(self) -> str:
        """Its doc as a sentence (the route's description, the CLI verb's help)."""
        return self.doc[:1].upper() + self.doc[1:] + "."


def _op(  # noqa: PLR0917 (a row of the table: its columns in order)
    name: str,
    method: Method,
    path: str,
    scope: Scope,
    verb: str,
    request: str,
    reply: str,
    doc: str,
    **more: object,
) -> Operation:
    return Operation(name, method, path, scope, verb, request, reply, doc, **more)  # type: ignore[arg-type]


_REF = "protocol.MachineRef"
_MACHINE = "machine.Machine"

OPERATIONS: tuple[Operation, ...] = (
    # -- reads -----------------------------------------------------------------------------
    _op("get", "GET", "", "read", "get", _REF, _MACHINE, "one machine's record", route="own"),
    _op("logs", "GET", "/logs", "read", "logs", "protocol.LogsCommand", "protocol.LogsReply",
        "the machine's output (a stream with ?follow)", route="own"),
    _op("events", "GET", "/events", "read", "events", "protocol.EventsCommand",
        "list[machine.MachineEvent]", "every event of the machine, newest first",
        cli="events", render="render.events"),
    _op("ops", "GET", "/ops", "read", "ops", _REF, "list[machine.OpRecord]",
        "the machine's op log: each step of each operation, oldest first", cli="ops",
        render="render.ops"),
    _op("ps", "GET", "/ps", "read", "ps", _REF, "list[machine_tools.ProcessStat]",
        "the processes of a started (or suspended) machine: its own, then its descendants",
        since=4, cli="ps", render="render_tools.processes"),
    _op("memory", "GET", "/memory", "read", "memory", _REF, "machine_tools.MachineMemory",
        "the machine's memory: its limit, and what its processes hold resident now", since=6,
        cli="memory"),
    _op("metadata", "GET", "/metadata", "read", "get", _REF, _MACHINE,
        "the machine's `config.metadata`, as a map", route="own", answer="dict[str, str]"),
    _op("wait", "GET", "/wait", "read", "wait", "protocol.WaitCommand", _MACHINE,
        "the machine once it reaches a state", route="own"),
    _op("lease", "GET", "/lease", "read", "lease_get", _REF, "protocol.Lease",
        "the machine's live lease", since=3, route="own"),
    # -- life cycle ------------------------------------------------------------------------
    _op("start", "POST", "/start", "write", "start", "protocol.StartCommand", _MACHINE,
        "start a stopped machine, or resume a suspended one", leased=True, route="own"),
    _op("suspend", "POST", "/suspend", "write", "suspend", _REF, _MACHINE,
        "freeze a started machine: it keeps its memory and its port, and a start (or a "
        "request through the proxy) resumes it", since=2, leased=True, cli="suspend",
        render="render.machine_state"),
    _op("stop", "POST", "/stop", "write", "stop", "protocol.StopCommand", _MACHINE,
        "send the stop signal", leased=True, route="own"),
    _op("restart", "POST", "/restart", "write", "restart", "protocol.StopCommand", _MACHINE,
        "stop, then start again; answered once started", leased=True, route="own"),
    _op("destroy", "DELETE", "", "write", "destroy", "protocol.DestroyCommand", _MACHINE,
        "destroy the machine and release its reservation", leased=True, route="own"),
    # -- changes in place ------------------------------------------------------------------
    _op("update", "POST", "", "write", "update", "protocol.UpdateCommand", _MACHINE,
        "replace the machine's config on its worker", since=3, leased=True, route="own"),
    _op("signal", "POST", "/signal", "write", "signal", "protocol.SignalCommand", _MACHINE,
        "send a signal to the machine's process", body="broker.schemas.SignalRequest",
        leased=True),
    _op("take_lease", "POST", "/lease", "write", "lease", "protocol.LeaseRequest",
        "protocol.Lease", "take or extend the machine's lease", since=3, leased=True,
        route="own"),
    _op("end_lease", "DELETE", "/lease", "write", "lease_release", _REF, "protocol.Lease",
        "end the machine's lease (its nonce)", since=3, leased=True, route="own"),
    _op("cordon", "POST", "/cordon", "write", "machine_cordon",
        "machine_tools.MachineCordonCommand", _MACHINE,
        "take the machine out of the edge proxies' rotation: it keeps running and gets no "
        "new requests until `uncordon`", since=4, fixed={"cordoned": True}, leased=True,
        cli="cordon", render="render_tools.cordon"),
    _op("uncordon", "POST", "/uncordon", "write", "machine_cordon",
        "machine_tools.MachineCordonCommand", _MACHINE,
        "put a cordoned machine back in the edge proxies' rotation", since=4,
        fixed={"cordoned": False}, leased=True, cli="uncordon", render="render_tools.cordon"),
    _op("set_metadata", "POST", "/metadata/{key}", "write", "metadata",
        "machine_tools.MetadataCommand", "dict[str, str]",
        "set one key of the machine's metadata (no restart)", since=4, route="own",
        status_code=204),
    _op("delete_metadata", "DELETE", "/metadata/{key}", "write", "metadata",
        "machine_tools.MetadataCommand", "dict[str, str]",
        "delete one key of the machine's metadata", since=4, route="own", status_code=204),
    # An exec runs in the machine's environment, secrets included: as much as reading them.
    _op("exec", "POST", "/exec", "deploy", "exec", "machine_tools.ExecCommand",
        "machine_tools.ExecReply", "run a command in a started machine's context", since=4,
        route="own"),
)  # fmt: skip

_BY_NAME = {op.name: op for op in OPERATIONS}
assert len(_BY_NAME) == len(OPERATIONS), "an operation declared twice"


def operation(name: str) -> Operation:
    """The operation called ``name``; KeyError for none."""
    return _BY_NAME[name]


def resolve(name: str, *, under: str = "souq.model") -> Any:
    """The type ``name`` stands for, its module (under ``under``) imported."""
    if name == "dict[str, str]":
        return dict[str, str]
    if name.startswith("list[") and name.endswith("]"):
        return list[resolve(name[5:-1], under=under)]  # type: ignore[misc]
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(f"{under}.{module}"), attr)


def body_type(op: Operation) -> Any:
    """The type of ``op``'s JSON body (None: it takes none)."""
    return None if op.body is None else resolve(op.body, under="souq")
